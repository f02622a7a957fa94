"""``drafter-bench worker``: the reference decode worker against a live drafter, end to end.

Starts ``drafter serve`` as a subprocess (loopback, a temporary data directory, an empty
live datastore or one seeded with ``--snapshot``), runs the reference worker
(``verifier_client.reference_worker.decode_loop``) with a tiny random model on the prompts of a
development file, and prints one JSON object: steps, tokens/s, the mean acceptance
length, fallbacks, and the verification overhead per step, packing + verification time
as a share of the forward pass.

With random weights the acceptance comes only from what the live datastore learns from
finished generations and from the model's own repetitions (the per-request input trie).
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from drafter_bench.redis_server import stop_process
from drafter_bench.token_records import LLAMA3_VOCAB_SIZE, read_records

# torch, transformers and the worker are imported when the subcommand runs: the other
# subcommands of drafter-bench must not need the decode side's dependencies.

_LISTENING = "drafter listening on "


def add_worker_parser(subparsers: Any) -> None:
    """Registers ``worker`` (the reference decode worker against a live drafter)."""
    p = subparsers.add_parser(
        "worker",
        help="reference decode worker + live drafter: verification overhead, acceptance",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--data", required=True, metavar="FILE", help="prompts (.jsonl[.gz] records)")
    p.add_argument("--limit", type=int, default=8, help="first N records (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="per request (default 64)")
    p.add_argument("--batch", type=int, default=8, help="requests decoded together (default 8)")
    p.add_argument("--snapshot", metavar="DIR", help="seed the live datastore with a snapshot")
    p.add_argument("--target", metavar="HOST:PORT", help="a running drafter (default: start one)")
    p.add_argument("--tiny", default="llama", help="tiny model: llama, qwen2, gpt-neox (llama)")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dtype", default="float32", help="float32, float64, bfloat16, float16")
    p.add_argument("--device", default=None, help="torch device (default: cuda when present)")
    p.add_argument("--deadline-ms", type=float, default=3.0, help="drafting deadline per step")
    p.add_argument("--budget", default="h100", help="budget rule (GPU profile, N, FLOPS/BW)")
    p.add_argument("--vocab-size", type=int, default=LLAMA3_VOCAB_SIZE)
    p.set_defaults(func=run_worker_bench)


def run_worker_bench(args: argparse.Namespace) -> int:
    """Runs the worker on the records' prompts and prints the JSON report."""
    import torch

    from verifier_client import BudgetRule, DrafterClient
    from verifier_client.reference_worker.decode_loop import DecodeWorker, GenerationRequest
    from verifier_client.reference_worker.target_models import DTYPES, on_device, tiny_model
    from verifier_client.reference_worker.worker_run import summary

    if args.dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    for name in ("limit", "max_new_tokens", "batch"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    records = read_records(args.data, vocab_size=args.vocab_size, limit=args.limit)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = tiny_model(args.tiny, vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                       num_layers=args.layers, dtype=DTYPES[args.dtype])  # fmt: skip
    model = on_device(model, device)
    budget = BudgetRule.parse(args.budget)
    requests = [GenerationRequest(r.id, r.prompt_ids.tolist(), args.max_new_tokens)
                for r in records]  # fmt: skip
    with drafter_for(args, "drafter-bench-worker-") as target:
        client = DrafterClient(target, deadline_ms=args.deadline_ms, budget=budget)
        try:
            client.wait_ready(timeout_s=30)
            worker = DecodeWorker(model, client, max_batch=args.batch, budget=budget)
            start = time.perf_counter()
            worker.run(requests)
            wall_s = time.perf_counter() - start
            client.flush(timeout_s=10)
        finally:
            client.close(timeout_s=5)
    report = {
        "data": Path(args.data).name, "model": f"tiny-{args.tiny}", "device": str(device),
        "dtype": args.dtype, "records": len(records), "batch": args.batch,
        "max_new_tokens": args.max_new_tokens, "deadline_ms": args.deadline_ms,
        "budget": args.budget, "snapshot": args.snapshot,
        **summary(worker, wall_s, client),
    }  # fmt: skip
    print(json.dumps(report), flush=True)
    return 0


@contextmanager
def drafter_for(args: argparse.Namespace, prefix: str) -> Iterator[str]:
    """The drafter's address: ``args.target``, or a ``drafter serve`` started for the run
    (``args.vocab_size``, seeded with ``args.snapshot`` if set, with ``args.serve_args``
    if any)."""
    if args.target:
        yield args.target
        return
    exe = Path(sys.executable).with_name("drafter")
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        cmd = [str(exe), "serve", "--host", "127.0.0.1", "--port", "0",
               "--data-dir", str(Path(tmp) / "data"), "--vocab-size", str(args.vocab_size),
               "--metrics-port", "-1", "--admin-port", "-1",
               # learn from every finished generation at once (the run is short)
               "--rebuild-min-tokens", "1"]  # fmt: skip
        if args.snapshot:
            cmd += ["--snapshot", str(args.snapshot)]
        cmd += getattr(args, "serve_args", [])
        log_path = Path(tmp) / "drafter.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
            try:
                yield _address(proc, log_path)
            finally:
                stop_process(proc, timeout_s=20)


def _address(proc: subprocess.Popen[str], log: Path, timeout_s: float = 60.0) -> str:
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=timeout_s)
    except queue.Empty:
        line = ""
    if not line.startswith(_LISTENING):
        raise RuntimeError(f"drafter serve did not start: {line!r}; log:\n{log.read_text()}")
    return line.removeprefix(_LISTENING).strip()
