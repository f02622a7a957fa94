"""Protocol messages to validated values: the one place input is checked.

Every check runs before any state is touched, so a refused call changes nothing; each
error names the request id (or index) and the bad value.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from drafter_service.service.call_errors import FailedPrecondition, InvalidArgument, NotFound
from sssd.drafter.v1 import drafter_pb2 as pb

MAX_REQUEST_ID_CHARS = 1024
_NO_TOKENS = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True, slots=True)
class CallLimits:
    """What a call is checked against: the service's tokenizer, datastores and limits."""

    vocab_size: int
    fingerprint: str  # sha256 hex of the service's tokenizer.json; "" = unknown
    max_requests_per_call: int
    max_tokens_per_request: int
    max_budget: int
    datastores: frozenset[str]
    live_datastores: frozenset[str]
    default_datastore: str


@dataclass(frozen=True, slots=True)
class DraftCall:
    """A validated Draft call, one list entry per request (lists, not an object per
    request: this is the per-step hot path)."""

    request_ids: list[str]
    known_lengths: list[int]
    tokens: npt.NDArray[np.int32]  # every request's new tokens, concatenated
    offsets: list[int]  # request i's new tokens are tokens[offsets[i] : offsets[i + 1]]
    budgets: list[int]
    datastores: list[str]  # resolved (never empty); used only when a request starts
    prompt_lengths: list[int]  # resolved: the whole context when the call said 0

    def new_tokens(self, i: int) -> npt.NDArray[np.int32]:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


@dataclass(frozen=True, slots=True)
class Finished:
    """One request of a Finish call, validated."""

    request_id: str
    store: bool  # FINISHED and not do_not_store
    final_tokens: npt.NDArray[np.int32]


def parse_draft_request(request: pb.DraftRequest, limits: CallLimits) -> DraftCall:
    deltas = request.requests
    _check_count(len(deltas), "requests", limits)
    _check_fingerprint(request.tokenizer_fingerprint, limits)
    ids: list[str] = []
    knowns: list[int] = []
    budgets: list[int] = []
    names: list[str] = []
    prompts: list[int] = []
    offsets = [0]
    tokens = _TokenCollector()
    seen: set[str] = set()
    for i, delta in enumerate(deltas):
        request_id = _check_request_id(delta.request_id, i, seen)
        new_tokens = delta.new_tokens
        n = len(new_tokens)
        known, budget, prompt = delta.known_length, delta.budget, delta.prompt_length
        _check_delta(request_id, known, n, budget, prompt, limits)
        names.append(_resolve_datastore(delta.datastore, limits, f"request {request_id!r}: "))
        tokens.add(new_tokens, n)
        ids.append(request_id)
        knowns.append(known)
        budgets.append(budget)
        prompts.append(prompt or n)
        offsets.append(offsets[-1] + n)
    flat = tokens.array()
    _check_token_range(flat, offsets, limits.vocab_size, ids)
    return DraftCall(ids, knowns, flat, offsets, budgets, names, prompts)


_U32 = np.dtype("<u4")
_I32 = np.dtype("<i4")


def parse_packed_draft_request(request: pb.DraftRequest, limits: CallLimits) -> DraftCall:
    """The packed form (``DraftRequest.packed``): the same checks as
    :func:`parse_draft_request`, done on whole columns."""
    if len(request.requests):
        raise InvalidArgument(f"set either requests ({len(request.requests)}) or packed, not both")
    _check_fingerprint(request.tokenizer_fingerprint, limits)
    packed = request.packed
    ids = list(packed.request_ids)
    n = len(ids)
    _check_count(n, "requests", limits)
    seen: set[str] = set()
    for i, request_id in enumerate(ids):
        _check_request_id(request_id, i, seen)
    knowns = _column(packed.known_lengths, _U32, n, "known_lengths")
    counts = _column(packed.new_token_counts, _U32, n, "new_token_counts")
    budgets = _column(packed.budgets, _U32, n, "budgets")
    prompts = (
        _column(packed.prompt_lengths, _U32, n, "prompt_lengths")
        if packed.prompt_lengths
        else np.zeros(n, dtype=np.int64)
    )
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    _check_column_bytes(packed.new_tokens, _I32, int(offsets[-1]), "new_tokens", "new_token_counts")
    flat: npt.NDArray[np.int32] = np.frombuffer(packed.new_tokens, dtype=_I32).astype(
        np.int32, copy=False
    )
    bad = (
        (budgets > limits.max_budget)
        | (knowns + counts > limits.max_tokens_per_request)
        | ((knowns == 0) & (prompts > counts))
    )
    if bad.any():  # the first bad request, checked alone for its message
        i = int(np.argmax(bad))
        _check_delta(ids[i], int(knowns[i]), int(counts[i]), int(budgets[i]), int(prompts[i]),
                     limits)  # fmt: skip
        raise AssertionError(f"request {ids[i]!r} passed its own check")
    offset_list: list[int] = offsets.tolist()
    _check_token_range(flat, offset_list, limits.vocab_size, ids)
    names = _resolve_datastores(list(packed.datastores), n, limits, ids)
    prompt_list: list[int] = np.where(prompts == 0, counts, prompts).tolist()
    return DraftCall(ids, knowns.tolist(), flat, offset_list, budgets.tolist(), names, prompt_list)


