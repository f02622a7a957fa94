"""Protocol messages to validated values: the one place input is checked, before any
state is touched (a refused call changes nothing); each error names the request id (or
index) and the bad value. A Draft call's two wire forms become the same columns first."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from drafter_service.engine.call_errors import FailedPrecondition, InvalidArgument, NotFound
from drafter_service.engine.calls import CallLimits, DraftCall, Finished
from sssd_drafter.v1 import drafter_pb2 as pb

MAX_REQUEST_ID_CHARS = 1024
_NO_TOKENS = np.zeros(0, dtype=np.int32)


def parse_draft_request(request: pb.DraftRequest, limits: CallLimits) -> DraftCall:
    """A Draft call in either wire form, validated once. The per-request form becomes the
    packed form's columns, not the reverse: packed is the fast path, checked column-wise
    without a Python object per request."""
    packed = request.HasField("packed")
    if packed and len(request.requests):
        raise InvalidArgument(f"set either requests ({len(request.requests)}) or packed, not both")
    n = len(request.packed.request_ids) if packed else len(request.requests)
    fingerprint = request.tokenizer_fingerprint
    expected = limits.catalog.tokenizer.fingerprint
    if fingerprint and expected and fingerprint != expected:
        raise FailedPrecondition(
            f"tokenizer_fingerprint {fingerprint!r} does not match the service's tokenizer "
            f"{expected!r}"
        )
    _check_count(n, "requests", limits)  # before any per-request work
    columns = _packed_columns(request.packed, n) if packed else _message_columns(request.requests)
    return _validated_call(columns, limits)


@dataclass(slots=True)  # not frozen: built once per call, and a frozen __init__ costs more
class _DeltaColumns:
    """A Draft call's requests as columns (uint64: ``known_length`` is in a RequestDelta)."""

    request_ids: list[str]
    known_lengths: npt.NDArray[np.uint64]
    new_token_counts: npt.NDArray[np.uint64]
    new_tokens: npt.NDArray[np.int32]  # every request's, concatenated
    offsets: list[int]  # request i's new tokens are new_tokens[offsets[i] : offsets[i + 1]]
    budgets: npt.NDArray[np.uint64]
    prompt_lengths: npt.NDArray[np.uint64]  # 0 = the whole context
    datastores: list[str]  # one name per request, or none (the default for every one)
    private: list[bool]  # do_not_store per request, or none (every one shares)


def _message_columns(deltas: Sequence[pb.RequestDelta]) -> _DeltaColumns:
    """The per-request form as columns: one pass reading each field once, then arrays."""
    ids: list[str] = []
    knowns: list[int] = []
    budgets: list[int] = []
    prompts: list[int] = []
    names: list[str] = []
    private: list[bool] = []
    tokens = _TokenLists()
    for delta in deltas:
        new_tokens = delta.new_tokens
        tokens.add(new_tokens, len(new_tokens))
        ids.append(delta.request_id)
        knowns.append(delta.known_length)
        budgets.append(delta.budget)
        prompts.append(delta.prompt_length)
        names.append(delta.datastore)
        private.append(delta.do_not_store)
    ends = np.array(tokens.offsets, dtype=np.uint64)
    return _DeltaColumns(
        ids,
        np.array(knowns, dtype=np.uint64),
        ends[1:] - ends[:-1],
        tokens.array(),
        tokens.offsets,
        np.array(budgets, dtype=np.uint64),
        np.array(prompts, dtype=np.uint64),
        names,
        private if any(private) else [],
    )


_U8 = np.dtype("u1")
_U32 = np.dtype("<u4")
_I32 = np.dtype("<i4")


