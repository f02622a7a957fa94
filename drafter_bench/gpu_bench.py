"""``drafter-bench gpu``: decoding speed with and without drafts on one host, by batch size.

A real ``drafter serve`` (started here on loopback, its drafting threads on this host's
cores, seeded with ``--corpus`` if given) and the reference decode worker
(``verifier_client.reference_worker``) with a model of a real architecture built from its
configuration with random weights (``--model llama-3.1-8b``, bf16, on CUDA) or a tiny one
(``--model tiny``, for CPU runs and the test suite). Real KV caches, tree attention masks,
forward passes and acceptance walks.

**Acceptance is teacher-forced.** Random weights emit garbage, so the recorded output of
each dev record decides which drafted tokens the target accepts, exactly as ``replay``
does; every forward pass is still the real model's real work over the real trees. Rows
say ``"teacher_forced": true``.

Rows (JSON lines, on stdout and in ``--out``):

- ``decode``: per batch size and mode (``none``: plain decoding; ``tree``: trees sized by
  the budget rule; ``chain``: the best chain of at most ``chain`` tokens of a tree of
  ``max(16, 2 * chain)`` nodes): tokens/s, step time p50/p99, tau (tokens per request per
  step), the drafter round trip p50/p99 (it is on the step's critical path) and its share
  of the step;
- ``verify_cost``: the forward pass's time against the draft nodes per request at each
  batch size (chains of random tokens), and its ratio to a plain step;
- ``ridge``: per batch size, the most tree tokens per request whose forward pass stays
  within 10 % of a plain step, against the budget rule's ``floor(I / batch)``;
- ``never_slower``: per batch size, tokens/s with trees over tokens/s without.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import zip_longest
from pathlib import Path
from typing import Any

import numpy as np

from drafter_bench.load import write_corpus_snapshot
from drafter_bench.token_records import LLAMA3_VOCAB_SIZE, Record, read_records
from drafter_bench.worker_bench import drafter_for
from verifier_client.results import Outcome, StepResult, Tree

# torch and the worker are imported when the subcommand runs (see worker_bench).

TINY = "tiny"
MODELS = (TINY, "llama-3.1-8b")
TOLERANCE = 1.10  # a forward pass this much slower than a plain step is past the ridge


def _ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers, got {text!r}")
    return values


def add_gpu_parser(subparsers: Any) -> None:
    """Registers ``gpu`` (decode speed with and without drafts, by batch size)."""
    p = subparsers.add_parser(
        "gpu",
        help="decode tokens/s with and without drafts by batch size (teacher-forced)",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
    )
    p.add_argument(
        "--data",
        required=True,
        action="append",
        metavar="FILE",
        help="dev records (.jsonl[.gz]); repeatable, their records interleaved",
    )
    p.add_argument("--corpus", metavar="FILE", help="seed the drafter's datastore (records)")
    p.add_argument("--snapshot", metavar="DIR",
                   help="seed it from this snapshot instead (e.g. datastore-builder build)")
    p.add_argument(
        "--model",
        choices=MODELS,
        default=None,
        help="llama-3.1-8b (default on CUDA) or tiny (default otherwise)",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument(
        "--batch",
        type=_ints,
        default=[1, 4, 16, 64, 128, 256],
        help="batch sizes (default 1,4,16,64,128,256)",
    )
    p.add_argument("--chains", type=_ints, default=[4, 8, 16], help="chain lengths (4,8,16)")
    p.add_argument(
        "--nodes",
        type=_ints,
        default=[1, 2, 4, 8, 16, 32, 64],
        help="tree tokens per request for the cost curve (root included)",
    )
    p.add_argument("--steps", type=int, default=16, help="measured steps per row (16)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured first steps (2)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=256,
        help="per request; records with shorter outputs are skipped (256)",
    )
    p.add_argument("--max-prompt-tokens", type=int, default=0,
                   help="keep each prompt's last N tokens (0: whole prompts)")
    p.add_argument("--budget", default=None,
                   help="budget rule (GPU profile, N, FLOPS/BW; default: from the device name "
                        "on CUDA, 16 otherwise)")  # fmt: skip
    p.add_argument("--deadline-ms", type=float, default=3.0, help="drafting deadline per step")
    p.add_argument(
        "--draft-threads",
        type=int,
        default=None,
        help="drafter serve's drafting threads (default: its own, one per CPU)",
    )
    p.add_argument("--vocab-size", type=int, default=LLAMA3_VOCAB_SIZE)
    p.add_argument("--out", type=Path, metavar="FILE", help="append the JSON lines here too")
    p.set_defaults(func=run_gpu_bench)


def budget_spec(device_name: str) -> str:
    """The budget profile for a CUDA device's name (``NVIDIA H200`` -> ``h200``)."""
    name = device_name.lower()
    return "h200" if "h200" in name else "h100" if "h100" in name else "16"


