"""How many drafted tokens greedy verification accepts from a tree, against a known
output (the replay and the load benchmark both count this way)."""

from __future__ import annotations

from collections.abc import Sequence


def accepted_length(
    tokens: Sequence[int], parents: Sequence[int], output: Sequence[int], p: int
) -> int:
    """Depth of the deepest path of the tree matching ``output[p:]`` (parents precede children)."""
    left = len(output) - p
    depth = [0] * len(tokens)  # matched depth of each node, 0 = off the output
    best = 0
    for i, (token, parent) in enumerate(zip(tokens, parents, strict=True)):
        d = 1 if parent < 0 else depth[parent] + 1 if depth[parent] else 0
        if d and d <= left and token == output[p + d - 1]:
            depth[i] = d
            best = max(best, d)
    return best
