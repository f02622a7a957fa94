"""Per-request delta state: the client's view of what the drafter holds.

Each live request keeps its whole committed context (prompt + accepted output), since a
RESYNC, a lost answer or a restarted drafter means resending all of it. ``known_length``
is how much of it the drafter holds by its last OK answer (``answer.length``, which must
lie in ``1..tokens sent``, else it counts as a RESYNC); a step sends ``tokens[known_length:]``,
or the whole context with ``known_length = 0`` for a new request, a RESYNC, or a step whose
answer never came: a send sets it to 0 until its answer is applied (the drafter may or may
not have applied a lost one: only a whole resend is right both ways). A request missing
from a step stays alive; its commits accumulate.

A request holding what the drafter would refuse (a token past its vocabulary, a context
past its limit, an id too long, an unknown datastore) is never sent again: the drafter
rejects a whole call for one bad request. A warning names it and why, once. The limits come
from its service info (requests added earlier are checked again then). Ids no vocabulary
has (negative, >= 2^31) are the caller's bug: ValueError.

Pure (builds and reads the packed messages, see PackedDeltas in the .proto); not
thread-safe: one decode loop owns it.
"""

from __future__ import annotations

import logging
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Literal, NoReturn, TypedDict

from sssd_drafter.v1 import drafter_pb2 as pb
from verifier_client.results import ClientStats, Tree

__all__ = ["DeltaTracker", "ProtocolError", "RequestState", "as_commit", "as_token_list",
           "checked_commits", "read_column"]  # fmt: skip

log = logging.getLogger(__name__)

_INT32_MAX = 2**31 - 1
_STATUS_OK = pb.DRAFT_STATUS_OK
_LITTLE = sys.byteorder == "little"  # the protocol's arrays are little-endian


def _le(typecode: str, values: list[int]) -> bytes:
    """``values`` as little-endian 32-bit entries (``array`` writes the host's order)."""
    out = array(typecode, values)
    if not _LITTLE:
        out.byteswap()
    return out.tobytes()


def read_column(data: bytes, typecode: Literal["i", "I", "f"]) -> memoryview[Any]:
    """A little-endian column as a read-only view (a copy only on big-endian hosts).
    Raises TypeError when the bytes are not a whole number of entries."""
    if _LITTLE:
        return memoryview(data).cast(typecode)
    values = array(typecode)
    values.frombytes(data)  # ValueError when not a whole number of entries
    values.byteswap()
    return memoryview(values).toreadonly()


class ProtocolError(Exception):
    """The drafter's answer does not match the request it answers."""


def as_token_list(tokens: Iterable[int], what: str = "tokens") -> list[int]:
    """Token ids as a list of Python ints; numpy arrays and tensors convert in C (``tolist``)."""
    tolist = getattr(tokens, "tolist", None)
    out: list[int] = tolist() if callable(tolist) else list(tokens)
    if out and (min(out) < 0 or max(out) > _INT32_MAX):
        bad = next(t for t in out if not 0 <= t <= _INT32_MAX)
        raise ValueError(f"{what}: token id {bad!r} is outside [0, 2^31)")
    return out


def as_commit(tokens: Iterable[int], request_id: str) -> list[int]:
    """``as_token_list`` for a commit; a list of valid ids is taken as is (the hot path)."""
    if type(tokens) is list and (not tokens or (min(tokens) >= 0 and max(tokens) <= _INT32_MAX)):
        return tokens
    return as_token_list(tokens, f"commit of {request_id!r}")


def checked_commits(
    live: Mapping[str, object],
    commits: Mapping[str, Iterable[int]],
    budgets: Mapping[str, int] | None,
) -> dict[str, list[int]]:
    """A step's commits as lists, checked with its budgets before anything is recorded:
    ValueError naming the first budget that is not an int >= 0 (a bool is not one),
    KeyError naming (some of) the requests ``live`` lacks, ValueError naming a bad token."""
    for rid, budget in (budgets or {}).items():
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise ValueError(f"budget of {rid!r} must be an int >= 0, got {budget!r}")
    if not live.keys() >= commits.keys():
        missing = [rid for rid in commits if rid not in live]
        raise KeyError(f"unknown request_id(s) {missing[:5]!r}: add them first")
    return {rid: as_commit(tokens, rid) for rid, tokens in commits.items()}


def finish_tail(
    state: RequestState, tail: Iterable[int], output: Iterable[int] | None
) -> list[int]:
    """The tokens a Finish adds to what step() recorded: ``tail``, or ``output`` past what
    step() recorded. ValueError, changing nothing, when both are given or ``output`` does
    not start with it: no token is ever stored twice."""
    rid = state.request_id
    tail_list = as_token_list(tail, f"tail of {rid!r}")
    if output is None:
        return tail_list
    if tail_list:
        raise ValueError(f"finish({rid!r}): give tail= (the tokens since the last step) or "
                         "output= (the whole output), not both")  # fmt: skip
    whole = as_token_list(output, f"output of {rid!r}")
    held = state.tokens[state.prompt_length :]
    if whole[: len(held)] != held:
        at = next((i for i, (a, b) in enumerate(zip(whole, held, strict=False)) if a != b),
                  min(len(whole), len(held)))  # fmt: skip
        raise ValueError(
            f"finish({rid!r}, output=...): the output ({len(whole)} tokens) does not start with "
            f"the {len(held)} tokens committed through step() (first difference at {at}); "
            "output= takes the whole generated output, tail= only the tokens since the last step"
        )
    return whole[len(held) :]


