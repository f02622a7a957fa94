"""Answers as protocol messages."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from drafter_service.edge.validation import MAX_REQUEST_ID_CHARS
from drafter_service.engine.calls import CallLimits, DraftAnswer
from sssd_drafter.v1 import drafter_pb2 as pb


def draft_response(
    request_ids: list[str], answer: DraftAnswer, step: int, packed: bool
) -> pb.DraftResponse:
    """The answer in the form the call came in (``packed`` columns, else one RequestDraft
    per request), both from the same columns; ``request_ids`` are the call's."""
    columns = _draft_columns(answer)
    if packed:
        return pb.DraftResponse(step=step, packed=columns.packed())
    response = pb.DraftResponse(step=step)
    add = response.drafts.add
    # One tolist() per column, then list slices, and one add() with every field: the
    # cheapest way through the protobuf API (per-row numpy calls and extend() cost more).
    # A RESYNC's length is 0 and its tree empty: proto3 leaves both off the wire.
    tokens = columns.tokens.tolist()
    parents = columns.parents.tolist()
    scores = columns.scores.tolist()
    lo = 0
    for request_id, status, length, hi in zip(
        request_ids,
        columns.statuses.tolist(),
        columns.lengths.tolist(),
        np.cumsum(columns.node_counts, dtype=np.int64).tolist(),
        strict=True,
    ):
        add(
            request_id=request_id,
            status=status,
            length=length,
            tokens=tokens[lo:hi],
            parents=parents[lo:hi],
            scores=scores[lo:hi],
        )
        lo = hi
    return response


@dataclass(frozen=True, slots=True)
class _DraftColumns:
    """A DraftAnswer as the columns of PackedDrafts, in request order."""

    statuses: npt.NDArray[np.uint8]  # a DraftStatus per request
    lengths: npt.NDArray[np.uint32]  # tokens held per request (0 with RESYNC)
    node_counts: npt.NDArray[np.uint32]  # nodes per tree (0 with RESYNC)
    tokens: npt.NDArray[np.int32]  # every tree's nodes, concatenated
    parents: npt.NDArray[np.int32]
    scores: npt.NDArray[np.float32]

    def packed(self) -> pb.PackedDrafts:
        """As little-endian bytes."""
        return pb.PackedDrafts(
            statuses=self.statuses.tobytes(),
            lengths=self.lengths.astype("<u4", copy=False).tobytes(),
            node_counts=self.node_counts.astype("<u4", copy=False).tobytes(),
            tokens=self.tokens.astype("<i4", copy=False).tobytes(),
            parents=self.parents.astype("<i4", copy=False).tobytes(),
            scores=self.scores.astype("<f4", copy=False).tobytes(),
        )


_OK: int = pb.DRAFT_STATUS_OK
_RESYNC: int = pb.DRAFT_STATUS_RESYNC


def _draft_columns(answer: DraftAnswer) -> _DraftColumns:
    """The batches' arrays as they are when one batch holds every request (the usual case:
    one datastore; its rows are in call order, as the engine adds them); otherwise
    gathered per request."""
    n = len(answer.places)
    for batch in answer.batches.values():
        if len(batch) == n:
            return _DraftColumns(
                np.full(n, _OK, dtype=np.uint8),
                np.array(answer.lengths, dtype=np.uint32),
                np.diff(batch.offsets).astype(np.uint32),
                batch.tokens,
                batch.parents,
                batch.scores,
            )
    # Python lists and one tolist() per batch: per-row NumPy scalar access costs more.
    counts: list[int] = []
    bounds = {name: batch.offsets.tolist() for name, batch in answer.batches.items()}
    pieces: list[list[Any]] = []  # [batch, lo, hi]: runs of nodes to copy, in order
    for place in answer.places:
        if place is None:
            counts.append(0)
            continue
        name, row = place
        batch = answer.batches[name]
        lo, hi = bounds[name][row], bounds[name][row + 1]
        counts.append(hi - lo)
        if hi == lo:
            continue
        if pieces and pieces[-1][0] is batch and pieces[-1][2] == lo:
            pieces[-1][2] = hi  # the next row of the same batch: one longer run
        else:
            pieces.append([batch, lo, hi])
    return _DraftColumns(
        np.array([_RESYNC if p is None else _OK for p in answer.places], dtype=np.uint8),
        np.array(answer.lengths, dtype=np.uint32),  # 0 with RESYNC
        np.array(counts, dtype=np.uint32),
        _gather([b.tokens[lo:hi] for b, lo, hi in pieces], np.int32),
        _gather([b.parents[lo:hi] for b, lo, hi in pieces], np.int32),
        _gather([b.scores[lo:hi] for b, lo, hi in pieces], np.float32),
    )


def _gather(parts: list[npt.NDArray[Any]], dtype: type[np.generic]) -> npt.NDArray[Any]:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def service_info_response(
    version: str, limits: CallLimits, max_message_bytes: int
) -> pb.GetServiceInfoResponse:
    catalog = limits.catalog
    datastores = [
        pb.DatastoreInfo(
            name=name,
            is_default=name == limits.default_datastore,
            live=slot.live is not None,
            **asdict(slot.stats()),  # num_tokens, sub_indices, resident_bytes
        )
        for name, slot in catalog.slots.items()
    ]
    return pb.GetServiceInfoResponse(
        version=version,
        tokenizer=pb.TokenizerInfo(
            name=catalog.tokenizer.name,
            fingerprint=catalog.tokenizer.fingerprint,
            vocab_size=catalog.tokenizer.vocab_size,
        ),
        datastores=datastores,
        limits=pb.Limits(
            max_requests_per_call=limits.max_requests_per_call,
            max_tokens_per_request=limits.max_tokens_per_request,
            max_budget=limits.max_budget,
            max_message_bytes=max_message_bytes,
            max_request_id_chars=MAX_REQUEST_ID_CHARS,
        ),
    )