def run_gpu_bench(args: argparse.Namespace) -> int:
    """Runs every row the arguments ask for; prints them as JSON lines."""
    import torch

    from drafter_bench.architecture_models import architecture_model
    from verifier_client.reference_worker.target_models import DTYPES, tiny_model

    for name in ("steps", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    model_name = args.model or ("llama-3.1-8b" if cuda else TINY)
    dtype_name = args.dtype or ("bfloat16" if cuda else "float32")
    if dtype_name not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype_name!r}")
    dtype = DTYPES[dtype_name]
    device_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    args.budget = args.budget or budget_spec(device_name)
    if args.corpus and args.snapshot:
        raise ValueError("--corpus and --snapshot both seed the drafter: give one")
    records = _records(args.data, args.vocab_size, args.max_new_tokens)
    if model_name == TINY:
        model = tiny_model("llama", vocab_size=args.vocab_size, dtype=dtype).to(device)
    else:
        model = architecture_model(model_name, device=device, dtype=dtype)
    common = {"bench": "gpu", "model": model_name, "device": device_name, "dtype": dtype_name,
              "teacher_forced": True, "budget_rule": args.budget,
              "data": [Path(d).name for d in args.data]}  # fmt: skip
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        row = {**common, **row}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")

    if args.corpus:
        import tempfile

        snapshot = Path(tempfile.mkdtemp(prefix="drafter-bench-gpu-")) / "corpus"
        args.snapshot = write_corpus_snapshot(args.corpus, args.vocab_size, snapshot)
    # Batch by batch, smallest first, each with its cost curve: a run cut short by a time
    # limit keeps whole batch sizes.
    with drafter_for(_serve_args(args), "drafter-bench-gpu-") as target:
        for batch in args.batch:
            plain = _decode(model, records, batch, args, target, "none", None)
            emit(plain)
            tree = _decode(model, records, batch, args, target, "tree", None)
            emit(tree)
            for chain in args.chains:
                emit(_decode(model, records, batch, args, target, "chain", chain))
            ratio = _ratio(tree["tokens_per_s"], plain["tokens_per_s"])
            emit({"kind": "never_slower", "batch": batch, "tree_over_plain": ratio})
            costs = [_verify_cost(model, records, batch, nodes, args) for nodes in args.nodes]
            base = costs[0]["forward_ms"] if args.nodes[0] == 1 else None
            for row in costs:
                row["over_plain"] = _ratio(row["forward_ms"], base)
                emit(row)
            emit(_ridge(batch, costs, base, args.budget))
    return 0


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def _records(paths: Sequence[str], vocab_size: int, min_output: int) -> list[Record]:
    """The records of every file, taken in turn, with at least ``min_output`` output tokens."""
    per_file = [
        [r for r in read_records(p, vocab_size=vocab_size) if len(r.output_ids) >= min_output]
        for p in paths
    ]
    records = [r for group in zip_longest(*per_file) for r in group if r is not None]
    if not records:
        raise ValueError(
            f"no record of {', '.join(paths)} has {min_output}+ output tokens (--max-new-tokens)"
        )
    return records


