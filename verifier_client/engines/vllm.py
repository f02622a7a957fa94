"""vLLM plug-in: every decode step drafts through the drafting service, no fork.

Turn it on with vLLM's own switches (``verifier_client`` installed in vLLM's
environment; README, "Use with vLLM")::

    vllm serve MODEL \\
      --speculative-config '{"method": "custom_class", "num_speculative_tokens": 4,
                             "model": "verifier_client.engines.vllm.SssdProposer"}' \\
      --additional-config '{"sssd_drafter": {"address": "drafter:50051",
                                             "deadline_ms": 5, "budget": "16"}}'

vLLM forbids extra keys in ``--speculative-config``, so our settings come from
``--additional-config``'s ``sssd_drafter`` or ``$SSSD_DRAFTER_CONFIG`` (same JSON).
``propose`` gets token rows but no request ids: two thin wrappers on the model runner
(installed by the ``vllm.general_plugins`` entry point, and by the proposer in case it is
built first) hand the proposer the runner and the step's scheduled drafts (to count
acceptance as ``vllm:spec_decode_*`` does), and finish a dropped request on the drafter,
which ingests it unless ``SamplingParams(extra_args={"sssd_store": False})``.

vLLM 0.32 verifies chains, not trees: each tree becomes its :meth:`Tree.best_chain`, at
most ``num_speculative_tokens`` long (with ``chain_rule``, at most what the batch verifies
for free), ending before a node scored below ``chain_min_score``. A missed deadline, a
dead service or any error means empty drafts for that step, never an exception.
"""

from __future__ import annotations

import atexit
import functools
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from verifier_client.acceptance_metrics import WorkerMetrics
from verifier_client.engines.batch import (
    STORE_KEY,
    DrafterSettings,
    EngineDrafter,
    may_store,
    tokenizer_fingerprint,
)

__all__ = ["ADDITIONAL_CONFIG_KEY", "STORE_KEY", "SssdProposer", "register", "worker_stats"]

log = logging.getLogger(__name__)

ADDITIONAL_CONFIG_KEY = "sssd_drafter"
"""The key of our settings in vLLM's ``--additional-config``."""
_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
_HOOKED = "_sssd_drafter_hooks"


def register() -> None:
    """``vllm.general_plugins`` entry point, in every vLLM process: fails on bad
    ``$SSSD_DRAFTER_CONFIG`` settings by name; installs the runner wrappers where the
    runner's module is loaded (the front-end process never imports it, and must not)."""
    DrafterSettings.resolve(None, where="vLLM plug-in")
    if _RUNNER_MODULE in sys.modules:
        install_hooks(sys.modules[_RUNNER_MODULE].GPUModelRunner)


def install_hooks(runner_class: type) -> None:
    """Wraps the two runner methods the proposer needs (idempotent per class)."""
    if _HOOKED in runner_class.__dict__:
        return
    propose = runner_class.propose_draft_token_ids  # type: ignore[attr-defined]
    removed = runner_class._on_request_state_removed  # type: ignore[attr-defined]

    @functools.wraps(propose)
    def propose_draft_token_ids(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, SssdProposer):
            drafter.begin_step(self, scheduler_output)
        return propose(self, scheduler_output, *args, **kwargs)

    @functools.wraps(removed)
    def _on_request_state_removed(self: Any, req_id: str, req_state: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, SssdProposer):
            drafter.release(req_id, req_state)
        return removed(self, req_id, req_state)

    runner_class.propose_draft_token_ids = propose_draft_token_ids  # type: ignore[attr-defined]
    runner_class._on_request_state_removed = _on_request_state_removed  # type: ignore[attr-defined]
    setattr(runner_class, _HOOKED, True)