def _check_delta(
    request_id: str, known: int, n: int, budget: int, prompt: int, limits: CallLimits
) -> None:
    """One request's lengths and budget (``n`` new tokens) against the limits."""
    if budget > limits.max_budget:
        raise InvalidArgument(
            f"request {request_id!r}: budget {budget} is over max_budget ({limits.max_budget})"
        )
    if known + n > limits.max_tokens_per_request:
        raise InvalidArgument(
            f"request {request_id!r}: known_length {known} + {n} new tokens is over "
            f"max_tokens_per_request ({limits.max_tokens_per_request})"
        )
    if known == 0 and prompt > n:
        raise InvalidArgument(
            f"request {request_id!r}: prompt_length {prompt} is over the {n} new tokens"
        )


def _column(data: bytes, dtype: np.dtype[Any], expected: int, name: str) -> npt.NDArray[np.int64]:
    """A little-endian column of one entry per request, widened to int64 (no overflow in
    sums)."""
    _check_column_bytes(data, dtype, expected, name)
    return np.frombuffer(data, dtype=dtype).astype(np.int64)


def _check_column_bytes(
    data: bytes, dtype: np.dtype[Any], expected: int, name: str, counted_by: str = ""
) -> None:
    if len(data) != expected * dtype.itemsize:
        what = f"the sum of {counted_by}" if counted_by else "the number of requests"
        raise InvalidArgument(
            f"packed.{name} has {len(data)} bytes: {expected} entries of {dtype.itemsize} bytes "
            f"expected ({what} is {expected})"
        )


def _resolve_datastores(names: list[str], n: int, limits: CallLimits, ids: list[str]) -> list[str]:
    if not names:
        return [limits.default_datastore] * n
    if len(names) != n:
        raise InvalidArgument(
            f"packed.datastores has {len(names)} names for {n} requests (give one per "
            f"request, or none for the default)"
        )
    resolved: dict[str, str] = {}
    for i, name in enumerate(names):
        if name not in resolved:
            resolved[name] = _resolve_datastore(name, limits, f"request {ids[i]!r}: ")
    return [resolved[name] for name in names]


def _check_fingerprint(fingerprint: str, limits: CallLimits) -> None:
    if fingerprint and limits.fingerprint and fingerprint != limits.fingerprint:
        raise FailedPrecondition(
            f"tokenizer_fingerprint {fingerprint!r} does not match the service's tokenizer "
            f"{limits.fingerprint!r}"
        )


def parse_finish_request(request: pb.FinishRequest, limits: CallLimits) -> list[Finished]:
    items = request.requests
    _check_count(len(items), "requests", limits)
    seen: set[str] = set()
    offsets = [0]
    tokens = _TokenCollector()
    for i, item in enumerate(items):
        request_id = _check_request_id(item.request_id, i, seen)
        if item.reason not in (pb.FINISH_REASON_FINISHED, pb.FINISH_REASON_ABORTED):
            raise InvalidArgument(
                f"request {request_id!r}: reason {item.reason} is neither FINISHED nor ABORTED"
            )
        n = len(item.final_tokens)
        if n > limits.max_tokens_per_request:
            raise InvalidArgument(
                f"request {request_id!r}: {n} final_tokens are over max_tokens_per_request "
                f"({limits.max_tokens_per_request})"
            )
        tokens.add(item.final_tokens, n)
        offsets.append(offsets[-1] + n)
    flat = tokens.array()
    _check_token_range(flat, offsets, limits.vocab_size, [it.request_id for it in items])
    return [
        Finished(
            request_id=item.request_id,
            store=item.reason == pb.FINISH_REASON_FINISHED and not item.do_not_store,
            final_tokens=flat[offsets[i] : offsets[i + 1]],
        )
        for i, item in enumerate(items)
    ]


