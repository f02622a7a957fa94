"""Plain-Python references for tree packing and verification, and random draft trees.

Written node by node from the definitions (no numpy tricks, no torch), so the
vectorized code in verifier_client.verification.tree_packing / verification is checked
against something simple enough to trust by reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from verifier_client.results import Tree


@dataclass
class RefRow:
    """One request packed: column 0 the root, then the draft nodes."""

    tokens: list[int]
    parents: list[int]  # column of the parent, -1 for the root
    scores: list[float]
    cache_len: int

    @property
    def n(self) -> int:
        return len(self.tokens)

    def depth(self, c: int) -> int:
        return 0 if c == 0 else 1 + self.depth(self.parents[c])

    def ancestors(self, c: int) -> set[int]:
        """c and every node above it, the root included."""
        out = {c}
        while self.parents[c] >= 0:
            c = self.parents[c]
            out.add(c)
        return out

    def children(self, c: int) -> list[int]:
        return [i for i in range(1, self.n) if self.parents[i] == c]

    def duplicate(self, c: int) -> bool:
        return c > 0 and any(
            self.parents[j] == self.parents[c] and self.tokens[j] == self.tokens[c]
            for j in range(1, c)
        )


def ref_rows(
    trees: Sequence[Tree | None],
    roots: Sequence[int],
    cache_lens: Sequence[int],
) -> list[RefRow]:
    rows = []
    for tree, root, cache_len in zip(trees, roots, cache_lens, strict=True):
        tokens = [] if tree is None else [int(t) for t in tree.tokens]
        parents = [] if tree is None else [int(p) for p in tree.parents]
        scores = [] if tree is None else [float(s) for s in tree.scores]
        rows.append(
            RefRow(
                tokens=[root, *tokens],
                parents=[-1] + [p + 1 for p in parents],
                scores=[0.0, *scores],
                cache_len=cache_len,
            )
        )
    return rows


def ref_walk(row: RefRow, targets: Sequence[int]) -> tuple[list[int], list[int]]:
    """(committed tokens, visited columns): descend while a child carries the target's token.

    Among equal siblings the first (lowest column) is entered.
    """
    node, tokens, nodes = 0, [], [0]
    while True:
        token = targets[node]
        tokens.append(token)
        matches = [c for c in row.children(node) if row.tokens[c] == token]
        if not matches:
            return tokens, nodes
        node = matches[0]
        nodes.append(node)


def ref_best_chain(row: RefRow, max_len: int) -> list[int]:
    """Columns of the path through the highest-score child (first on ties)."""
    node, path = 0, []
    while len(path) < max_len:
        children = [c for c in row.children(node) if not row.duplicate(c)]
        if not children:
            return path
        best = children[0]
        for c in children[1:]:
            if row.scores[c] > row.scores[best]:
                best = c
        node = best
        path.append(node)
    return path


def random_tree(rng: np.random.Generator, max_nodes: int, vocab: int) -> Tree:
    """Any tree with parents before children (breadth-first or not), tokens below vocab."""
    n = int(rng.integers(0, max_nodes + 1))
    parents = [int(rng.integers(-1, i)) for i in range(n)]
    if rng.random() < 0.5:
        parents.sort()  # breadth-first order: parents non-decreasing
    tokens = rng.integers(0, vocab, n).tolist()
    scores = rng.choice([0.25, 0.5, 0.75], n).tolist()  # ties on purpose
    return Tree.of(tokens, parents, scores)


@st.composite
def trees(draw: st.DrawFn, max_nodes: int = 12, vocab: int = 4) -> Tree | None:
    """None, an empty tree, or a random tree (small vocabulary: equal siblings happen)."""
    kind = draw(st.sampled_from(["none", "empty", "tree", "tree", "tree"]))
    if kind == "none":
        return None
    n = 0 if kind == "empty" else draw(st.integers(1, max_nodes))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    if draw(st.booleans()):
        parents.sort()
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    scores = draw(st.lists(st.sampled_from([0.1, 0.5, 0.9]), min_size=n, max_size=n))
    return Tree.of(tokens, parents, scores)


@st.composite
def batches(
    draw: st.DrawFn, max_batch: int = 6, max_nodes: int = 12, vocab: int = 4
) -> tuple[list[Tree | None], list[int], list[int]]:
    """Trees, roots and cache lengths of a ragged batch (possibly empty)."""
    batch = draw(st.lists(trees(max_nodes, vocab), max_size=max_batch))
    roots = draw(st.lists(st.integers(0, vocab - 1), min_size=len(batch), max_size=len(batch)))
    lens = draw(st.lists(st.integers(0, 100), min_size=len(batch), max_size=len(batch)))
    return batch, roots, lens