def _serve_args(args: argparse.Namespace) -> argparse.Namespace:
    extra = [] if args.draft_threads is None else ["--draft-threads", str(args.draft_threads)]
    return argparse.Namespace(target=None, snapshot=args.snapshot, vocab_size=args.vocab_size,
                              serve_args=extra)  # fmt: skip


class _Unstored:
    """A drafter client whose finished requests are not stored: the dev outputs must not
    teach the drafter what later rows decode."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def add_request(self, request_id: str, prompt_ids: Iterable[int]) -> None:
        self.client.add_request(request_id, prompt_ids)

    def step(self, commits: Mapping[str, Iterable[int]]) -> Any:
        return self.client.step(commits)

    def finish(self, request_id: str, *, tail: Iterable[int] = ()) -> bool:
        return bool(self.client.finish(request_id, tail=tail, store=False))


PHASES = ("draft_s", "pack_s", "forward_s", "verify_s", "kv_s")
"""The worker's per-phase timings (``StepTimings``) that each measured step records."""


def _measure(worker: Any, warmup: int, steps: int) -> list[dict[str, float]]:
    """Runs ``warmup`` then ``steps`` steps (fewer if the batch runs out); per measured
    step its wall seconds (``step_s``), each phase's seconds and the tokens and
    request-steps it added, from the worker's own counters."""
    stats, timings = worker.stats, worker.stats.timings
    measured = []
    for i in range(warmup + steps):
        if worker.idle:
            break
        before = {name: getattr(timings, name) for name in PHASES}
        tokens, request_steps = stats.output_tokens, stats.request_steps
        start = time.perf_counter()
        worker.step()  # ends device-synchronized (the worker's clock)
        if i >= warmup:
            row = {name: getattr(timings, name) - before[name] for name in PHASES}
            row.update(step_s=time.perf_counter() - start,
                       tokens=stats.output_tokens - tokens,
                       request_steps=stats.request_steps - request_steps)  # fmt: skip
            measured.append(row)
    return measured


def _requests(records: Sequence[Record], batch: int, args: argparse.Namespace,
              tag: str) -> list[Any]:  # fmt: skip
    from verifier_client.reference_worker.decode_loop import GenerationRequest

    chosen = [records[i % len(records)] for i in range(batch)]
    cut = -args.max_prompt_tokens if args.max_prompt_tokens > 0 else 0
    return [GenerationRequest(f"{tag}-{i}-{r.id}", r.prompt_ids[cut:].tolist(), args.max_new_tokens,
                              teacher_ids=r.output_ids[: args.max_new_tokens].tolist())
            for i, r in enumerate(chosen)]  # fmt: skip


def _decode(model: Any, records: Sequence[Record], batch: int, args: argparse.Namespace,
            target: str, mode: str, chain: int | None) -> dict[str, Any]:  # fmt: skip
    """One ``decode`` row: ``batch`` requests decoded together for warmup + steps steps."""
    from verifier_client import BudgetRule, DrafterClient
    from verifier_client.reference_worker.decode_loop import DecodeWorker

    rule = BudgetRule.parse(args.budget) if chain is None else BudgetRule.fixed(max(16, 2 * chain))
    client = source = None
    if mode != "none":
        client = DrafterClient(target, deadline_ms=args.deadline_ms, budget=rule)
        client.wait_ready(timeout_s=60)
        source = _Unstored(client)
    tag = f"b{batch}-{mode}{chain or ''}"
    try:
        worker = DecodeWorker(model, source, max_batch=batch, budget=rule, chain=chain)
        for request in _requests(records, batch, args, tag):
            worker.submit(request)
        steps = _measure(worker, args.warmup, args.steps)
    finally:
        if client is not None:
            client.close(timeout_s=10)
    step_s = [r["step_s"] for r in steps]
    trips = [r["draft_s"] for r in steps] if source is not None else []
    tokens, request_steps = sum(r["tokens"] for r in steps), sum(r["request_steps"] for r in steps)
    measured = sum(step_s)
    return {
        "kind": "decode", "mode": mode, "chain": chain, "batch": batch,
        "draft_budget": rule.draft_budget(batch) if mode != "none" else 0,
        "steps": len(steps), "tokens": tokens,
        "tokens_per_s": round(tokens / measured, 2) if measured else None,
        "tau": round(tokens / request_steps, 4) if request_steps else None,
        "step_ms_p50": _ms(step_s, 0.5), "step_ms_p99": _ms(step_s, 0.99),
        "forward_ms_p50": _ms([r["forward_s"] for r in steps], 0.5),
        **{f"{name[:-2]}_ms_mean": round(1e3 * sum(r[name] for r in steps) / len(steps), 3)
           if steps else None for name in ("pack_s", "verify_s", "kv_s")},
        "draft_ms_p50": _ms(trips, 0.5), "draft_ms_p99": _ms(trips, 0.99),
        "draft_share": round(sum(trips) / measured, 4) if trips and measured else None,
        "fallback_steps": sum(worker.stats.fallbacks.values()),
        "deadline_ms": args.deadline_ms if mode != "none" else None,
    }  # fmt: skip


