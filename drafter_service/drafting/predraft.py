"""Pre-drafts: the next step's trees for the likeliest outcomes of this step's verification.

While the target model verifies a tree, the drafter has nothing to do; it can draft the
next step ahead for the outcomes verification will probably produce (Speculative
Speculative Decoding, the Saguaro speculation cache). An *outcome* of greedy
verification is ``(accepted node, bonus token)``: the deepest tree node whose path the
target accepted (or the root: nothing accepted) and the token the target emits after it.
The bonus token is never one of that node's drafted children (the target would have
accepted it), so its candidates are the drafter's continuations *beyond* the tree: the
first level of a draft after the node's path, minus the children already in the tree.

Ranking (all in the tree's own path scores, which estimate acceptance):

- ``stop(a) = score(a) * (1 - min(STOP_FLOOR_CAP, sum of a's children's scores / score(a)))``:
  verification reaches ``a`` (its path score) and accepts none of its children;
  ``score(root) = 1``. The cap keeps a node whose children look certain in the running.
- ``weight(a, b) = stop(a) * score_after(a)(b)``: the bonus ``b``'s score in the draft
  after ``a``'s path.

The ``fan_out`` outcomes of highest weight are pre-drafted, wherever they are in the
tree: more branches go where acceptance is likelier and none where it is not, which is
what Saguaro's capped geometric fan-out (Theorem 12) prescribes for a geometric
acceptance length, without assuming one. Bonus candidates are only sought below the
``fan_out`` nodes of highest ``stop`` (no other node can hold a chosen outcome unless its
candidates outscore theirs, which the per-node cap of ``fan_out`` candidates bounds).

Pure but for the two batched ``Drafter.draft_after`` calls per step; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from drafter_service.drafting.drafter import DraftBatch, Drafter, DraftTree

__all__ = [
    "STOP_FLOOR_CAP",
    "Outcome",
    "Predraft",
    "node_depth",
    "observed_outcome",
    "plan_outcomes",
    "predraft_batch",
]

STOP_FLOOR_CAP = 0.95
"""Largest share of a node's score its children may claim in ``stop`` (see module doc)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """A verification outcome: ``node`` accepted (-1: the root, nothing accepted), then
    ``bonus`` emitted by the target. ``weight`` ranks outcomes (not a probability)."""

    node: int
    bonus: int
    weight: float


@dataclass(frozen=True, slots=True)
class Predraft:
    """The tree to draft from if ``outcome`` happens."""

    outcome: Outcome
    tree: DraftTree


def path_tokens(tree: DraftTree, node: int) -> list[int]:
    """Tokens from the root to ``node`` (empty for the root, -1)."""
    path: list[int] = []
    while node >= 0:
        path.append(int(tree.tokens[node]))
        node = int(tree.parents[node])
    path.reverse()
    return path


def observed_outcome(tree: DraftTree, target_tokens: Sequence[int]) -> tuple[int, int] | None:
    """What greedy verification of ``tree`` did, given the target's tokens from the root on:
    ``(accepted node or -1, bonus token)``; None when the tokens end inside the tree's
    accepted path (the generation stopped before a bonus token)."""
    node = -1
    for token in target_tokens:
        nxt = next(
            (i for i in range(len(tree.tokens))
             if tree.parents[i] == node and tree.tokens[i] == token),
            None,
        )  # fmt: skip
        if nxt is None:
            return node, int(token)
        node = nxt
    return None


def stop_scores(tree: DraftTree) -> npt.NDArray[np.float64]:
    """``stop(a)`` for the root (index 0) and every node (index i + 1)."""
    n = len(tree.tokens)
    score = np.empty(n + 1, dtype=np.float64)
    score[0] = 1.0
    score[1:] = tree.scores
    children = np.zeros(n + 1, dtype=np.float64)
    np.add.at(children, tree.parents.astype(np.int64) + 1, tree.scores)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(score > 0, children / score, 1.0)
    return score * (1.0 - np.minimum(STOP_FLOOR_CAP, share))


def plan_outcomes(
    tree: DraftTree, candidates: Sequence[tuple[int, DraftTree]], fan_out: int
) -> list[Outcome]:
    """The ``fan_out`` likeliest outcomes of ``tree``, best first. ``candidates`` pairs a
    node (-1: root) with the draft after that node's path (``draft_after``): its
    first-level nodes not already children of the node in ``tree`` are the node's
    bonus candidates. Ties go to the shallower node, then the smaller token."""
    stop = stop_scores(tree)
    outcomes: list[Outcome] = []
    for node, after in candidates:
        drafted = {int(t) for t, p in zip(tree.tokens, tree.parents, strict=True) if p == node}
        first = after.parents == -1
        for token, score in zip(after.tokens[first], after.scores[first], strict=True):
            if int(token) in drafted:
                continue
            outcomes.append(Outcome(node, int(token), float(stop[node + 1]) * float(score)))
    outcomes.sort(key=lambda o: (-o.weight, node_depth(tree, o.node), o.bonus))
    return outcomes[:fan_out]


def candidate_nodes(tree: DraftTree, fan_out: int) -> list[int]:
    """The ``fan_out`` nodes (-1: root) most likely to be where verification stops."""
    stop = stop_scores(tree)
    order = np.argsort(-stop, kind="stable")[:fan_out]  # stable: the root, then BFS order
    return [int(i) - 1 for i in order if stop[i] > 0]


def predraft_batch(
    drafter: Drafter,
    request_ids: Sequence[str],
    trees: Sequence[DraftTree],
    fan_out: int,
    budget: int | Sequence[int],
) -> list[list[Predraft]]:
    """For each request (already holding the context ``trees[i]`` was drafted from), the
    pre-drafts of its ``fan_out`` likeliest outcomes, best first. Two native calls for
    the whole batch: the bonus candidates below each likely stopping node (a draft of
    ``fan_out + children`` nodes after its path), then one draft per chosen outcome of
    ``budget`` nodes (one for all requests, or one each)."""
    budgets_of = [budget] * len(request_ids) if isinstance(budget, int) else list(budget)
    if fan_out <= 0 or not request_ids:
        return [[] for _ in request_ids]
    rows: list[tuple[int, int]] = []  # (request index, node)
    extensions: list[list[int]] = []
    budgets: list[int] = []
    for i, tree in enumerate(trees):
        for node in candidate_nodes(tree, fan_out):
            rows.append((i, node))
            extensions.append(path_tokens(tree, node))
            n_children = int(np.count_nonzero(tree.parents == node))
            budgets.append(min(fan_out + n_children, drafter.config.max_budget))
    after = _draft_rows(drafter, [request_ids[i] for i, _ in rows], extensions, budgets)
    per_request: list[list[tuple[int, DraftTree]]] = [[] for _ in trees]
    for k, (i, node) in enumerate(rows):
        per_request[i].append((node, after.tree(k)))

    chosen: list[list[Outcome]] = [
        plan_outcomes(tree, cands, fan_out)
        for tree, cands in zip(trees, per_request, strict=True)
    ]
    ids: list[str] = []
    extensions = []
    budgets = []
    for i, outcomes in enumerate(chosen):
        for o in outcomes:
            ids.append(request_ids[i])
            extensions.append([*path_tokens(trees[i], o.node), o.bonus])
            budgets.append(budgets_of[i])
    drafts = _draft_rows(drafter, ids, extensions, budgets)
    out: list[list[Predraft]] = []
    k = 0
    for outcomes in chosen:
        out.append([Predraft(o, drafts.tree(k + j)) for j, o in enumerate(outcomes)])
        k += len(outcomes)
    return out


def _draft_rows(
    drafter: Drafter,
    ids: Sequence[str],
    extensions: Sequence[Sequence[int]],
    budgets: Sequence[int],
) -> DraftBatch:
    offsets = np.zeros(len(extensions) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in extensions], out=offsets[1:])
    flat = np.fromiter((t for e in extensions for t in e), dtype=np.int32, count=int(offsets[-1]))
    return drafter.draft_after(ids, flat, offsets, np.asarray(budgets, dtype=np.int32))


def node_depth(tree: DraftTree, node: int) -> int:
    """Tokens on the path from the root to ``node`` (0 for the root, -1)."""
    depth = 0
    while node >= 0:
        depth += 1
        node = int(tree.parents[node])
    return depth
