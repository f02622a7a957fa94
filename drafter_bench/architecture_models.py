"""Models of real architectures with random weights, for ``drafter-bench gpu``."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from verifier_client.reference_worker.target_models import on_device

__all__ = ["ARCHITECTURES", "architecture_model"]

# Real architectures, by their published configurations (the shapes decide the work of a
# forward pass; the RoPE frequencies and scaling do not, and are left at the defaults).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(
        vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=14336, rms_norm_eps=1e-5,
    ),
}  # fmt: skip


def architecture_model(
    name: str,
    *,
    device: torch.device | str,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    max_positions: int = 8192,
    attn_implementation: str = "sdpa",
) -> PreTrainedModel:
    """A Llama model of a real architecture (:data:`ARCHITECTURES`) with random weights,
    built directly on ``device`` in ``dtype`` (an 8B model is never materialized on the
    host). Random weights emit garbage: benchmarks teacher-force their acceptance."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r} (known: {', '.join(ARCHITECTURES)})")
    config = LlamaConfig(
        **ARCHITECTURES[name], max_position_embeddings=max_positions, tie_word_embeddings=False,
        attn_implementation=attn_implementation, bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
    )  # fmt: skip
    default_dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        torch.set_default_dtype(dtype)
        try:
            model = LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(default_dtype)
    return on_device(model, device, dtype)