def _verify_cost(model: Any, records: Sequence[Record], batch: int, nodes: int,
                 args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """The forward pass's time with ``nodes`` tree tokens per request (a chain of random
    draft tokens under the root), ``batch`` requests."""
    from verifier_client.reference_worker.decode_loop import DecodeWorker

    worker = DecodeWorker(model, _FixedChains(nodes - 1, args.vocab_size), max_batch=batch)
    for request in _requests(records, batch, args, f"cost-b{batch}-n{nodes}"):
        worker.submit(request)
    forward_s = [r["forward_s"] for r in _measure(worker, args.warmup, max(3, args.steps // 4))]
    return {"kind": "verify_cost", "batch": batch, "nodes": nodes,
            "forward_ms": _ms(forward_s, 0.5), "steps": len(forward_s)}  # fmt: skip


class _FixedChains:
    """A draft source that gives every request a chain of ``length`` random tokens."""

    def __init__(self, length: int, vocab_size: int) -> None:
        self._rng = np.random.default_rng(0)
        self._length, self._vocab = length, vocab_size
        self._step = 0

    def add_request(self, request_id: str, prompt_ids: Iterable[int]) -> None:
        pass

    def step(self, commits: Mapping[str, Iterable[int]]) -> StepResult:
        self._step += 1
        ids, n = tuple(commits), self._length
        drafts = {r: Tree.of(self._rng.integers(0, self._vocab, n).tolist(),
                             list(range(-1, n - 1)), [1.0] * n) for r in ids}  # fmt: skip
        return StepResult(self._step, Outcome.OK, ids, drafts, {})

    def finish(self, request_id: str, *, tail: Iterable[int] = ()) -> bool:
        return True


def _ridge(batch: int, costs: Sequence[dict[str, Any]], base: float | None,
           budget: str) -> dict[str, Any]:  # fmt: skip
    """The most tree tokens per request within ``TOLERANCE`` of a plain step, measured,
    against the budget rule's ``floor(I / batch)`` (I: the rule's ridge point)."""
    from verifier_client import BudgetRule

    limit = None if base is None else TOLERANCE * base
    within = [
        c["nodes"]
        for c in costs
        if limit is not None and c["forward_ms"] is not None and c["forward_ms"] <= limit
    ]
    rule = BudgetRule.parse(budget)
    return {"kind": "ridge", "batch": batch, "tolerance": TOLERANCE,
            "measured_tree_tokens": max(within) if within else None,
            "rule_tree_tokens": rule.draft_budget(batch) + 1,
            "rule_ridge_point": rule.ridge_point}  # fmt: skip


def _ms(seconds: Sequence[float], q: float) -> float | None:
    if not seconds:
        return None
    ordered = sorted(seconds)
    return round(1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)