class RequestOptions(TypedDict, total=False):
    """``add_request``'s keywords: ``RequestState.new``'s, which holds their defaults."""

    datastore: str
    prompt_length: int | None
    store: bool


@dataclass(slots=True)
class RequestState:
    """One live request as the client sees it."""

    request_id: str
    datastore: str  # datastore to draft from ("" = the drafter's default)
    prompt_length: int  # leading tokens that are the prompt (sent with whole contexts)
    tokens: list[int]  # committed context the drafter should hold: prompt + accepted output
    # drafter holds tokens[:known_length]; 0 = send whole, also while an answer is out
    known_length: int = 0  # <= len(tokens)
    pending_length: int = 0  # len(tokens) when last sent
    sent: bool = False  # was in a sent DraftRequest: the drafter may hold state for it
    refused: bool = False  # holds what the drafter would refuse: never sent again
    store: bool = True  # False: opted out of storage, so its tokens are never shared either

    @classmethod
    def new(
        cls,
        request_id: str,
        prompt_ids: Iterable[int],
        datastore: str = "",
        prompt_length: int | None = None,
        store: bool = True,
    ) -> RequestState:
        """A request whose context so far is ``prompt_ids``, of which the first
        ``prompt_length`` (default: all) are the prompt; ``store=False``: it opted out of
        storage (sent with every whole context: the drafter shares none of it)."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        tokens = as_token_list(prompt_ids, f"prompt of {request_id!r}")
        length = len(tokens) if prompt_length is None else prompt_length
        if not 0 <= length <= len(tokens):
            raise ValueError(
                f"prompt_length {prompt_length} of {request_id!r} is outside [0, {len(tokens)}]"
            )
        return cls(request_id, datastore, length, tokens, store=store)


@dataclass(slots=True, eq=False)
class DeltaTracker:
    """Live requests by id: builds each step's deltas and applies the answers."""

    # Counts full_resends, tokens_sent and refused (requests never sent again) here.
    stats: ClientStats = field(default_factory=ClientStats)
    states: dict[str, RequestState] = field(default_factory=dict)  # live (changed by the methods)
    max_token_id: int = _INT32_MAX  # the drafter's vocab_size - 1, once known
    max_context_tokens: int | None = None  # the drafter's max_tokens_per_request
    max_request_id_chars: int | None = None  # the drafter's limit, once known
    datastores: frozenset[str] | None = None  # names it accepts ("" too), once known

    def get(self, request_id: str) -> RequestState:
        """The state of a live request; KeyError names unknown ids."""
        try:
            return self.states[request_id]
        except KeyError:
            raise KeyError(f"unknown request_id {request_id!r}: add it first") from None

    def add(self, state: RequestState) -> None:
        """Starts tracking a request (see RequestState.new); ValueError if its id is live."""
        if state.request_id in self.states:
            raise ValueError(f"request_id {state.request_id!r} is already live")
        self._check_limits(state)
        self.states[state.request_id] = state

    def adopt_limits(self, info: pb.GetServiceInfoResponse) -> None:
        """Takes the limits of the drafter's service info (0 or none = not reported:
        unchanged or unchecked) and refuses the live requests that break them."""
        limits, datastores = info.limits, info.datastores
        if info.tokenizer.vocab_size:
            self.max_token_id = info.tokenizer.vocab_size - 1
        self.max_context_tokens = limits.max_tokens_per_request or None
        self.max_request_id_chars = limits.max_request_id_chars or None
        self.datastores = frozenset({"", *(d.name for d in datastores)}) if datastores else None
        for state in self.states.values():
            if not state.refused:
                self._check_limits(state)

    def _check_limits(self, state: RequestState) -> None:
        """Refuses a request whose tokens, id or datastore the drafter would reject
        (the context's length is checked when it is sent: it grows)."""
        max_chars = self.max_request_id_chars
        tokens = state.tokens
        if tokens and max(tokens) > self.max_token_id:
            self._refuse(state, f"a token id is past the drafter's vocabulary ({max(tokens)})")
        elif max_chars is not None and len(state.request_id) > max_chars:
            self._refuse(state, f"its id has {len(state.request_id)} characters, over the "
                                f"drafter's {max_chars}")  # fmt: skip
        elif self.datastores is not None and state.datastore not in self.datastores:
            known = sorted(d for d in self.datastores if d)
            self._refuse(state, f"the drafter has no datastore {state.datastore!r} "
                                f"(it has {known})")  # fmt: skip

    def commit_many(self, commits: Mapping[str, list[int]]) -> None:
        """Appends the tokens the verifier accepted (the bonus token included) to each
        request; ``commits`` as checked_commits returns them."""
        for rid, tokens in commits.items():
            state = self.states[rid]
            state.tokens.extend(tokens)
            if tokens and max(tokens) > self.max_token_id:
                self._refuse(state, "a committed token id is past the drafter's vocabulary")

    def _refuse(self, state: RequestState, reason: str) -> None:
        if not state.refused:
            state.refused = True
            self.stats.refused += 1
            log.warning("request %.80r gets no drafts: %s", state.request_id, reason)

    def finish(self, request_id: str) -> RequestState:
        """Stops tracking a request and returns its last state."""
        self.get(request_id)
        return self.states.pop(request_id)

    def build(
        self,
        request_ids: Iterable[str],
        budget_of: Mapping[str, int] | None,
        default_budget: int,
    ) -> tuple[pb.PackedDeltas, list[RequestState], list[str]]:
        """The deltas of ``request_ids`` (``budget_of`` overrides ``default_budget``); the
        deltas, the states sent (known to hold nothing until the answer is applied) and the
        ids refused. Requests with an empty context are left out too (nothing to match yet)."""
        flat: list[int] = []
        sent: list[RequestState] = []
        refused: list[str] = []
        max_context = self.max_context_tokens or _INT32_MAX
        for rid in request_ids:
            state = self.states[rid]
            tokens = state.tokens
            if state.refused or len(tokens) > max_context:
                self._refuse(state, f"its context of {len(tokens)} tokens is over the "
                                    f"drafter's {max_context}")  # fmt: skip
                refused.append(rid)
                continue
            if not tokens:
                continue
            known = state.known_length
            flat.extend(tokens[known:] if known else tokens)
            if not known and state.sent:
                self.stats.full_resends += 1
            state.pending_length = len(tokens)
            state.sent = True
            sent.append(state)
        self.stats.tokens_sent += len(flat)
        # The columns, one entry per request sent; a whole context carries its prompt length.
        budgets = budget_of or {}
        datastores = [s.datastore for s in sent]  # sent only when some request names one
        private = bytes(0 if s.store else 1 for s in sent)  # do_not_store, sent when some has it
        packed = pb.PackedDeltas(
            request_ids=[s.request_id for s in sent],
            known_lengths=_le("I", [s.known_length for s in sent]),
            new_token_counts=_le("I", [s.pending_length - s.known_length for s in sent]),
            new_tokens=_le("i", flat),
            budgets=_le("I", [budgets.get(s.request_id, default_budget) for s in sent]),
            prompt_lengths=_le("I", [0 if s.known_length else s.prompt_length for s in sent]),
            datastores=datastores if any(datastores) else (),
            do_not_store=private if any(private) else b"",
        )
        for state in sent:  # until apply(): a lost answer means a whole resend
            state.known_length = 0
        return packed, sent, refused

    @staticmethod
    def apply(
        response: pb.DraftResponse, sent: Sequence[RequestState]
    ) -> tuple[dict[str, Tree], list[str]]:
        """Applies an answer to the requests it answers; returns (trees, resynced ids).
        ProtocolError (every request left for a whole resend) when it does not list the
        sent requests in order."""
        packed = response.packed
        n = len(sent)
        try:
            statuses = packed.statuses
            lengths: list[int] = read_column(packed.lengths, "I").tolist()
            counts: list[int] = read_column(packed.node_counts, "I").tolist()
            tokens = read_column(packed.tokens, "i")
            parents = read_column(packed.parents, "i")
            scores = read_column(packed.scores, "f")
        except (TypeError, ValueError):  # a byte length that is not a whole number of entries
            DeltaTracker._mismatch(response, sent)
        bounds = [0, *accumulate(counts)]
        if not (len(statuses) == len(lengths) == len(counts) == n) or not (
            len(tokens) == len(parents) == len(scores) == bounds[-1]
        ):
            DeltaTracker._mismatch(response, sent)
        answered: dict[str, Tree] = {}
        resynced: list[str] = []
        for i, state in enumerate(sent):
            rid = state.request_id
            length = lengths[i]
            if statuses[i] == _STATUS_OK and 0 < length <= state.pending_length:
                state.known_length = length
                lo, hi = bounds[i], bounds[i + 1]
                answered[rid] = Tree(tokens[lo:hi], parents[lo:hi], scores[lo:hi])
            else:  # RESYNC, an unknown status, or a length the client never sent
                resynced.append(rid)
        return answered, resynced

    @staticmethod
    def _mismatch(response: pb.DraftResponse, sent: Sequence[RequestState]) -> NoReturn:
        packed = response.packed
        raise ProtocolError(
            f"answer to step {response.step} does not match the {len(sent)} requests sent: "
            f"{len(packed.statuses)} statuses, {len(packed.lengths)} + "
            f"{len(packed.node_counts)} bytes of lengths and node counts, "
            f"{len(packed.tokens)}/{len(packed.parents)}/{len(packed.scores)} bytes of "
            f"tokens/parents/scores"
        )