def _packed_columns(packed: pb.PackedDeltas, n: int) -> _DeltaColumns:
    """The packed form's little-endian bytes as columns, each length checked."""
    knowns = _column(packed.known_lengths, n, "known_lengths")
    counts = _column(packed.new_token_counts, n, "new_token_counts")
    budgets = _column(packed.budgets, n, "budgets")
    prompts = (
        _column(packed.prompt_lengths, n, "prompt_lengths")
        if packed.prompt_lengths
        else np.zeros(n, dtype=np.uint64)
    )
    private: list[bool] = []
    if packed.do_not_store:
        _check_column_bytes(packed.do_not_store, _U8, n, "do_not_store")
        flags = np.frombuffer(packed.do_not_store, dtype=_U8)
        if (flags > 1).any():
            i = int(np.argmax(flags > 1))
            raise InvalidArgument(f"packed.do_not_store[{i}] is {int(flags[i])}: 0 or 1 expected")
        private = (flags == 1).tolist()
    offsets = list(itertools.accumulate(counts.tolist(), initial=0))
    _check_column_bytes(packed.new_tokens, _I32, offsets[-1], "new_tokens", "new_token_counts")
    tokens = np.frombuffer(packed.new_tokens, dtype=_I32).astype(np.int32, copy=False)
    return _DeltaColumns(
        list(packed.request_ids), knowns, counts, tokens, offsets, budgets, prompts,
        list(packed.datastores), private,
    )  # fmt: skip


def _column(data: bytes, expected: int, name: str) -> npt.NDArray[np.uint64]:
    """A uint32 column of one entry per request, widened to uint64 (no overflow in sums)."""
    _check_column_bytes(data, _U32, expected, name)
    return np.frombuffer(data, dtype=_U32).astype(np.uint64)


def _check_column_bytes(
    data: bytes, dtype: np.dtype[Any], expected: int, name: str, counted_by: str = ""
) -> None:
    if len(data) != expected * dtype.itemsize:
        what = f"the sum of {counted_by}" if counted_by else "the number of requests"
        raise InvalidArgument(
            f"packed.{name} has {len(data)} bytes: {expected} entries of {dtype.itemsize} bytes "
            f"expected ({what} is {expected})"
        )


def _validated_call(c: _DeltaColumns, limits: CallLimits) -> DraftCall:
    """The checks of a Draft call, on whole columns; the first bad request is named."""
    ids, counts, prompts = c.request_ids, c.new_token_counts, c.prompt_lengths
    _check_request_ids(ids)
    _check_budgets(ids, c.budgets, limits)
    _check_lengths(ids, c.known_lengths, counts, prompts, limits)
    _check_token_range(c.new_tokens, c.offsets, limits.catalog.tokenizer.vocab_size, ids)
    names = _resolve_datastores(c.datastores, len(ids), limits, ids)
    prompt_list: list[int] = np.where(prompts == 0, counts, prompts).tolist()
    return DraftCall(
        ids, c.known_lengths.tolist(), c.new_tokens, c.offsets, c.budgets.tolist(), names,
        prompt_list, c.private,
    )  # fmt: skip


def _check_budgets(ids: list[str], budgets: npt.NDArray[np.uint64], limits: CallLimits) -> None:
    """The service's one budget check (uint32 on the wire: only the upper bound can fail).
    Nothing in Python checks it again; the native ``check_budgets`` (draft_config.cc) is
    the library API's error and, for the service, an invariant that cannot fire (there it
    would come after the request table was updated, as INTERNAL)."""
    over = budgets > limits.max_budget
    if over.any():
        i = int(np.argmax(over))
        raise InvalidArgument(
            f"request {ids[i]!r}: budget {int(budgets[i])} is over max_budget ({limits.max_budget})"
        )


