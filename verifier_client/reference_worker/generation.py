"""What the reference worker takes and returns: requests, sampling, generations, counters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Generation", "GenerationRequest", "SamplingParams", "StepTimings", "WorkerStats"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Greedy when ``temperature == 0``; otherwise sampling with the request's seed."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """``teacher_ids``: teacher forcing, for benchmarks of random-weight models. The target's
    token at each position is the recording's, not the logits' choice: the same work, and
    the output is the recording (cut at ``max_new_tokens``), as its replay would decode."""

    request_id: str
    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    teacher_ids: Sequence[int] | None = None


@dataclass(slots=True)
class Generation:
    """A finished request: its output (EOS included when it ended there)."""

    request_id: str
    output_ids: list[int]
    finish_reason: Literal["eos", "length"]
    steps: int  # decode steps it took part in


@dataclass(slots=True)
class StepTimings:
    """Seconds spent per phase, summed over steps (device-synchronized on CUDA)."""

    draft_s: float = 0.0  # drafter round trips
    pack_s: float = 0.0  # trees to tensors, attention mask
    forward_s: float = 0.0  # the model's tree forward pass
    verify_s: float = 0.0  # target choices (argmax / sampling) and acceptance
    kv_s: float = 0.0  # keeping the accepted path's KV
    prefill_s: float = 0.0


@dataclass(slots=True)
class WorkerStats:
    steps: int = 0
    output_tokens: int = 0  # committed tokens (accepted drafts + bonus tokens)
    drafts: int = 0  # request-steps that verified a non-empty tree
    draft_tokens: int = 0
    accepted_tokens: int = 0  # accepted draft tokens (bonus excluded)
    request_steps: int = 0  # one per request per step
    fallbacks: dict[str, int] = field(default_factory=dict)  # drafter steps without trees
    rejected_trees: int = 0  # trees holding ids outside the model's vocabulary (ignored)
    timings: StepTimings = field(default_factory=StepTimings)
