"""The service's side of pre-drafting (drafter_service.service.prefetch): resolving a
client's prefetched row to the pre-draft it took, and the pre-draft response's layout."""

from __future__ import annotations

import numpy as np

from drafter_service.drafting.drafter import DraftTree
from drafter_service.drafting.predraft import Outcome, Predraft
from drafter_service.service.prefetch import RequestTrees, prefetch_response, resolve_prefetched


def tree(tokens: list[int], parents: list[int], scores: list[float] | None = None) -> DraftTree:
    scores = scores if scores is not None else [0.5] * len(tokens)
    return DraftTree(np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32),
                     np.array(scores, dtype=np.float32))


T = tree([5, 6, 7], [-1, -1, 0])  # root -> 5 -> 7, root -> 6
A, B = tree([1, 2], [-1, 0]), tree([3], [-1])


def toks(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def test_a_prefetched_row_resolves_to_the_predraft_of_its_outcome() -> None:
    trees = RequestTrees(T, {(0, 9): A, (-1, 4): B})
    assert resolve_prefetched(trees, toks(5, 9)) is A  # 5 accepted, bonus 9
    assert resolve_prefetched(trees, toks(4)) is B  # nothing accepted, bonus 4
    assert resolve_prefetched(trees, toks(5, 7, 1)) is None  # an outcome not pre-drafted
    assert resolve_prefetched(trees, toks(5, 9, 9)) is None  # more than path + bonus
    assert resolve_prefetched(trees, toks(5)) is None  # no bonus token
    assert resolve_prefetched(RequestTrees(None, {(0, 9): A}), toks(5, 9)) is None
    assert resolve_prefetched(None, toks(4)) is None
    assert trees.nbytes() == (3 + 2 + 1) * 12 + 2 * 12


def unpack(resp) -> dict[str, list[tuple[int, int, list[int], list[int]]]]:  # type: ignore[no-untyped-def]
    p = resp.prefetch
    counts = np.frombuffer(p.outcome_counts, "<u4")
    nodes = np.frombuffer(p.accepted_nodes, "<i4")
    bonus = np.frombuffer(p.bonus_tokens, "<i4")
    sizes = np.frombuffer(p.node_counts, "<u4")
    tokens, parents = np.frombuffer(p.tokens, "<i4"), np.frombuffer(p.parents, "<i4")
    assert len(np.frombuffer(p.scores, "<f4")) == len(tokens) == sizes.sum()
    out: dict[str, list[tuple[int, int, list[int], list[int]]]] = {}
    k = at = 0
    for rid, c in zip(p.request_ids, counts, strict=True):
        rows = []
        for _ in range(int(c)):
            n = int(sizes[k])
            rows.append((int(nodes[k]), int(bonus[k]), tokens[at:at + n].tolist(),
                         parents[at:at + n].tolist()))
            k, at = k + 1, at + n
        out[rid] = rows
    return out


def test_prefetch_response_layout_and_byte_budget() -> None:
    pre = [
        [Predraft(Outcome(0, 9, 0.3), A), Predraft(Outcome(-1, 4, 0.1), B)],
        [],
        [Predraft(Outcome(2, 8, 0.2), B)],
    ]
    resp, kept = prefetch_response(7, ["a", "b", "c"], pre, max_bytes=1 << 20)
    assert kept == [pre[0], [], pre[2]]
    assert resp is not None and resp.step == 7 and not resp.drafts and not resp.HasField("packed")
    assert unpack(resp) == {
        "a": [(0, 9, [1, 2], [-1, 0]), (-1, 4, [3], [-1])],
        "c": [(2, 8, [3], [-1])],
    }
    # 60 bytes: a's best (12 + 2 nodes * 12 = 36) and c's (24), not a's second (24 more).
    tight, kept = prefetch_response(7, ["a", "b", "c"], pre, max_bytes=60)
    assert kept == [pre[0][:1], [], pre[2]]
    assert tight is not None and unpack(tight) == {"a": [(0, 9, [1, 2], [-1, 0])],
                                                  "c": [(2, 8, [3], [-1])]}
    assert prefetch_response(7, ["a"], [[]], max_bytes=1 << 20) == (None, [[]])
    assert prefetch_response(7, ["a", "b", "c"], pre, max_bytes=10) == (None, [[], [], []])
