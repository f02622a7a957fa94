"""``drafter-bench engine``: a real serving engine with and without the plug-in, end to end.

Starts ``drafter serve`` (loopback, a temporary data directory; ``--snapshot`` seeds
it, ``--target`` uses a running one), then runs the engine in its own environment
(``--python``: vLLM's virtualenv, ``make setup-vllm``) through
``python -m verifier_client.engines.compare``: the same prompts greedy-decoded
without and with the plug-in, on a tiny random-weight Llama (or ``--model``). Prints
one JSON line: ``outputs_identical``, ``steps``, ``draft_tokens``,
``accepted_tokens``, ``tau``, ``step_ms_p50`` with and without the plug-in, and more.

The engine runs in a subprocess because it lives in another virtualenv: nothing of
it (or of the client) is imported here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from drafter_bench.token_records import LLAMA3_VOCAB_SIZE
from drafter_bench.worker_bench import drafter_for

ENGINE_PYTHON_ENV = "SSSD_ENGINE_PYTHON"
_DEFAULT_PYTHON = {"vllm": Path(".venv-vllm") / "bin" / "python"}


def add_engine_parser(subparsers: Any) -> None:
    """Registers ``engine`` (a serving engine with and without the plug-in)."""
    p = subparsers.add_parser(
        "engine",
        help="a real engine (vLLM) with and without the plug-in: identity, acceptance, step time",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--engine", choices=sorted(_DEFAULT_PYTHON), default="vllm",
                   help="engine (SGLang needs a GPU: see README, 'Use with SGLang')")  # fmt: skip
    p.add_argument("--python", metavar="PATH", help=f"the engine environment's python (default: "
                   f"${ENGINE_PYTHON_ENV}, else .venv-vllm/bin/python)")  # fmt: skip
    p.add_argument("--data", required=True, metavar="FILE", help="prompts (.jsonl[.gz] records)")
    p.add_argument("--limit", type=int, default=32, help="first N prompts (default 32)")
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-speculative-tokens", type=int, default=4, help="chain length (4)")
    p.add_argument("--deadline-ms", type=float, default=50.0, help="drafting deadline per step")
    p.add_argument("--budget", default="16", help="tree nodes the chain is chosen from (16)")
    p.add_argument("--model", metavar="DIR", help="checkpoint (default: a tiny random Llama)")
    p.add_argument("--snapshot", metavar="DIR", help="seed the live datastore with a snapshot")
    p.add_argument("--target", metavar="HOST:PORT", help="a running drafter (default: start one)")
    p.add_argument("--vocab-size", type=int, default=LLAMA3_VOCAB_SIZE)
    p.add_argument("--second-engine", action="store_true",
                   help="then a second engine on the same prompts and drafter (learned from the "
                   "first engine's finished generations)")
    p.add_argument("--vs-ngram", action="store_true",
                   help="also run vLLM's own n-gram proposer (prompt lookup n=1..4) on the prompts")
    p.add_argument("--json", action="store_true", help="one JSON line (the default prints a table)")
    p.set_defaults(func=run_engine_bench)


def run_engine_bench(args: argparse.Namespace) -> int:
    """Runs the comparison in the engine's environment and prints its report."""
    python = Path(args.python or os.environ.get(ENGINE_PYTHON_ENV) or _DEFAULT_PYTHON[args.engine])
    if not python.exists():
        raise ValueError(f"no engine environment at {python}: run `make setup-{args.engine}` "
                         f"or pass --python")  # fmt: skip
    for name in ("limit", "max_new_tokens", "num_speculative_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    with drafter_for(args, "drafter-bench-engine-") as target:
        cmd = [str(python), "-m", "verifier_client.engines.compare", "--engine", args.engine,
               "--drafter", target, "--prompts", str(args.data), "--limit", str(args.limit),
               "--max-prompt-tokens", str(args.max_prompt_tokens),
               "--max-new-tokens", str(args.max_new_tokens),
               "--num-speculative-tokens", str(args.num_speculative_tokens),
               "--deadline-ms", str(args.deadline_ms), "--budget", str(args.budget),
               "--json"]  # fmt: skip
        if args.model:
            cmd += ["--model", str(args.model)]
        if args.vs_ngram:
            cmd.append("--vs-ngram")
        if args.second_engine:
            cmd.append("--second-engine")
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        print(f"drafter-bench engine: the engine run failed (exit {done.returncode})",
              file=sys.stderr)  # fmt: skip
        return done.returncode or 1
    report: dict[str, Any] = {
        "data": Path(args.data).name, "budget": args.budget, "deadline_ms": args.deadline_ms,
        "snapshot": args.snapshot, **json.loads(lines[-1]),
    }  # fmt: skip
    if args.json:
        print(json.dumps(report), flush=True)
    else:
        for key, value in report.items():
            print(f"{key:24} {value}")
    return 0 if report.get("outputs_identical") else 1