def _check_lengths(
    ids: list[str],
    knowns: npt.NDArray[np.uint64],
    counts: npt.NDArray[np.uint64],
    prompts: npt.NDArray[np.uint64],
    limits: CallLimits,
) -> None:
    """Each request's known_length + new tokens, and its prompt_length, against the limits."""
    limit = limits.max_tokens_per_request
    # known_length is capped at limit + 1 first, so the sum cannot wrap around in uint64
    # (and a known_length alone over the limit still fails).
    too_long = np.minimum(knowns, limit + 1) + counts > limit
    bad_prompt = (knowns == 0) & (prompts > counts)
    bad = too_long | bad_prompt
    if not bad.any():
        return
    i = int(np.argmax(bad))
    known, n = int(knowns[i]), int(counts[i])
    if too_long[i]:
        raise InvalidArgument(
            f"request {ids[i]!r}: known_length {known} + {n} new tokens is over "
            f"max_tokens_per_request ({limit})"
        )
    raise InvalidArgument(
        f"request {ids[i]!r}: prompt_length {int(prompts[i])} is over the {n} new tokens"
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


def parse_finish_request(request: pb.FinishRequest, limits: CallLimits) -> list[Finished]:
    items = request.requests
    _check_count(len(items), "requests", limits)
    ids = [item.request_id for item in items]
    _check_request_ids(ids)
    final_tokens = _TokenLists()
    for request_id, item in zip(ids, items, strict=True):
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
        final_tokens.add(item.final_tokens, n)
    lists = final_tokens.checked_lists(limits.catalog.tokenizer.vocab_size, ids)
    return [
        Finished(
            request_id=item.request_id,
            store=item.reason == pb.FINISH_REASON_FINISHED and not item.do_not_store,
            final_tokens=tokens,
        )
        for item, tokens in zip(items, lists, strict=True)
    ]


def parse_ingest_request(
    request: pb.IngestRequest, limits: CallLimits
) -> tuple[str, list[npt.NDArray[np.int32]]]:
    """Returns the (live) datastore name and the sequences to store."""
    name = _resolve_datastore(request.datastore, limits, "")
    if limits.catalog.slots[name].live is None:
        raise FailedPrecondition(f"datastore {name!r} is read-only: it does not take ingests")
    sequences = request.sequences
    _check_count(len(sequences), "sequences", limits)
    tokens = _TokenLists()
    for i, sequence in enumerate(sequences):
        n = len(sequence.tokens)
        if not 1 <= n <= limits.max_tokens_per_request:
            raise InvalidArgument(
                f"sequences[{i}] has {n} tokens, outside [1, max_tokens_per_request "
                f"({limits.max_tokens_per_request})]"
            )
        tokens.add(sequence.tokens, n)
    return name, tokens.checked_lists(limits.catalog.tokenizer.vocab_size, None)


def _check_count(n: int, what: str, limits: CallLimits) -> None:
    if n > limits.max_requests_per_call:
        raise InvalidArgument(
            f"{n} {what} in one call are over max_requests_per_call "
            f"({limits.max_requests_per_call})"
        )


def _check_request_ids(ids: list[str]) -> None:
    """Every id non-empty, not too long and unique (the all-good call without a Python loop)."""
    lengths = list(map(len, ids))
    if not ids or (
        len(set(ids)) == len(ids) and min(lengths) > 0 and max(lengths) <= MAX_REQUEST_ID_CHARS
    ):
        return
    seen: set[str] = set()
    for i, request_id in enumerate(ids):
        if not request_id:
            raise InvalidArgument(f"requests[{i}]: request_id is empty")
        if len(request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidArgument(
                f"requests[{i}]: request_id of {len(request_id)} characters is over "
                f"{MAX_REQUEST_ID_CHARS}"
            )
        if request_id in seen:
            raise InvalidArgument(f"requests[{i}]: request_id {request_id!r} appears twice")
        seen.add(request_id)


def _resolve_datastore(name: str, limits: CallLimits, where: str) -> str:
    resolved = name or limits.default_datastore
    if resolved not in limits.catalog.slots:
        raise NotFound(f"{where}unknown datastore {name!r} (have {sorted(limits.catalog.slots)})")
    return resolved


class _TokenLists:
    """A call's token lists as one int32 array (list ``i``: ``[offsets[i] : offsets[i + 1]]``).
    Short lists go through one Python list; long ones convert directly (faster per token)."""

    _LONG = 256

    def __init__(self) -> None:
        self.offsets: list[int] = [0]
        self._chunks: list[npt.NDArray[np.int32]] = []
        self._short: list[int] = []

    def add(self, values: Sequence[int], n: int) -> None:
        self.offsets.append(self.offsets[-1] + n)
        if n > self._LONG:
            self._flush()
            self._chunks.append(np.array(values, dtype=np.int32))
        elif n:
            self._short.extend(values)

    def array(self) -> npt.NDArray[np.int32]:
        """Every list, concatenated (not range-checked)."""
        self._flush()
        if len(self._chunks) == 1:
            return self._chunks[0]
        return np.concatenate(self._chunks) if self._chunks else _NO_TOKENS

    def checked_lists(
        self, vocab_size: int, request_ids: Sequence[str] | None
    ) -> list[npt.NDArray[np.int32]]:
        """The lists (views of one array) once every token id is in the vocabulary."""
        flat, offsets = self.array(), self.offsets
        _check_token_range(flat, offsets, vocab_size, request_ids)
        return [flat[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]

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
