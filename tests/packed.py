"""The packed Draft form (PackedDeltas / PackedDrafts) to and from per-request messages,
written independently of the client and server code so tests can cross-check both."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sssd_drafter.v1 import drafter_pb2 as pb


def unpack_deltas(request: pb.DraftRequest) -> list[pb.RequestDelta]:
    """A packed DraftRequest as one RequestDelta per request."""
    p = request.packed
    n = len(p.request_ids)
    knowns = np.frombuffer(p.known_lengths, "<u4")
    counts = np.frombuffer(p.new_token_counts, "<u4")
    tokens = np.frombuffer(p.new_tokens, "<i4")
    budgets = np.frombuffer(p.budgets, "<u4")
    prompts = np.frombuffer(p.prompt_lengths, "<u4") if p.prompt_lengths else np.zeros(n)
    names = list(p.datastores) or [""] * n
    assert len(knowns) == len(counts) == len(budgets) == len(prompts) == len(names) == n
    assert len(tokens) == int(counts.sum())
    out, at = [], 0
    for i in range(n):
        c = int(counts[i])
        out.append(
            pb.RequestDelta(
                request_id=p.request_ids[i],
                known_length=int(knowns[i]),
                new_tokens=tokens[at : at + c].tolist(),
                budget=int(budgets[i]),
                datastore=names[i],
                prompt_length=int(prompts[i]),
            )
        )
        at += c
    return out


def pack_deltas(deltas: Sequence[pb.RequestDelta], step: int = 0) -> pb.DraftRequest:
    """Per-request deltas as a packed DraftRequest (one datastore name per request)."""
    flat = [t for d in deltas for t in d.new_tokens]
    return pb.DraftRequest(
        step=step,
        packed=pb.PackedDeltas(
            request_ids=[d.request_id for d in deltas],
            # uint32 on the wire: larger values (fuzzing) become the largest, still invalid
            known_lengths=np.array(
                [min(d.known_length, 2**32 - 1) for d in deltas], "<u4"
            ).tobytes(),
            new_token_counts=np.array([len(d.new_tokens) for d in deltas], "<u4").tobytes(),
            new_tokens=np.array(flat, "<i4").tobytes(),
            budgets=np.array([d.budget for d in deltas], "<u4").tobytes(),
            prompt_lengths=np.array([d.prompt_length for d in deltas], "<u4").tobytes(),
            datastores=[d.datastore for d in deltas],
        ),
    )


def unpack_drafts(response: pb.DraftResponse) -> list[pb.RequestDraft]:
    """A packed DraftResponse as one RequestDraft per request (request_id left empty)."""
    p = response.packed
    statuses = np.frombuffer(p.statuses, np.uint8)
    lengths = np.frombuffer(p.lengths, "<u4")
    counts = np.frombuffer(p.node_counts, "<u4")
    tokens = np.frombuffer(p.tokens, "<i4")
    parents = np.frombuffer(p.parents, "<i4")
    scores = np.frombuffer(p.scores, "<f4")
    assert len(statuses) == len(lengths) == len(counts)
    assert len(tokens) == len(parents) == len(scores) == int(counts.sum())
    out, at = [], 0
    for i in range(len(statuses)):
        c = int(counts[i])
        out.append(
            pb.RequestDraft(
                status=int(statuses[i]),  # type: ignore[arg-type]
                length=int(lengths[i]),
                tokens=tokens[at : at + c].tolist(),
                parents=parents[at : at + c].tolist(),
                scores=scores[at : at + c].tolist(),
            )
        )
        at += c
    return out


def pack_drafts(drafts: Sequence[pb.RequestDraft], step: int = 0) -> pb.DraftResponse:
    """Per-request drafts as a packed DraftResponse."""
    return pb.DraftResponse(
        step=step,
        packed=pb.PackedDrafts(
            statuses=bytes(d.status for d in drafts),
            lengths=np.array([d.length for d in drafts], "<u4").tobytes(),
            node_counts=np.array([len(d.tokens) for d in drafts], "<u4").tobytes(),
            tokens=np.array([t for d in drafts for t in d.tokens], "<i4").tobytes(),
            parents=np.array([t for d in drafts for t in d.parents], "<i4").tobytes(),
            scores=np.array([t for d in drafts for t in d.scores], "<f4").tobytes(),
        ),
    )
