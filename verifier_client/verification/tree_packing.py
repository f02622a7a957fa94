"""Draft trees as verification inputs: one packed batch (torch; the package itself does
not import torch, so the gRPC client runs without it).

Packing runs in numpy on the host (a few dozen numpy calls on small arrays cost less than
as many kernel launches) and crosses to ``device`` in three copies (the int64 planes, the
boolean planes, the mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from verifier_client.results import Tree

__all__ = ["PackedTrees", "pack_trees"]

_I64 = npt.NDArray[np.int64]
_BITS = 64  # ancestor sets fit one uint64 per node up to this many columns
_TOKEN_LIMIT = 2**31  # token ids are int32 on the wire


@dataclass(frozen=True, eq=False)  # tensors: no field-wise ==
class PackedTrees:
    """A batch of trees as ``[B, T]`` planes: column 0 is the root (the request's last
    committed token, whose target output is the first new token), then the nodes in order;
    ``T = 1 +`` the most draft nodes of any row. A row without a tree is a plain step."""

    tokens: torch.Tensor  # [B, T] int64; column 0 = root, then draft nodes; padding 0
    parents: torch.Tensor  # [B, T] int64; column of the parent in the row; root, padding -1
    depth: torch.Tensor  # [B, T] int64; root 0, its children 1; padding 0
    positions: torch.Tensor  # [B, T] int64; cache_lens[b] + depth (padding: cache_lens[b])
    attention_mask: torch.Tensor  # [B, T, T] bool; [b, i, j] = j is i or an ancestor of i
    valid: torch.Tensor  # [B, T] bool; root and draft nodes (not padding)
    num_nodes: torch.Tensor  # [B] int64; root included
    # [B, T] bool: an earlier sibling has the same token; never entered (the drafter sends
    # unique siblings; this keeps any other source safe).
    duplicate: torch.Tensor

    @property
    def width(self) -> int:
        """T: columns per row, root included."""
        return int(self.tokens.shape[1])


def pack_trees(
    trees: Sequence[Tree | None],
    roots: Sequence[int] | torch.Tensor,
    cache_lens: Sequence[int] | torch.Tensor,
    *,
    device: torch.device | str | None = None,
    vocab_size: int = _TOKEN_LIMIT,
) -> PackedTrees:
    """Packs one tree per request (None or empty: the root alone) for one verify pass.

    ``roots[b]``: request b's last committed token; ``cache_lens[b]``: the tokens in its KV
    cache (its length without the root), so the root sits at position ``cache_lens[b]`` and
    a node at ``cache_lens[b] + depth``. ``device``: that of ``roots`` if a tensor, else the
    CPU. Token ids must be below ``vocab_size`` (a model's, to refuse ids it lacks). Scores
    are not packed: verification never reads them.
    """
    batch = len(trees)
    roots_np = _int_vector(roots, "roots", batch)
    cache_np = _int_vector(cache_lens, "cache_lens", batch)
    if device is None:
        device = roots.device if isinstance(roots, torch.Tensor) else "cpu"
    tokens, parents, counts = _concatenate(trees)
    offsets = np.cumsum(counts) - counts
    rows = np.repeat(np.arange(batch), counts)
    local = np.arange(len(tokens)) - np.repeat(offsets, counts)  # node index within its tree
    _check_nodes(tokens, parents, rows, local, vocab_size)

    width = 1 + int(counts.max()) if batch else 1
    planes = np.zeros((4, batch, width), np.int64)  # tokens, parents, depth, positions
    cols = local + 1
    planes[0, :, 0] = roots_np
    planes[0, rows, cols] = tokens
    planes[1].fill(-1)
    planes[1, rows, cols] = parents + 1  # draft index -> column (the root's -1 -> 0)
    mask, planes[2] = _ancestor_mask(planes[1])
    planes[3] = cache_np[:, None] + planes[2]
    flags = np.zeros((2, batch, width), bool)  # valid, duplicate
    flags[0] = np.arange(width) < (counts + 1)[:, None]
    flags[1, rows, cols] = _duplicates(rows * width + parents + 1, tokens)

    ints = torch.from_numpy(planes).to(device)
    bools = torch.from_numpy(flags).to(device)
    return PackedTrees(
        tokens=ints[0],
        parents=ints[1],
        depth=ints[2],
        positions=ints[3],
        attention_mask=torch.from_numpy(mask).to(device),
        valid=bools[0],
        num_nodes=torch.from_numpy(counts + 1).to(device),
        duplicate=bools[1],
    )


def _int_vector(values: Sequence[int] | torch.Tensor, name: str, batch: int) -> _I64:
    """A [batch] int64 host array of non-negative ints, or ValueError/TypeError naming it."""
    if isinstance(values, torch.Tensor):
        # Checked before .numpy(), which cannot convert bfloat16 and would not name `name`.
        if values.dtype.is_floating_point or values.dtype.is_complex:
            raise TypeError(f"{name} must hold integers, got {values.dtype}")
        raw = values.detach().cpu().numpy()
    else:
        raw = np.asarray(values)
    if raw.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {raw.shape}")
    if raw.size and raw.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {raw.dtype}")
    array: _I64 = raw.astype(np.int64)
    if len(array) != batch:
        raise ValueError(f"{name} has {len(array)} entries for {batch} trees")
    if array.size and array.min() < 0:
        b = int(np.argmin(array))
        raise ValueError(f"{name}[{b}] = {array[b]} is negative")
    return array


def _concatenate(trees: Sequence[Tree | None]) -> tuple[_I64, _I64, _I64]:
    """Every tree's nodes end to end, and the node count of each (the loop only collects
    references; numpy converts each field in one concatenation: the hot path)."""
    counts = [0] * len(trees)
    tokens: list[npt.ArrayLike] = []
    parents: list[npt.ArrayLike] = []
    for b, tree in enumerate(trees):
        if tree is None:
            continue
        try:
            tok, par = tree.tokens, tree.parents
        except AttributeError:
            raise TypeError(
                f"trees[{b}] must be a Tree or None, got {type(tree).__name__}"
            ) from None
        n = len(tok)
        if len(par) != n:
            raise ValueError(f"trees[{b}] has {n} tokens but {len(par)} parents")
        if n:
            counts[b] = n
            tokens.append(tok)
            parents.append(par)
    count_array = np.array(counts, dtype=np.int64)
    total = int(count_array.sum())
    return (
        _flat_ints(tokens, total, "tokens", trees),
        _flat_ints(parents, total, "parents", trees),
        count_array,
    )


def _flat_ints(
    parts: list[npt.ArrayLike], total: int, what: str, trees: Sequence[Tree | None]
) -> _I64:
    """One field of every tree end to end as int64; the error names the first bad tree."""
    try:
        flat = np.concatenate(parts)
    except ValueError:  # no parts (no nodes at all), or a part of another rank
        flat = np.zeros(0, np.int64)
    if flat.shape == (total,) and flat.dtype.kind in "iu":
        return flat.astype(np.int64, copy=False)
    for b, tree in enumerate(trees):  # the error path only: find the culprit
        values = np.asarray(getattr(tree, what, ()))
        if values.ndim != 1:
            raise ValueError(f"trees[{b}].{what} must be 1-D, got shape {values.shape}")
        if len(values) and values.dtype.kind not in "iu":
            raise TypeError(f"trees[{b}].{what} must hold integers, got {values.dtype}")
    raise TypeError(f"tree {what} must be 1-D integer sequences, got {flat.dtype}")


def _check_nodes(tokens: _I64, parents: _I64, rows: _I64, local: _I64, vocab_size: int) -> None:
    bad = np.flatnonzero((tokens < 0) | (tokens >= vocab_size))
    if len(bad):
        k = bad[0]
        raise ValueError(
            f"trees[{rows[k]}].tokens[{local[k]}] = {tokens[k]}: token ids are in "
            f"0..{vocab_size - 1}"
        )
    bad = np.flatnonzero((parents < -1) | (parents >= local))
    if len(bad):
        k = bad[0]
        raise ValueError(
            f"trees[{rows[k]}].parents[{local[k]}] = {parents[k]}: "
            f"must be -1 (the root) or an earlier node (0..{local[k] - 1})"
        )


def _ancestor_mask(parents: _I64) -> tuple[npt.NDArray[np.bool_], _I64]:
    """[B, T, T]: j is i or an ancestor of i (root and padding see themselves only); depth."""
    batch, width = parents.shape
    cols = np.arange(width)
    # Parent column of every column, the root and padding pointing at themselves:
    # following it reaches the root (or stays put) after at most T - 1 steps.
    up = np.where(parents >= 0, parents, cols)
    if width > _BITS:
        mask = np.zeros((batch, width, width), bool)
        mask[:, cols, cols] = True
        rows = np.arange(batch)
        for c in range(1, width):  # parents precede children: row up[c] is final
            mask[:, c] |= mask[rows, up[:, c]]
        return mask, mask.sum(axis=2) - 1  # ancestors and itself, less the root
    # Pointer doubling on bit sets: after round k, bits[i] holds the ancestors of i
    # at most 2**k - 1 steps up (itself included) and jump[i] the one 2**k steps up.
    self_bits = np.left_shift(np.uint64(1), cols.astype(np.uint64))
    bits = np.tile(self_bits, batch)
    jump = (up + (np.arange(batch) * width)[:, None]).ravel()
    span = 1
    while span < width:
        bits |= bits[jump]
        jump = jump[jump]
        span *= 2
    as_bytes = bits.astype("<u8").view(np.uint8).reshape(batch, width, 8)
    mask = np.unpackbits(as_bytes, axis=2, count=width, bitorder="little").view(bool)
    popcount = getattr(np, "bitwise_count", None)  # numpy >= 2.0
    if popcount is None:
        return mask, mask.sum(axis=2) - 1
    return mask, popcount(bits).astype(np.int64).reshape(batch, width) - 1


def _duplicates(siblings: _I64, tokens: _I64) -> npt.NDArray[np.bool_]:
    """Per node: an earlier node with the same ``siblings`` group and token exists."""
    key = siblings * (1 << 31) + tokens  # tokens < 2**31: one int64 per (group, token)
    order = np.argsort(key, kind="stable")  # equal keys stay in node order
    ordered = key[order]
    dup = np.zeros(len(key), bool)
    dup[order[1:]] = ordered[1:] == ordered[:-1]
    return dup
