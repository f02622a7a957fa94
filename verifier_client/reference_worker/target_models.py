"""Target models for the reference worker: a local Hugging Face directory, or a tiny
built-in config with seeded random weights (tests, benchmarks; nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    GPTNeoXConfig,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
)

from verifier_client.reference_worker.model_choices import DTYPE_NAMES, TINY_ARCHITECTURES

__all__ = ["DTYPES", "TINY_ARCHITECTURES", "load_model", "on_device", "tiny_model"]

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


def tiny_model(
    architecture: str,
    *,
    vocab_size: int = 128256,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    init_std: float = 0.02,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
) -> PreTrainedModel:
    """A small causal LM of ``architecture`` with random weights from ``seed`` (the global
    RNG left as it was): Llama with grouped-query attention, Qwen2 with q/k/v biases,
    GPT-NeoX with fused qkv, a quarter of each head rotated, attention and MLP in parallel.
    """
    if hidden_size % num_heads or hidden_size < 2 * num_heads:
        raise ValueError(f"hidden_size {hidden_size} must be a multiple of num_heads "
                         f"{num_heads} with head_dim >= 2")  # fmt: skip
    common: dict[str, Any] = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, intermediate_size=2 * hidden_size,
        max_position_embeddings=8192, initializer_range=init_std,
        tie_word_embeddings=False, attn_implementation=attn_implementation,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    config: PretrainedConfig
    if architecture == "llama":
        config = LlamaConfig(num_key_value_heads=max(1, num_heads // 2), **common)
    elif architecture == "qwen2":
        config = Qwen2Config(num_key_value_heads=num_heads, use_sliding_window=False, **common)
    elif architecture == "gpt-neox":
        config = GPTNeoXConfig(use_parallel_residual=True, **common)  # rotates 1/4 of a head
    else:
        raise ValueError(f"unknown tiny architecture {architecture!r} "
                         f"(known: {', '.join(TINY_ARCHITECTURES)})")  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: PreTrainedModel = AutoModelForCausalLM.from_config(config)
    return on_device(model, dtype=dtype)


def load_model(path: str | Path, *, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """A causal LM from a local Hugging Face directory (never downloads)."""
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ValueError(f"model directory {str(path)!r} has no config.json")
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        directory, dtype=dtype, local_files_only=True, attn_implementation="sdpa"
    )
    return on_device(model)


def on_device(
    model: PreTrainedModel,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> PreTrainedModel:
    """``model`` moved (in place) to ``device`` / ``dtype`` and in inference mode (no dropout)."""
    model.to(device=device, dtype=dtype)
    model.train(False)
    return model
