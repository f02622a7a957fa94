"""Pre-drafting on the service side: what a request's latest tree and pre-drafts are, how
a client's ``prefetched`` row is resolved, and the DraftResponse that carries pre-drafts.

No gRPC calls and no native work here: the engine runs ``drafting.predraft`` in the
request's datastore job and the servicer sends what :func:`prefetch_response` builds.

A request's *tree* is the one its client drafts from at its latest step: the tree the
service answered, or, for a ``prefetched`` row, the pre-draft of the outcome the new
tokens make. Pre-drafts are kept for that tree only; the next step either uses one of
them (a hit, resolved here to the same tree the client took from its cache) or does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from drafter_service.drafting.drafter import DraftTree
from drafter_service.drafting.predraft import Predraft, node_depth, observed_outcome
from sssd.drafter.v1 import drafter_pb2 as pb

__all__ = ["RequestTrees", "prefetch_response", "resolve_prefetched"]

_NODE_BYTES = 12  # int32 token + int32 parent + float32 score, as sent
_OUTCOME_BYTES = 12  # int32 node + int32 bonus + uint32 node count


@dataclass(slots=True)
class RequestTrees:
    """What a request drafts from now, and the pre-drafts sent for it (by outcome)."""

    tree: DraftTree | None = None  # None: unknown (a miss the service cannot follow)
    predrafts: dict[tuple[int, int], DraftTree] = field(default_factory=dict)


def resolve_prefetched(
    trees: RequestTrees | None, new_tokens: npt.NDArray[np.int32]
) -> DraftTree | None:
    """The pre-draft a ``prefetched`` row drafts from: the one for the outcome its new
    tokens make on the request's tree (the accepted path, then one bonus token: exactly,
    or it is no outcome of that tree). None when the service holds no such pre-draft
    (it was never sent, or was dropped): the client still uses its own copy, the service
    only cannot pre-draft after it."""
    if trees is None or trees.tree is None or not trees.predrafts or len(new_tokens) == 0:
        return None
    outcome = observed_outcome(trees.tree, new_tokens.tolist())
    if outcome is None or node_depth(trees.tree, outcome[0]) + 1 != len(new_tokens):
        return None
    return trees.predrafts.get(outcome)


def prefetch_response(
    step: int, request_ids: Sequence[str], predrafts: Sequence[Sequence[Predraft]], max_bytes: int
) -> tuple[pb.DraftResponse | None, list[list[Predraft]]]:
    """The DraftResponse carrying the step's pre-drafts (proto ``PrefetchedDrafts``; None
    when there are none) and, per request, the pre-drafts it holds (keep exactly those:
    the client can only hit what was sent). Outcomes are taken best first, request by
    request in rank order (every request's best, then every second best, ...), while
    they fit in ``max_bytes``: under a tight budget each request keeps its likeliest."""
    kept: list[list[Predraft]] = [[] for _ in request_ids]
    used = 0
    depth = max((len(p) for p in predrafts), default=0)
    for rank in range(depth):
        for i, pre in enumerate(predrafts):
            if rank < len(pre):
                cost = _OUTCOME_BYTES + len(pre[rank].tree.tokens) * _NODE_BYTES
                if used + cost > max_bytes:
                    continue
                used += cost
                kept[i].append(pre[rank])
    ids = [r for r, k in zip(request_ids, kept, strict=True) if k]
    if not ids:
        return None, kept
    groups = [k for k in kept if k]
    flat = [p for k in groups for p in k]
    trees = [p.tree for p in flat]
    packed = pb.PrefetchedDrafts(
        request_ids=ids,
        outcome_counts=_le(np.array([len(k) for k in groups]), "<u4"),
        accepted_nodes=_le(np.array([p.outcome.node for p in flat]), "<i4"),
        bonus_tokens=_le(np.array([p.outcome.bonus for p in flat]), "<i4"),
        node_counts=_le(np.array([len(t.tokens) for t in trees]), "<u4"),
        tokens=_le(_concat([t.tokens for t in trees]), "<i4"),
        parents=_le(_concat([t.parents for t in trees]), "<i4"),
        scores=_le(_concat([t.scores for t in trees]), "<f4"),
    )
    return pb.DraftResponse(step=step, prefetch=packed), kept


def _le(values: npt.NDArray[np.generic], dtype: str) -> bytes:
    return np.asarray(values).astype(dtype, copy=False).tobytes()


def _concat(parts: list[npt.NDArray[np.generic]]) -> npt.NDArray[np.generic]:
    return np.concatenate(parts) if parts else np.zeros(0)

