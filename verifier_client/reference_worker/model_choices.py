"""The names the worker's command line offers for its models, without importing torch
(``drafter-worker --help`` and argument errors answer at once)."""

from __future__ import annotations

__all__ = ["DTYPE_NAMES", "TINY_ARCHITECTURES"]

TINY_ARCHITECTURES = ("llama", "qwen2", "gpt-neox")
DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")
