"""Answers as protocol messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from drafter_service.drafting.drafter import DraftBatch
from drafter_service.service.validation import MAX_REQUEST_ID_CHARS, CallLimits
from sssd.drafter.v1 import drafter_pb2 as pb


@dataclass(frozen=True, slots=True)
class DraftAnswer:
    """The answer to a DraftCall: per request, the tokens now held and where its tree
    is (a batch and its row), or None for RESYNC."""

    request_ids: list[str]
    lengths: list[int]
    trees: list[tuple[DraftBatch, int] | None]


def draft_response(answer: DraftAnswer, step: int) -> pb.DraftResponse:
    response = pb.DraftResponse(step=step)
    add = response.drafts.add
    # One tolist() per batch, then list slices, and one add() with every field: the
    # cheapest way through the protobuf API (per-row numpy calls and extend() cost more).
    as_lists: dict[int, tuple[list[int], list[int], list[float], list[int]]] = {}
    for request_id, length, where in zip(
        answer.request_ids, answer.lengths, answer.trees, strict=True
    ):
        if where is None:
            add(request_id=request_id, status=pb.DRAFT_STATUS_RESYNC)
            continue
        batch, row = where
        lists = as_lists.get(id(batch))
        if lists is None:
            lists = (
                batch.tokens.tolist(),
                batch.parents.tolist(),
                batch.scores.tolist(),
                batch.offsets.tolist(),
            )
            as_lists[id(batch)] = lists
        tokens, parents, scores, offsets = lists
        lo, hi = offsets[row], offsets[row + 1]
        add(
            request_id=request_id,
            status=pb.DRAFT_STATUS_OK,
            length=length,
            tokens=tokens[lo:hi],
            parents=parents[lo:hi],
            scores=scores[lo:hi],
        )
    return response


_OK = np.uint8(pb.DRAFT_STATUS_OK)
_RESYNC = np.uint8(pb.DRAFT_STATUS_RESYNC)


def packed_draft_response(answer: DraftAnswer, step: int) -> pb.DraftResponse:
    """The answer as columns (``DraftResponse.packed``): the batches' arrays are sent as
    they are when the trees lie in request order, which is the usual case (one
    datastore, rows planned in call order); otherwise gathered per request."""
    n = len(answer.request_ids)
    trees = answer.trees
    lengths = np.asarray(answer.lengths, dtype="<u4")
    first = trees[0] if n else None
    if first is not None and first[0] is not None and _in_order(trees, n):
        batch = first[0]
        statuses = np.full(n, _OK, dtype=np.uint8)
        counts = np.diff(batch.offsets).astype("<u4")
        tokens, parents, scores = batch.tokens, batch.parents, batch.scores
    else:
        statuses = np.full(n, _RESYNC, dtype=np.uint8)
        counts = np.zeros(n, dtype="<u4")
        pieces: list[tuple[DraftBatch, int, int]] = []
        for i, where in enumerate(trees):
            if where is None:
                lengths[i] = 0
                continue
            statuses[i] = _OK
            batch, row = where
            lo, hi = int(batch.offsets[row]), int(batch.offsets[row + 1])
            counts[i] = hi - lo
            if hi > lo:
                pieces.append((batch, lo, hi))
        tokens = _gather([b.tokens[lo:hi] for b, lo, hi in pieces], np.int32)
        parents = _gather([b.parents[lo:hi] for b, lo, hi in pieces], np.int32)
        scores = _gather([b.scores[lo:hi] for b, lo, hi in pieces], np.float32)
    return pb.DraftResponse(
        step=step,
        packed=pb.PackedDrafts(
            statuses=statuses.tobytes(),
            lengths=lengths.tobytes(),
            node_counts=counts.tobytes(),
            tokens=tokens.astype("<i4", copy=False).tobytes(),
            parents=parents.astype("<i4", copy=False).tobytes(),
            scores=scores.astype("<f4", copy=False).tobytes(),
        ),
    )


def _in_order(trees: Sequence[tuple[DraftBatch, int] | None], n: int) -> bool:
    """Every request has a tree, all in one batch of exactly n rows, row i for request i."""
    batch = trees[0][0] if trees[0] is not None else None
    if batch is None or len(batch) != n:
        return False
    for i, where in enumerate(trees):
        if where is None or where[0] is not batch or where[1] != i:
            return False
    return True


def _gather(parts: list[npt.NDArray[Any]], dtype: type[np.generic]) -> npt.NDArray[Any]:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


@dataclass(frozen=True, slots=True)
class DatastoreSummary:
    name: str
    is_default: bool
    live: bool
    num_tokens: int
    sub_indices: int
    resident_bytes: int


def service_info_response(
    version: str,
    tokenizer_name: str,
    limits: CallLimits,
    max_message_bytes: int,
    datastores: Sequence[DatastoreSummary],
) -> pb.GetServiceInfoResponse:
    return pb.GetServiceInfoResponse(
        version=version,
        tokenizer=pb.TokenizerInfo(
            name=tokenizer_name, fingerprint=limits.fingerprint, vocab_size=limits.vocab_size
        ),
        datastores=[
            pb.DatastoreInfo(
                name=d.name,
                is_default=d.is_default,
                num_tokens=d.num_tokens,
                sub_indices=d.sub_indices,
                resident_bytes=d.resident_bytes,
                live=d.live,
            )
            for d in datastores
        ],
        limits=pb.Limits(
            max_requests_per_call=limits.max_requests_per_call,
            max_tokens_per_request=limits.max_tokens_per_request,
            max_budget=limits.max_budget,
            max_message_bytes=max_message_bytes,
            max_request_id_chars=MAX_REQUEST_ID_CHARS,
        ),
    )