def parse_ingest_request(
    request: pb.IngestRequest, limits: CallLimits
) -> tuple[str, list[npt.NDArray[np.int32]]]:
    """Returns the (live) datastore name and the sequences to store."""
    name = _resolve_datastore(request.datastore, limits, "")
    if name not in limits.live_datastores:
        raise FailedPrecondition(f"datastore {name!r} is read-only: it does not take ingests")
    sequences = request.sequences
    _check_count(len(sequences), "sequences", limits)
    offsets = [0]
    tokens = _TokenCollector()
    for i, sequence in enumerate(sequences):
        n = len(sequence.tokens)
        if not 1 <= n <= limits.max_tokens_per_request:
            raise InvalidArgument(
                f"sequences[{i}] has {n} tokens, outside [1, max_tokens_per_request "
                f"({limits.max_tokens_per_request})]"
            )
        tokens.add(sequence.tokens, n)
        offsets.append(offsets[-1] + n)
    flat = tokens.array()
    _check_token_range(flat, offsets, limits.vocab_size, None)
    return name, [flat[offsets[i] : offsets[i + 1]] for i in range(len(sequences))]


def _check_count(n: int, what: str, limits: CallLimits) -> None:
    if n > limits.max_requests_per_call:
        raise InvalidArgument(
            f"{n} {what} in one call are over max_requests_per_call "
            f"({limits.max_requests_per_call})"
        )


def _check_request_id(request_id: str, index: int, seen: set[str]) -> str:
    if not request_id:
        raise InvalidArgument(f"requests[{index}]: request_id is empty")
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidArgument(
            f"requests[{index}]: request_id of {len(request_id)} characters is over "
            f"{MAX_REQUEST_ID_CHARS}"
        )
    if request_id in seen:
        raise InvalidArgument(f"requests[{index}]: request_id {request_id!r} appears twice")
    seen.add(request_id)
    return request_id


def _resolve_datastore(name: str, limits: CallLimits, where: str) -> str:
    resolved = name or limits.default_datastore
    if resolved not in limits.datastores:
        raise NotFound(f"{where}unknown datastore {name!r} (have {sorted(limits.datastores)})")
    return resolved


class _TokenCollector:
    """Joins a call's token lists into one int32 array (one range check per call). Short
    lists go through one Python list; long ones convert directly (much faster per token)."""

    _LONG = 256

    def __init__(self) -> None:
        self._chunks: list[npt.NDArray[np.int32]] = []
        self._short: list[int] = []

    def add(self, values: Sequence[int], n: int) -> None:
        if n > self._LONG:
            self._flush()
            self._chunks.append(np.array(values, dtype=np.int32))
        elif n:
            self._short.extend(values)

    def array(self) -> npt.NDArray[np.int32]:
        self._flush()
        if len(self._chunks) == 1:
            return self._chunks[0]
        return np.concatenate(self._chunks) if self._chunks else _NO_TOKENS

    def _flush(self) -> None:
        if self._short:
            self._chunks.append(np.array(self._short, dtype=np.int32))
            self._short = []


def _check_token_range(
    tokens: npt.NDArray[np.int32],
    offsets: Sequence[int],
    vocab_size: int,
    request_ids: Sequence[str] | None,
) -> None:
    if not len(tokens) or (int(tokens.min()) >= 0 and int(tokens.max()) < vocab_size):
        return
    at = int(np.argmax((tokens < 0) | (tokens >= vocab_size)))
    i = bisect.bisect_right(offsets, at) - 1  # the list holding position `at`
    where = f"request {request_ids[i]!r}" if request_ids is not None else f"sequences[{i}]"
    raise InvalidArgument(
        f"{where}: token id {int(tokens[at])} at index {at - offsets[i]} is outside "
        f"[0, {vocab_size})"
    )
