"""Tree packing and the best chain against the plain-Python reference."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tree_reference import RefRow, batches, random_tree, ref_best_chain, ref_rows

from verifier_client.results import Tree
from verifier_client.verification.tree_packing import PackedTrees, pack_trees


@dataclass
class Raw:
    """A tree as an engine adapter may hand one over: any sequences, not validated."""

    tokens: object
    parents: object
    scores: object


def assert_packed(packed: PackedTrees, rows: list[RefRow]) -> None:
    """Every field of ``packed`` equals the reference, node by node."""
    width = 1 + max((r.n - 1 for r in rows), default=0)
    assert packed.tokens.shape == (len(rows), width)
    assert packed.attention_mask.shape == (len(rows), width, width)
    for name in ("tokens", "parents", "depth", "positions", "num_nodes"):
        assert getattr(packed, name).dtype == torch.int64, name
    for b, row in enumerate(rows):
        pad = width - row.n
        assert packed.tokens[b].tolist() == row.tokens + [0] * pad
        assert packed.parents[b].tolist() == row.parents + [-1] * pad
        depth = [row.depth(c) for c in range(row.n)]
        assert packed.depth[b].tolist() == depth + [0] * pad
        assert packed.positions[b].tolist() == [row.cache_len + d for d in depth + [0] * pad]
        assert packed.valid[b].tolist() == [True] * row.n + [False] * pad
        assert int(packed.num_nodes[b]) == row.n
        dup = [row.duplicate(c) for c in range(row.n)]
        assert packed.duplicate[b].tolist() == dup + [False] * pad
        for i in range(width):
            seen = row.ancestors(i) if i < row.n else {i}
            assert packed.attention_mask[b, i].tolist() == [j in seen for j in range(width)]


@given(batches())
def test_pack_matches_reference(batch: tuple[list[Tree | None], list[int], list[int]]) -> None:
    trees, roots, lens = batch
    assert_packed(pack_trees(trees, roots, lens), ref_rows(trees, roots, lens))


def test_pack_wide_trees_past_64_columns() -> None:
    """Trees past 64 nodes take the general ancestor loop; same answers."""
    rng = np.random.default_rng(7)
    chain = Tree.of(list(range(70)), list(range(-1, 69)), [0.5] * 70)
    trees = [chain, random_tree(rng, 100, 50), None, random_tree(rng, 80, 3)]
    roots, lens = [1, 2, 3, 4], [0, 5, 10, 1000]
    assert_packed(pack_trees(trees, roots, lens), ref_rows(trees, roots, lens))


def test_pack_inputs_in_every_form() -> None:
    """Plain sequences, int64 and int32 arrays and tensors of roots all pack the same."""
    tree = Tree.of([5, 6, 7], [-1, 0, 0], [0.9, 0.5, 0.4])
    wide = Raw(np.array([5, 6, 7]), np.array([-1, 0, 0]), np.array([0.9, 0.5, 0.4]))
    plain = Raw([5, 6, 7], [-1, 0, 0], [0.9, 0.5, 0.4])  # an engine's own tree type
    want = pack_trees([tree], [3], [10])
    for trees, roots, lens in (
        ([wide], [3], [10]),
        ([plain], np.array([3]), np.array([10], np.int32)),
        ([tree], torch.tensor([3]), torch.tensor([10])),
    ):
        got = pack_trees(trees, roots, lens, device="cpu")  # type: ignore[arg-type]
        for name in ("tokens", "parents", "depth", "positions", "attention_mask", "valid"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_empty_batch_and_rows_without_drafts() -> None:
    packed = pack_trees([], [], [])
    assert packed.tokens.shape == (0, 1)
    packed = pack_trees([None, Tree.of([], [], [])], [4, 5], [7, 0])
    assert packed.tokens.tolist() == [[4], [5]]
    assert packed.positions.tolist() == [[7], [0]]
    assert packed.attention_mask.tolist() == [[[True]], [[True]]]


@given(batches(), st.integers(0, 10))
def test_best_chain_matches_reference(
    batch: tuple[list[Tree | None], list[int], list[int]], max_len: int
) -> None:
    """Tree.best_chain (what the vLLM plug-in and the worker's chain mode verify)."""
    trees, roots, lens = batch
    for tree, row in zip(trees, ref_rows(trees, roots, lens), strict=True):
        if tree is not None:
            # ref columns count the root as column 0; tree node i is column i + 1.
            want = [tree.tokens[c - 1] for c in ref_best_chain(row, max_len)]
            assert tree.best_chain(max_len) == want


def test_best_chain_follows_scores_not_order() -> None:
    tree = Tree.of([1, 2, 3, 4, 5], [-1, -1, 0, 1, 1], [0.2, 0.7, 0.1, 0.3, 0.6])
    assert tree.best_chain(5) == [2, 5] and tree.best_chain(1) == [2] and tree.best_chain(0) == []


def test_a_chain_ends_before_its_first_node_below_the_min_score() -> None:
    """``min_score``: the chain is the same best path, cut before the first node whose
    (path) score is below it; 0 never cuts, and a root child below it gives no chain."""
    tree = Tree.of([1, 2, 3, 4, 5], [-1, -1, 0, 1, 3], [0.2, 0.7, 0.1, 0.3, 0.05])
    assert tree.best_chain(5) == [2, 4, 5] == tree.best_chain(5, 0.05)
    assert tree.best_chain(5, 0.1) == [2, 4]
    assert tree.best_chain(5, 0.5) == [2] and tree.best_chain(1, 0.5) == [2]
    assert tree.best_chain(5, 0.8) == []
    with pytest.raises(ValueError, match=r"min_score must be in \[0, 1\], got 1.5"):
        tree.best_chain(3, 1.5)


@pytest.mark.parametrize(
    ("trees", "roots", "lens", "error", "match"),
    [
        ([Tree.of([1, 2], [-1, 0], [0, 0])], [1, 2], [0], ValueError, r"roots has 2 entries"),
        ([None], [1], [0, 1], ValueError, r"cache_lens has 2 entries"),
        ([None], [-3], [0], ValueError, r"roots\[0\] = -3"),
        ([None, None], [1, 1], [0, -5], ValueError, r"cache_lens\[1\] = -5"),
        ([None], [1.5], [0], TypeError, r"roots must hold integers, got float64"),
        ([None], torch.tensor([1], dtype=torch.bfloat16), [0], TypeError,
         r"roots must hold integers, got torch.bfloat16"),
        ([None], [[1]], [0], ValueError, r"roots must be 1-D"),
        ([Tree.of([1, 2], [-1, 1], [0, 0])], [1], [0], ValueError, r"trees\[0\]\.parents\[1\] = 1"),
        ([None, Tree.of([1, 2], [-1, -2], [0, 0])], [1, 1], [0, 0], ValueError,
         r"trees\[1\]\.parents\[1\] = -2"),
        ([Tree.of([1, -4], [-1, 0], [0, 0])], [1], [0], ValueError,
         r"trees\[0\]\.tokens\[1\] = -4"),
        ([Raw(np.array([2**31]), [-1], [0])], [1], [0], ValueError, r"tokens\[0\] = 2147483648"),
        ([Raw([1, 2], [-1], [0.0, 0.0])], [1], [0], ValueError,
         r"trees\[0\] has 2 tokens but 1 parents"),
        ([None, Raw([1.0], [-1], [0.0])], [1, 1], [0, 0], TypeError,
         r"trees\[1\]\.tokens must hold integers, got float64"),
        ([Raw(np.array([[1]]), np.array([[-1]]), [0.0])], [1], [0], ValueError,
         r"trees\[0\]\.tokens must be 1-D"),
        (["tree"], [1], [0], TypeError, r"trees\[0\] must be a Tree or None, got str"),
        ([None], torch.tensor([[1]]), [0], ValueError, r"roots must be 1-D, got shape \(1, 1\)"),
        ([None], torch.tensor([1.0]), [0], TypeError, r"roots must hold integers"),
    ],
)
def test_pack_rejects_bad_input(
    trees: list[object], roots: object, lens: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        pack_trees(trees, roots, lens)  # type: ignore[arg-type]


def test_a_bad_chain_length_is_named() -> None:
    tree = Tree.of([1, 2], [-1, 0], [0.5, 0.5])
    with pytest.raises(ValueError, match="max_len must be a non-negative int, got -2"):
        tree.best_chain(-2)


def test_pack_refuses_ids_past_the_vocabulary() -> None:
    with pytest.raises(ValueError, match=r"trees\[0\]\.tokens\[1\] = 8: token ids are in 0\.\.7"):
        pack_trees([Tree.of([1, 8], [-1, 0], [0, 0])], [1], [0], vocab_size=8)
    assert pack_trees([Tree.of([1, 7], [-1, 0], [0, 0])], [1], [0], vocab_size=8).width == 3
