"""Hardware-aware draft budget (SSSD §3.2): draft nodes per request per step.

Verifying a tree is one forward pass over ``batch * tree_tokens`` positions; decoding is
memory-bound, so it costs about a plain decode step until the work reaches the GPU's ridge
point ``I = peak dense bf16 FLOP/s ÷ memory bandwidth`` (FLOP per byte). The rule keeps
``batch * tree_tokens ≤ I``: ``tree_tokens = floor(I / batch)``, and since a tree's
positions include its root (verified even without speculation) and the protocol counts
draft nodes only, ``budget = tree_tokens - 1``, clamped to ``[floor_tokens, cap_tokens]``.

The floor defaults to 0: from ``batch ≥ I / 2`` even one node would pass the ridge point,
so the client sends and waits for nothing that step (``ClientStats.unsent_steps``); the
next step that drafts, or the finish, catches the drafter up. ``floor_tokens=1`` always
drafts a node. The cap (default 32, the paper's value at batch 1) bounds small batches,
where acceptance, not compute, is the limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["PROFILES", "BudgetRule", "GpuProfile"]


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """A GPU's peak dense bf16 throughput and memory bandwidth."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s (no sparsity)
    memory_bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        if not (self.peak_flops > 0 and self.memory_bandwidth_bytes_per_s > 0):
            raise ValueError(
                f"GPU profile {self.name!r}: peak_flops and memory bandwidth must be > 0, "
                f"got {self.peak_flops!r} and {self.memory_bandwidth_bytes_per_s!r}"
            )

    @property
    def ridge_point(self) -> float:
        """Arithmetic intensity (FLOP per byte) where the GPU turns compute-bound."""
        return self.peak_flops / self.memory_bandwidth_bytes_per_s


PROFILES: dict[str, GpuProfile] = {
    # Datasheet values: H100 SXM5 989.4 TFLOP/s dense bf16, 3.35 TB/s HBM3 (I ≈ 295);
    # H200 has the same compute with 4.8 TB/s HBM3e (I ≈ 206): more bandwidth, smaller trees.
    "h100-sxm": GpuProfile("h100-sxm", 989.4e12, 3.35e12),
    "h200": GpuProfile("h200", 989.4e12, 4.8e12),
}
_ALIASES = {"h100": "h100-sxm", "h100_sxm": "h100-sxm", "h100sxm": "h100-sxm"}


@dataclass(frozen=True, slots=True)
class BudgetRule:
    """Per-request draft budget from the batch size, or a fixed budget: build one with
    :meth:`for_gpu`, :meth:`from_hardware`, :meth:`fixed` or :meth:`parse`."""

    ridge_point: float | None  # FLOP per byte; None with a fixed budget
    cap_tokens: int = 32
    floor_tokens: int = 0
    fixed_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.fixed_tokens is not None:
            if self.fixed_tokens < 0:
                raise ValueError(f"fixed budget must be >= 0, got {self.fixed_tokens}")
            return
        if self.ridge_point is None or not self.ridge_point > 0:
            raise ValueError(f"ridge_point must be > 0, got {self.ridge_point!r}")
        if not 0 <= self.floor_tokens <= self.cap_tokens:
            raise ValueError(
                f"need 0 <= floor_tokens <= cap_tokens, got {self.floor_tokens} and "
                f"{self.cap_tokens}"
            )

    @classmethod
    def for_gpu(cls, name: str, *, cap_tokens: int = 32, floor_tokens: int = 0) -> BudgetRule:
        """The rule for a built-in GPU profile (``h100-sxm`` or ``h100``, ``h200``)."""
        key = _ALIASES.get(name.lower(), name.lower())
        if key not in PROFILES:
            known = ", ".join(sorted([*PROFILES, *_ALIASES]))
            raise ValueError(f"unknown GPU profile {name!r} (known: {known})")
        return cls(PROFILES[key].ridge_point, cap_tokens=cap_tokens, floor_tokens=floor_tokens)

    @classmethod
    def from_hardware(
        cls,
        peak_flops: float,
        memory_bandwidth_bytes_per_s: float,
        *,
        cap_tokens: int = 32,
        floor_tokens: int = 0,
    ) -> BudgetRule:
        """The rule for any GPU, from its dense bf16 FLOP/s and memory bandwidth (B/s)."""
        profile = GpuProfile("custom", peak_flops, memory_bandwidth_bytes_per_s)
        return cls(profile.ridge_point, cap_tokens=cap_tokens, floor_tokens=floor_tokens)

    @classmethod
    def fixed(cls, budget_tokens: int) -> BudgetRule:
        """The same budget at every batch size."""
        return cls(None, fixed_tokens=budget_tokens)

    @classmethod
    def parse(cls, spec: str) -> BudgetRule:
        """A rule from a config string: a profile name (``h200``), a fixed budget
        (``16`` or ``fixed:16``), or ``FLOPS/BANDWIDTH`` (``989.4e12/3.35e12``)."""
        text = spec.strip().lower().removeprefix("fixed:")
        if text.isdigit():
            return cls.fixed(int(text))
        if "/" in text:
            flops, _, bandwidth = text.partition("/")
            try:
                return cls.from_hardware(float(flops), float(bandwidth))
            except ValueError as err:
                raise ValueError(f"bad budget spec {spec!r}: {err}") from None
        return cls.for_gpu(text)

    def draft_budget(self, batch_size: int) -> int:
        """Draft nodes per request (root not counted) for a batch of ``batch_size``."""
        if self.fixed_tokens is not None:
            return self.fixed_tokens
        assert self.ridge_point is not None  # checked in __post_init__
        if batch_size < 1:
            return self.cap_tokens
        # batch * (1 + budget) ≤ I  ⇒  budget = floor(I / batch) - 1 (the 1 is the root).
        budget = math.floor(self.ridge_point / batch_size) - 1
        return max(self.floor_tokens, min(self.cap_tokens, budget))
