"""Answers as protocol messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from drafter_service.drafter import DraftBatch
from drafter_service.service.validation import CallLimits
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
        ),
    )
