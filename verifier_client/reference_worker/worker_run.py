"""What ``drafter-worker`` runs once its arguments are parsed: the prompts, the model, the
drafter client, the decode loop and the JSON summary (worker_cli.py parses without torch)."""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from verifier_client.acceptance_metrics import WorkerMetrics
from verifier_client.budget import BudgetRule
from verifier_client.client import DrafterClient
from verifier_client.prompts import read_prompts
from verifier_client.reference_worker.decode_loop import (
    DecodeWorker,
    Generation,
    GenerationRequest,
    SamplingParams,
)
from verifier_client.reference_worker.target_models import (
    DTYPES,
    load_model,
    on_device,
    tiny_model,
)

__all__ = ["make_model", "run", "summary"]


def make_model(args: argparse.Namespace) -> PreTrainedModel:
    """The model the arguments name, on its device."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[args.dtype] if args.dtype else None
    if args.tiny:
        model = tiny_model(args.tiny, vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                           num_layers=args.layers, init_std=args.init_std, seed=args.model_seed,
                           dtype=dtype or torch.float32)  # fmt: skip
    else:
        model = load_model(args.model, dtype=dtype)
    return on_device(model, device)


def eos_ids(model: PreTrainedModel, given: Sequence[int] | None) -> list[int]:
    if given is not None:
        return list(given)
    eos = getattr(model.generation_config, "eos_token_id", None) or model.config.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def summary(worker: DecodeWorker, wall_s: float, client: DrafterClient | None) -> dict[str, Any]:
    """The run's numbers: throughput, acceptance, fallbacks, time per step and phase."""
    s = worker.stats
    t = s.timings
    steps = max(s.steps, 1)
    out: dict[str, Any] = {
        "steps": s.steps, "request_steps": s.request_steps, "output_tokens": s.output_tokens,
        "tokens_per_s": round(s.output_tokens / wall_s, 2) if wall_s > 0 else None,
        # tau: committed tokens per request per step (1.0 = no speculation)
        "tokens_per_request_step": round(s.output_tokens / max(s.request_steps, 1), 4),
        # vLLM's mean acceptance length: tokens per verified draft, bonus included
        "mean_acceptance_length": round(1 + s.accepted_tokens / s.drafts, 4) if s.drafts else None,
        "drafts": s.drafts, "draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
        "fallbacks": dict(s.fallbacks), "fallback_steps": sum(s.fallbacks.values()),
        "rejected_trees": s.rejected_trees,
        **{f"{phase}_ms_per_step": round(1e3 * getattr(t, f"{phase}_s") / steps, 3)
           for phase in ("draft", "pack", "forward", "verify", "kv")},
        "prefill_s": round(t.prefill_s, 3),
        # packing + verification as a share of the forward pass
        "verify_overhead": round((t.pack_s + t.verify_s) / t.forward_s, 4) if t.forward_s else None,
        "wall_s": round(wall_s, 3),
    }  # fmt: skip
    if client is not None:
        out["resyncs"] = client.stats.resyncs
    return out


def run(args: argparse.Namespace) -> int:
    """Decodes the prompts the arguments name; prints the summary line."""
    model = make_model(args)
    vocab_size = int(model.config.vocab_size)
    prompts = read_prompts(args.prompts, vocab_size=vocab_size, limit=args.limit)
    budget = BudgetRule.parse(args.budget)
    metrics = WorkerMetrics()
    server = metrics.serve(args.metrics_port) if args.metrics_port is not None else None
    client = None
    if args.drafter:
        client = DrafterClient(args.drafter, deadline_ms=args.deadline_ms, mode=args.mode,
                               budget=budget)  # fmt: skip
        client.wait_ready()
    eos = eos_ids(model, args.eos)
    worker = DecodeWorker(model, client, max_batch=args.batch, eos_token_ids=eos,
                          metrics=metrics, budget=budget)  # fmt: skip
    sampling = functools.partial(SamplingParams, args.temperature, args.top_k, args.top_p)
    start = time.perf_counter()
    generations: list[Generation] = []
    try:
        for round_ in itertools.count() if args.rounds == 0 else range(args.rounds):
            suffix = f"#{round_}" if round_ else ""  # ids stay unique across rounds
            generations += worker.run(
                GenerationRequest(request_id + suffix, prompt_ids, args.max_new_tokens,
                                  sampling(seed=args.seed + i))
                for i, (request_id, prompt_ids) in enumerate(prompts)
            )
    finally:
        if client is not None:
            client.close()
    wall_s = time.perf_counter() - start
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            for g in generations:
                f.write(json.dumps({"id": g.request_id, "output_ids": g.output_ids,
                                    "finish_reason": g.finish_reason}) + "\n")  # fmt: skip
    print(json.dumps({"requests": len(generations), **summary(worker, wall_s, client)}))
    if server is not None:
        server.shutdown()
    return 0

