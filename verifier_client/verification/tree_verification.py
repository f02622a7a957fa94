"""Lossless tree verification: the target's own token at every node decides the path (torch).

Drafts carry no probabilities, and verification needs none: at each visited node the
target emits the token plain decoding would (its argmax, or one sample of its temperature
/ top-k / top-p distribution there); the walk enters the child carrying it, or stops with
it as the bonus token. Each emitted token is what plain decoding would emit after the
tokens before it, so greedy output is identical and sampled output has the target
distribution. Sampling every node up front is the same: samples are independent and
those of unvisited nodes are never read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verifier_client.verification.tree_packing import PackedTrees

__all__ = ["VerifyResult", "accept", "sample_targets"]

_MAX_BLOCK = 1024  # the sampler's cumulative sums run over blocks of at most this many tokens


@dataclass(frozen=True, eq=False)  # tensors: no field-wise ==
class VerifyResult:
    """What one verify pass commits per request: accepted drafts, then the bonus token."""

    accepted_tokens: torch.Tensor  # [B, T] int64: accepted drafts then the bonus; -1 padded
    accept_lengths: torch.Tensor  # [B] int64: draft tokens accepted (bonus excluded)
    accepted_nodes: torch.Tensor  # [B, T] int64: packed columns of the path, root first; -1
    accepted_per_position: torch.Tensor  # [T - 1] int64: accepted at depth 1, 2, ... (batch sum)

    def tokens(self, b: int) -> list[int]:
        """Request b's committed tokens: accepted drafts then the bonus token."""
        n = int(self.accept_lengths[b]) + 1
        return [int(t) for t in self.accepted_tokens[b, :n].tolist()]


def accept(packed: PackedTrees, target_tokens: torch.Tensor) -> VerifyResult:
    """Walks each tree from the root while the target's token at a node is a child's token.

    ``target_tokens[b, i]``: the target's token after node i's path (:func:`sample_targets`).
    No loop over depth: a node is on the path iff it and each ancestor but the root carries
    its parent's target token; with equal siblings never entered (``duplicate``) those
    nodes form one chain from the root.
    """
    if not isinstance(packed, PackedTrees):
        raise TypeError(f"packed must be PackedTrees, got {type(packed).__name__}")
    if not isinstance(target_tokens, torch.Tensor):
        raise TypeError(f"target_tokens must be a tensor, got {type(target_tokens).__name__}")
    if tuple(target_tokens.shape) != tuple(packed.tokens.shape):
        raise ValueError(
            f"target_tokens has shape {tuple(target_tokens.shape)}, "
            f"the packed trees {tuple(packed.tokens.shape)}"
        )
    if target_tokens.dtype.is_floating_point or target_tokens.dtype.is_complex:
        raise TypeError(f"target_tokens must hold integers, got {target_tokens.dtype}")
    target = target_tokens.to(device=packed.tokens.device, dtype=torch.int64)
    width = packed.width
    cols = torch.arange(width, device=target.device)
    target_at_parent = target.gather(1, packed.parents.clamp(min=0))
    hit = (packed.tokens == target_at_parent) & packed.valid & ~packed.duplicate
    hit |= cols == 0  # the root is committed already
    # on_path[b, i]: no node in i's ancestor set (itself included) misses.
    on_path = ~(packed.attention_mask & ~hit[:, None, :]).any(2)
    accept_lengths = on_path.sum(1) - 1
    # Along a path columns grow with depth (parents precede children), so sorting
    # the path's columns puts it in order, root first.
    order = torch.where(on_path, cols, width).sort(1).values
    accepted_nodes = torch.where(order < width, order, -1)
    # The token after path node k is the target's token at node k: the next path
    # node carries it (that is why it was entered) and after the last it is the bonus.
    accepted_tokens = torch.where(
        accepted_nodes >= 0, target.gather(1, accepted_nodes.clamp(min=0)), -1
    )
    depths = torch.arange(1, width, device=target.device)
    return VerifyResult(
        accepted_tokens=accepted_tokens,
        accept_lengths=accept_lengths,
        accepted_nodes=accepted_nodes,
        accepted_per_position=(accept_lengths[:, None] >= depths).sum(0),
    )


