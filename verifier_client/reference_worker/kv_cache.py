"""The decode batch's KV cache on a ``transformers`` DynamicCache, for tree verification.

Row ``b`` of every layer's keys/values (``[B, heads, L, head_dim]``) holds request ``b``'s
committed context but its last token (the next tree's root) at columns ``[0, lens[b])``;
columns ``[lens[b], L)`` are stale and masked out. A step appends the trees' K/V at
``[L, L + T)``; :meth:`BatchKVCache.keep_accepted` moves each accepted path to the row's
end and trims ``L`` to the longest row, discarding rejected nodes without a copy.
Written against transformers 5.x (``DynamicCache.layers[i]`` a ``DynamicLayer``); other
layer types (sliding window, linear attention) are refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer

__all__ = ["BatchKVCache"]


class BatchKVCache:
    """KV of the requests in a decode batch; rows follow the batch order."""

    def __init__(self, config: PretrainedConfig) -> None:
        self.cache = DynamicCache(config=config)
        self.lens: list[int] = []  # committed tokens with KV per row (context minus the root)
        self._layers = _dynamic_layers(self.cache)

    @property
    def physical_len(self) -> int:
        """Columns each row holds (valid or stale)."""
        keys = self._layers[0].keys
        return 0 if keys is None else int(keys.shape[-2])

    def attention_mask(self, tree_mask: Tensor, dtype: torch.dtype) -> Tensor:
        """Additive 4D mask ``[B, 1, T, L + T]`` of a tree forward: node ``i`` of row ``b``
        sees the cache columns ``j < lens[b]`` and its tree ancestors (``tree_mask[b, i]``);
        the rest gets the dtype's minimum (exp() of it is 0). Eager and SDPA attention both
        take it."""
        batch, width, _ = tree_mask.shape
        device, length = tree_mask.device, self.physical_len
        lens = torch.tensor(self.lens, device=device)
        cache_visible = torch.arange(length, device=device) < lens[:, None]
        visible = torch.cat([cache_visible[:, None, :].expand(batch, width, length), tree_mask],
                            dim=2)  # fmt: skip
        mask = torch.zeros(visible.shape, dtype=dtype, device=device)
        mask.masked_fill_(~visible, torch.finfo(dtype).min)
        return mask[:, None, :, :]

    def append_rows(self, prefilled: DynamicCache, lengths: Sequence[int]) -> None:
        """Adds one row per joining request: row ``i`` of ``prefilled`` holds
        ``lengths[i]`` valid columns."""
        for layer, new in zip(self._layers, prefilled.layers, strict=True):
            keys, values = new.keys, new.values
            if layer.keys is not None:  # None before the first prefill
                keys, values = _stack_rows(layer.keys, keys), _stack_rows(layer.values, values)
            _set_layer(layer, keys, values)
        self.lens.extend(lengths)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keeps only ``rows`` (in that order): requests that left the batch are dropped."""
        self.lens = [self.lens[r] for r in rows]
        # The longest row may have left: trim to the longest kept (none kept: no columns).
        new_len = max(self.lens, default=0)
        for layer in self._layers:  # all filled: the step's forward ran before
            index = torch.tensor(rows, dtype=torch.long, device=layer.keys.device)
            keys = layer.keys[:, :, :new_len].index_select(0, index)
            values = layer.values[:, :, :new_len].index_select(0, index)
            _set_layer(layer, keys, values)

    def keep_accepted(self, accepted_nodes: Tensor, kept: Tensor) -> None:
        """After a tree forward: moves each row's first ``kept[b]`` accepted tree columns
        (``accepted_nodes[b, :kept[b]]``, root first; the trees are the last ``T`` columns,
        ``T = accepted_nodes.shape[1]``) to its committed end, then trims."""
        device = accepted_nodes.device
        width = accepted_nodes.shape[1]
        tree_start = self.physical_len - width
        kept = kept.to(device)
        lens = torch.tensor(self.lens, dtype=torch.long, device=device)
        # Entry (b, k) with k < kept[b]: column tree_start + accepted_nodes[b, k] goes to
        # lens[b] + k. Accepted node k sits at depth k, so its packed column is >= k and the
        # destination never lies after the source; the gather below copies before writing.
        rows, ks = (torch.arange(width, device=device)[None, :] < kept[:, None]).nonzero(
            as_tuple=True
        )
        src = tree_start + accepted_nodes[rows, ks]
        dst = lens[rows] + ks
        new_lens = lens + kept
        new_len = int(new_lens.max()) if new_lens.numel() else 0
        for layer in self._layers:
            keys, values = layer.keys, layer.values
            assert keys is not None and values is not None, "keep_accepted before a forward"
            rows_k, src_k, dst_k = rows.to(keys.device), src.to(keys.device), dst.to(keys.device)
            keys[rows_k, :, dst_k] = keys[rows_k, :, src_k]
            values[rows_k, :, dst_k] = values[rows_k, :, src_k]
            _set_layer(layer, keys[:, :, :new_len], values[:, :, :new_len])
        self.lens = new_lens.tolist()


def _dynamic_layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The cache's layers; ValueError unless each is a plain (full-attention) DynamicLayer."""
    for i, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            raise ValueError(
                f"cache layer {i} is a {type(layer).__name__}: tree verification supports "
                "models whose every layer has full attention with a DynamicLayer cache"
            )
    return list(cache.layers)


def _set_layer(layer: DynamicLayer, keys: Tensor, values: Tensor) -> None:
    if not layer.is_initialized:
        layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values


def _stack_rows(old: Tensor, new: Tensor) -> Tensor:
    """``old``'s rows then ``new``'s, zero-padded on the sequence axis to the longer (stale
    columns: masked)."""
    length = max(int(old.shape[-2]), int(new.shape[-2]))
    return torch.cat(
        [torch.nn.functional.pad(t, (0, 0, 0, length - int(t.shape[-2]))) for t in (old, new)]
    )
