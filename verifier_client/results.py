"""What a step returns (trees and why there are none) and the client's counters."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from types import MappingProxyType

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


# Compared by value (memoryviews compare their entries; not hashable), shown by value below.
@dataclass(slots=True, repr=False)
class Tree:
    """One request's draft: nodes in breadth-first order, ``parents[i] < i`` (-1: a child of
    the root, the last committed token, not counted). ``scores`` estimate acceptance; never
    use them to verify. The columns are read-only memoryview slices of the answer (int32,
    int32, float32; no copy until read): ``tolist()``, ``numpy.asarray``, ``torch.frombuffer``.
    """

    tokens: memoryview  # draft token ids, breadth-first
    parents: memoryview  # parent index of each node; -1 = child of the root
    scores: memoryview  # path score of each node (not a model probability)

    @classmethod
    def of(cls, tokens: Sequence[int], parents: Sequence[int], scores: Sequence[float]) -> Tree:
        """A tree from plain sequences (tests, adapters)."""
        if not len(tokens) == len(parents) == len(scores):
            raise ValueError(
                f"tokens, parents and scores differ in length: {len(tokens)}, "
                f"{len(parents)}, {len(scores)}"
            )
        return cls(
            memoryview(array("i", tokens)).toreadonly(),
            memoryview(array("i", parents)).toreadonly(),
            memoryview(array("f", scores)).toreadonly(),
        )

    def __len__(self) -> int:
        return len(self.tokens)

    def best_chain(self, max_len: int, min_score: float = 0.0) -> list[int]:
        """The chain for engines that verify chains: from the root, the highest-score child
        at each level, at most ``max_len`` tokens, ending before the first scored below
        ``min_score`` (a learned score estimates the whole path's acceptance). Ties go to
        the lower index; a sibling repeating an earlier one's token is skipped. Scores only
        choose what to draft; verifying the chain stays lossless."""
        if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 0:
            raise ValueError(f"max_len must be a non-negative int, got {max_len!r}")
        if not 0.0 <= min_score <= 1.0:
            raise ValueError(f"min_score must be in [0, 1], got {min_score!r}")
        tokens, parents, scores = self.tokens.tolist(), self.parents.tolist(), self.scores.tolist()
        chain: list[int] = []
        current, start = -1, 0  # children come after their parent (breadth-first order)
        while len(chain) < max_len:
            best, seen = -1, set()
            for node in range(start, len(tokens)):
                if parents[node] != current or tokens[node] in seen:
                    continue
                seen.add(tokens[node])
                if best < 0 or scores[node] > scores[best]:
                    best = node
            if best < 0 or scores[best] < min_score:
                break
            chain.append(tokens[best])
            current, start = best, best + 1
        return chain

    def __repr__(self) -> str:
        return f"Tree(tokens={self.tokens.tolist()}, parents={self.parents.tolist()})"


_NO_DRAFTS: Mapping[str, Tree] = MappingProxyType({})
_NO_OUTCOMES: Mapping[str, Outcome] = MappingProxyType({})


@dataclass(frozen=True, slots=True, eq=False)  # Mapping equality, not field equality
class StepResult(Mapping[str, Tree | None]):
    """The drafts of one decode step, keyed by the request ids it was called with: a Tree or
    None. ``outcome`` is the step's as a whole; :meth:`why` gives one request's reason."""

    step: int
    outcome: Outcome
    request_ids: tuple[str, ...]
    drafts: Mapping[str, Tree]  # requests with a tree (OK answers)
    request_outcomes: Mapping[str, Outcome]  # requests that are not OK in an OK step
    wait_s: float | None = None  # step() entry to trees in hand, as the client measured it

    @classmethod
    def without_drafts(
        cls, step: int, outcome: Outcome, request_ids: tuple[str, ...], wait_s: float | None = None
    ) -> StepResult:
        """A step in which no request gets a draft."""
        return cls(step, outcome, request_ids, _NO_DRAFTS, _NO_OUTCOMES, wait_s)

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
    # steps the budget rule gave no nodes (past the GPU's ridge point): nothing was sent and
    # nothing waited for; their tokens go with the next step that drafts, or with finish
    unsent_steps: int = 0
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

    def add(self, other: ClientStats) -> None:
        """Adds ``other``'s counters into these."""
        for f in fields(self):
            if f.name == "fallbacks":
                for outcome, n in other.fallbacks.items():
                    self.fallbacks[outcome] += n
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def fallback_steps(self) -> int:
        """Steps that returned no drafts, for any reason."""
        return sum(self.fallbacks.values())