def sample_targets(
    logits: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 0.0,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The target's token at every packed node: ``[B, T, V]`` logits -> ``[B, T]`` int64.

    Per request (scalars or ``[B]`` tensors): ``temperature == 0`` takes the argmax (lowest
    id on ties); otherwise one independent sample per node of ``softmax(logits /
    temperature)`` restricted, as in vLLM and SGLang, to the ``top_k`` most likely tokens
    (0 or >= V: all; ties at the boundary keep an arbitrary one), then to the smallest set
    of those whose renormalized mass reaches ``top_p`` (1: all; the most likely always
    stays). Inverse-CDF sampling, one uniform per node from ``generator`` (on the logits'
    device). Validating tensor parameters reads them on the host (a GPU sync).
    """
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a tensor, got {type(logits).__name__}")
    if logits.dim() != 3 or logits.shape[2] == 0:
        raise ValueError(f"logits must be [B, T, V] with V > 0, got {tuple(logits.shape)}")
    if not logits.dtype.is_floating_point:
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    batch, _, vocab = logits.shape
    temp = _per_request(temperature, "temperature", batch, integral=False)
    k = _per_request(top_k, "top_k", batch, integral=True)
    p = _per_request(top_p, "top_p", batch, integral=False)
    if not bool(torch.isfinite(temp).all()) or bool((temp < 0).any()):
        raise ValueError(f"temperature must be finite and >= 0, got {temperature!r}")
    if bool((k < 0).any()):
        raise ValueError(f"top_k must be >= 0 (0 = all tokens), got {top_k!r}")
    if not bool(((p > 0) & (p <= 1)).all()):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    sampled_rows = temp > 0
    if not bool(sampled_rows.any()):
        return logits.argmax(2)
    dev = logits.device
    k = torch.where((k == 0) | (k > vocab), vocab, k)
    inv_temp = (1.0 / torch.where(sampled_rows, temp, 1.0)).to(dev, torch.float32)[:, None, None]
    if bool((k == vocab).all()) and bool((p == 1).all()):
        sampled = _sample_rows_(logits.float() * inv_temp, generator)  # a fresh tensor
    else:
        sampled = _sample_filtered(logits, inv_temp, k, p, generator)
    if bool(sampled_rows.all()):
        return sampled
    return torch.where(sampled_rows.to(dev)[:, None], sampled, logits.argmax(2))


def _per_request(
    value: float | int | torch.Tensor, name: str, batch: int, *, integral: bool
) -> torch.Tensor:
    """A [batch] host tensor (float64, or int64 when integral) of a scalar or per-request value."""
    dtype = torch.int64 if integral else torch.float64
    if isinstance(value, torch.Tensor):
        if value.dim() > 1 or (value.dim() == 1 and value.shape[0] != batch):
            raise ValueError(f"{name} must be a scalar or [{batch}], got {tuple(value.shape)}")
        if integral and (value.dtype.is_floating_point or value.dtype == torch.bool):
            raise TypeError(f"{name} must hold integers, got {value.dtype}")
        return value.detach().to("cpu", dtype).expand(batch)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number or a tensor, got {type(value).__name__}")
    if integral and not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return torch.full((batch,), value, dtype=dtype)


def _sample_rows_(log_weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One sample per row of softmax(log_weights) along the last axis; overwrites its input.

    Inverse CDF: the first index whose cumulative weight exceeds u * total (u uniform) is
    drawn with probability p_i, a zero-weight (-inf) entry never; one random number per
    row, not per token (Gumbel-max): an exp and a sum. Cumulative sums are float64 (float32
    rounds away the tail past ~1 - 6e-8 of the mass), over blocks, then within u's block."""
    weights = log_weights.sub_(log_weights.amax(dim=-1, keepdim=True)).exp_()  # softmax * sum
    width = weights.shape[-1]
    block = min(width & -width, _MAX_BLOCK)  # the largest power of two dividing the width
    blocks = weights.reshape(*weights.shape[:-1], width // block, block)  # [..., nb, block]
    block_cdf = blocks.sum(dim=-1, dtype=torch.float64).cumsum(dim=-1)  # [..., nb]
    u = torch.rand(
        (*block_cdf.shape[:-1], 1), generator=generator, device=weights.device,
        dtype=torch.float64,
    )  # fmt: skip
    total = block_cdf[..., -1:]
    target = u * total  # in [0, total); the first block whose cumulative weight exceeds it:
    chosen = torch.searchsorted(block_cdf, _below(target, total), right=True)  # [..., 1]
    before = torch.where(
        chosen > 0, block_cdf.gather(-1, (chosen - 1).clamp(min=0)), torch.zeros_like(target)
    )
    index = chosen[..., None].expand(*chosen.shape[:-1], 1, block)
    inner_cdf = blocks.gather(-2, index).squeeze(-2).cumsum(dim=-1, dtype=torch.float64) + before
    # The same rule within the block; the bound absorbs the two sums' rounding.
    inner = torch.searchsorted(inner_cdf, _below(target, inner_cdf[..., -1:]), right=True)
    return (chosen * block + inner).squeeze(-1)


def _below(target: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``target`` kept strictly below ``total``, so some entry exceeds it (one with weight)."""
    return torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))


def _sample_filtered(
    logits: torch.Tensor,
    inv_temp: torch.Tensor,
    k: torch.Tensor,
    p: torch.Tensor,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Samples from the top-k then top-p filtered softmax(logits * inv_temp) ([B, T, V])."""
    dev = logits.device
    vocab = logits.shape[2]
    k_max = int(k.max())
    # Candidates in descending order (a positive temperature keeps the order, so
    # only the candidates are scaled); top-k keeps ranks < k of each request.
    if k_max == vocab:
        values, ids = logits.sort(dim=2, descending=True)
    else:
        values, ids = logits.topk(k_max, dim=2)
    values = values.float() * inv_temp
    ranks = torch.arange(k_max, device=dev)
    values = values.masked_fill(ranks >= k.to(dev)[:, None, None], float("-inf"))
    # Top-p on the renormalized top-k distribution: keep a token while the mass of
    # the tokens before it is below p (rank 0 has mass 0 before it, so it stays).
    # p = 1 keeps all: float32 sums can reach 1.0 before the tail ends.
    probs = values.softmax(dim=2)
    mass_before = probs.cumsum(dim=2) - probs
    p_dev = p.to(dev, torch.float32)[:, None, None]
    keep = (mass_before < p_dev) | (p_dev >= 1)
    values = values.masked_fill(~keep, float("-inf"))
    choice = _sample_rows_(values, generator)
    return ids.gather(2, choice[:, :, None]).squeeze(2)