class SssdProposer:
    """vLLM ``custom_class`` proposer drafting through the SSSD drafting service."""

    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        self.num_speculative_tokens: int = int(spec.num_speculative_tokens)
        self.max_model_len: int = int(vllm_config.model_config.max_model_len)
        additional = getattr(vllm_config, "additional_config", None)
        ours = additional.get(ADDITIONAL_CONFIG_KEY) if isinstance(additional, Mapping) else None
        self.settings = DrafterSettings.resolve(
            ours, where=f"--additional-config {ADDITIONAL_CONFIG_KEY!r}"
        )
        install_hooks(sys.modules[_RUNNER_MODULE].GPUModelRunner)
        self._chain_rule = self.settings.chain_budget_rule()
        self._runner: Any = None
        self._verified: Mapping[str, Sequence[int]] = {}  # this step's scheduled drafts
        self.propose_calls = 0  # propose() calls with at least one request to draft for
        self.counts = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
        self.accepted_per_position = [0] * self.num_speculative_tokens
        # Only the first tensor-parallel rank's drafts reach the scheduler; the other
        # ranks would only add calls (and could draft differently under a deadline).
        self.drafter: EngineDrafter | None = None
        self.metrics: WorkerMetrics | None = None
        if _tensor_parallel_rank() == 0:
            tokenizer = getattr(vllm_config.model_config, "tokenizer", None)
            self.drafter = EngineDrafter(
                self.settings, tokenizer_fingerprint=tokenizer_fingerprint(tokenizer)
            )
            atexit.register(self.drafter.close, 2.0)  # send the last finishes
            self.metrics = self.drafter.metrics  # records the drafter calls itself

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM calls this on every proposer; there is no model to load."""

    def begin_step(self, runner: Any, scheduler_output: Any) -> None:
        """Called by the runner wrapper before :meth:`propose` (see the module docstring)."""
        install_hooks(type(runner))  # a platform runner overriding the hooks (idempotent)
        self._runner = runner
        self._verified = scheduler_output.scheduled_spec_decode_tokens

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Draft tokens per batch row (an empty list: no speculation for that row)."""
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        runner, drafter = self._runner, self.drafter
        if runner is None or drafter is None:
            return drafts
        batch = runner.input_batch
        req_ids: list[str] = batch.req_ids
        self._count_verified(req_ids, sampled_token_ids)
        # Rows that decode: a partial prefill sampled nothing; a full context has no room.
        rows = [
            i for i, sampled in enumerate(sampled_token_ids)
            if sampled and num_tokens_no_spec[i] < self.max_model_len
        ]  # fmt: skip
        if not rows:
            return drafts
        self.propose_calls += 1
        longest = self.num_speculative_tokens
        if self._chain_rule is not None:  # what verification costs at this batch size
            longest = min(longest, self._chain_rule.draft_budget(len(rows)))
        lengths = [int(num_tokens_no_spec[i]) for i in rows]
        trees = drafter.draft(
            [req_ids[i] for i in rows],
            lengths,
            [int(batch.num_prompt_tokens[i]) for i in rows],
            lambda r, start, stop: token_ids_cpu[rows[r], start:stop].tolist(),
            stores=[_stores(getattr(runner, "requests", {}).get(req_ids[i])) for i in rows],
            budget=0 if longest == 0 else None,  # no chain can pay: no round trip either
        )
        min_score = self.settings.chain_min_score
        for row, length, tree in zip(rows, lengths, trees, strict=True):
            if tree is not None and len(tree):
                room = min(longest, self.max_model_len - length)
                drafts[row] = tree.best_chain(room, min_score)
        return drafts

    def release(self, req_id: str, req_state: Any) -> None:
        """The runner dropped a finished or aborted request: finish it on the drafter."""
        if self.drafter is None:
            return
        prompt = getattr(req_state, "prompt_token_ids", None) or []
        output = getattr(req_state, "output_token_ids", None) or []
        self.drafter.release(req_id, store=_stores(req_state), context=[*prompt, *output])

    def stats(self) -> dict[str, Any]:
        """Counters of this proposer (see :func:`worker_stats`)."""
        drafter = self.drafter
        client = drafter.stats if drafter is not None else None
        return {
            "propose_calls": self.propose_calls,
            **self.counts,
            "accepted_per_position": list(self.accepted_per_position),
            "client_steps": client.steps if client else 0,
            "drafted_steps": client.drafted_steps if client else 0,
            "fallbacks": {o.value: n for o, n in client.fallbacks.items()} if client else {},
            "errors": drafter.errors if drafter is not None else 0,
            "live_requests": drafter.live_requests if drafter is not None else 0,
            "drafter_ms_p50": _percentile(drafter.round_trips_ms, 50) if drafter else 0.0,
            "drafter_ms_p99": _percentile(drafter.round_trips_ms, 99) if drafter else 0.0,
        }

    def _count_verified(self, req_ids: Sequence[str], sampled: Sequence[Sequence[int]]) -> None:
        """Acceptance of the drafts verified this step, counted as vLLM's scheduler does:
        a draft's size is its scheduled (valid) tokens, accepted = sampled - 1."""
        verified = self._verified
        if not verified:
            return
        sizes: list[int] = []
        accepted: list[int] = []
        for row, req_id in enumerate(req_ids):
            scheduled = verified.get(req_id)
            if not scheduled or not sampled[row]:
                continue
            sizes.append(sum(1 for t in scheduled if t >= 0))  # -1: refused by a grammar
            accepted.append(max(len(sampled[row]) - 1, 0))
        per_position = [sum(1 for a in accepted if a > p) for p in range(max(accepted, default=0))]
        for p, count in enumerate(per_position[: len(self.accepted_per_position)]):
            self.accepted_per_position[p] += count
        counts = self.counts
        counts["num_drafts"] += sum(1 for s in sizes if s)
        counts["num_draft_tokens"] += sum(sizes)
        counts["num_accepted_tokens"] += sum(accepted)
        if self.metrics is not None:
            self.metrics.record_acceptance(sizes, sum(accepted), per_position)


def worker_stats(worker: Any) -> dict[str, Any]:
    """The proposer's counters in a vLLM worker: ``llm.collective_rpc(worker_stats)``."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    if not isinstance(drafter, SssdProposer):
        raise RuntimeError("this vLLM worker does not draft with SssdProposer")
    return drafter.stats()


def _percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``; 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 3)


def _tensor_parallel_rank() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank
    except ImportError:  # pragma: no cover - not inside vLLM
        return 0
    try:
        return int(get_tensor_model_parallel_rank())
    except (AssertionError, RuntimeError):  # no parallel state (a bare test)
        return 0


def _stores(req_state: Any) -> bool:
    """Whether a request (vLLM's cached request state) may be stored (``STORE_KEY``)."""
    return may_store(getattr(getattr(req_state, "sampling_params", None), "extra_args", None))
