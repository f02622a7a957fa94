"""What a step returns (trees and why there are none) and the client's counters."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from sssd.drafter.v1 import drafter_pb2 as pb

__all__ = ["ClientStats", "Outcome", "StepResult", "Tree"]


class Outcome(StrEnum):
    """Why a request did or did not get a draft in a step."""

    OK = "ok"  # the drafter answered (the tree may be empty)
    DEADLINE = "deadline"  # no answer within the step's deadline
    UNAVAILABLE = "unavailable"  # drafter unreachable or the stream broke
    BREAKER_OPEN = "breaker_open"  # not called: the circuit is open after repeated failures
    RESYNC = "resync"  # the drafter lacked this request's state; the whole context goes next
    ERROR = "error"  # any other failure (bad answer, rejected call); per request: refused
    # (a token id past the drafter's vocabulary or a context past its limit; see deltas.py)


class Tree:
    """One request's draft: nodes in breadth-first order.

    ``parents[i] < i``; -1 marks a child of the last committed token (the root,
    not counted). ``scores`` estimate acceptance and must not be used by
    verification. The sequences are views of the decoded answer (no copy: a
    step's trees cost nothing until read); convert with ``list(...)`` or
    ``numpy.asarray(...)`` as the engine needs.
    """

    __slots__ = ("_draft",)

    def __init__(self, draft: pb.RequestDraft) -> None:
        self._draft = draft

    @classmethod
    def of(cls, tokens: Sequence[int], parents: Sequence[int], scores: Sequence[float]) -> Tree:
        """A tree from plain sequences (tests, adapters)."""
        return cls(pb.RequestDraft(tokens=tokens, parents=parents, scores=scores))

    @property
    def tokens(self) -> Sequence[int]:
        """Draft token ids, breadth-first."""
        return self._draft.tokens

    @property
    def parents(self) -> Sequence[int]:
        """Parent index of each node; -1 = child of the root."""
        return self._draft.parents

    @property
    def scores(self) -> Sequence[float]:
        """Path score of each node (not a model probability)."""
        return self._draft.scores

    def __len__(self) -> int:
        return len(self._draft.tokens)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tree):
            return NotImplemented
        return (list(self.tokens), list(self.parents), list(self.scores)) == (
            list(other.tokens), list(other.parents), list(other.scores))  # fmt: skip

    __hash__ = None  # type: ignore[assignment]  # compared by value: not hashable

    def __repr__(self) -> str:
        return f"Tree(tokens={list(self.tokens)}, parents={list(self.parents)})"


_NO_DRAFTS: Mapping[str, Tree] = MappingProxyType({})
_NO_OUTCOMES: Mapping[str, Outcome] = MappingProxyType({})


@dataclass(frozen=True, slots=True, eq=False)  # Mapping equality, not field equality
class StepResult(Mapping[str, Tree | None]):
    """The drafts of one decode step: ``result[request_id]`` is a Tree or None.

    Keys are the request ids the step was called with. ``outcome`` is the
    step's as a whole; :meth:`why` gives one request's reason.
    """

    step: int
    outcome: Outcome
    request_ids: tuple[str, ...]
    drafts: Mapping[str, Tree]  # requests with a tree (OK answers)
    request_outcomes: Mapping[str, Outcome]  # requests that are not OK in an OK step

    @classmethod
    def without_drafts(
        cls, step: int, outcome: Outcome, request_ids: tuple[str, ...]
    ) -> StepResult:
        """A step in which no request gets a draft."""
        return cls(step, outcome, request_ids, _NO_DRAFTS, _NO_OUTCOMES)

    def __getitem__(self, request_id: str) -> Tree | None:
        tree = self.drafts.get(request_id)
        if tree is None and request_id not in self.request_ids:
            raise KeyError(request_id)
        return tree

    def __iter__(self) -> Iterator[str]:
        return iter(self.request_ids)

    def __len__(self) -> int:
        return len(self.request_ids)

    @property
    def ok(self) -> bool:
        """The drafter answered this step (some requests may still need a resync)."""
        return self.outcome is Outcome.OK

    @property
    def resynced(self) -> frozenset[str]:
        """Requests the drafter answered RESYNC for (resent whole)."""
        return frozenset(r for r, o in self.request_outcomes.items() if o is Outcome.RESYNC)

    def why(self, request_id: str) -> Outcome:
        """Why ``request_id`` has (OK) or lacks a draft in this step."""
        if self.outcome is not Outcome.OK:
            return self.outcome
        return self.request_outcomes.get(request_id, Outcome.OK)


def _zero_fallbacks() -> dict[Outcome, int]:
    return {o: 0 for o in Outcome if o not in (Outcome.OK, Outcome.RESYNC)}


@dataclass(slots=True)
class ClientStats:
    """Plain counters of one client (monotonic; read them, never reset them)."""

    steps: int = 0  # step() calls
    drafted_steps: int = 0  # steps the drafter answered
    fallbacks: dict[Outcome, int] = field(default_factory=_zero_fallbacks)  # steps without drafts
    resyncs: int = 0  # requests the drafter answered RESYNC for
    resync_retries: int = 0  # immediate resends of resynced requests within a step
    full_resends: int = 0  # requests sent whole after their first send (resync, failed step)
    tokens_sent: int = 0  # token ids sent in DraftRequests (whole contexts and deltas)
    late_responses: int = 0  # stream answers that came after their step gave up
    reconnects: int = 0  # streams reopened after the first
    probes: int = 0  # breaker probes sent
    background_sent: int = 0  # Finish/Ingest calls that succeeded
    background_failures: int = 0  # Finish/Ingest calls that failed (their work is lost)
    ingest_drops: int = 0  # finish/abort/ingest work dropped because the queue was full
    refused: int = 0  # requests never drafted: tokens or length the drafter would refuse
    reingested: int = 0  # finished generations the drafter had lost, ingested instead

    @property
    def fallback_steps(self) -> int:
        """Steps that returned no drafts, for any reason."""
        return sum(self.fallbacks.values())
