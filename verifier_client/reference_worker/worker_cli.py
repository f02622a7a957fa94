"""``drafter-worker``: the reference decode worker against a drafter, with a JSON summary.

Example (a tiny random Llama on the Llama-3 vocabulary, prompts from the dev data)::

    drafter-worker --tiny llama --prompts ../shared/data/dev/code_humaneval_llama31_8b.jsonl.gz \\
        --limit 8 --drafter 127.0.0.1:50051 --max-new-tokens 64 --metrics-port 9500 \\
        --deadline-ms 50

The default deadline (3 ms) suits a GPU step next to the drafter; this CPU model's steps
take ~200 ms, so 50 ms (README, "Verify drafts": pick it from the measured round trip).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from verifier_client.reference_worker.model_choices import DTYPE_NAMES, TINY_ARCHITECTURES

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="drafter-worker", description=__doc__.splitlines()[0])
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", metavar="DIR", help="local Hugging Face model directory")
    model.add_argument("--tiny", choices=TINY_ARCHITECTURES, help="built-in tiny random model")
    p.add_argument("--vocab-size", type=int, default=128256, help="tiny: vocabulary (Llama 3)")
    p.add_argument("--hidden-size", type=int, default=64, help="tiny: hidden size")
    p.add_argument("--layers", type=int, default=2, help="tiny: layers")
    p.add_argument("--init-std", type=float, default=0.02, help="tiny: weight init std")
    p.add_argument("--model-seed", type=int, default=0, help="tiny: weight seed")
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPE_NAMES),
        default=None,
        help="model dtype (default: float32 tiny, the checkpoint's otherwise)",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda when present)")
    p.add_argument(
        "--prompts",
        required=True,
        metavar="FILE",
        help="JSONL(.gz): lists of token ids or objects with prompt_ids",
    )
    p.add_argument("--limit", type=int, default=None, help="first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="max requests decoded together")
    p.add_argument(
        "--eos",
        type=int,
        action="append",
        metavar="ID",
        help="end-of-sequence id; repeatable (default: the model config's)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling: request i uses seed + i")
    p.add_argument("--drafter", metavar="HOST:PORT", help="drafter address (none: no drafts)")
    p.add_argument("--deadline-ms", type=float, default=3.0,
                   help="per-step drafting deadline; past it the step decodes without drafts "
                        "(default 3: a GPU step near the drafter; set it to 3-5x the measured "
                        "round-trip p99)")  # fmt: skip
    p.add_argument("--budget", default="h100", help="budget rule: GPU profile, N, FLOPS/BW")
    p.add_argument("--mode", choices=("stream", "unary"), default="stream")
    p.add_argument("--metrics-port", type=int, default=None, help="serve /metrics on this port")
    p.add_argument("--output", metavar="FILE", help="write generations as JSONL")
    p.add_argument("--rounds", type=int, default=1,
                   help="decode the prompts this many times (0 = until stopped: a steady "
                        "load for dashboards)")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``drafter-worker``."""
    args = build_parser().parse_args(argv)
    try:
        if args.rounds < 0:
            raise ValueError(f"--rounds must be >= 0, got {args.rounds}")
        # torch and the model code only once the arguments are good.
        try:
            from verifier_client.reference_worker.worker_run import run
        except ModuleNotFoundError as err:
            if (err.name or "").split(".")[0] in ("verifier_client", "sssd_drafter"):
                raise
            print(f"drafter-worker: needs the 'worker' extra; {err.name!r} is not installed: "
                  "pip install 'sssd-drafter[worker]' (or ./clients/python[worker])",
                  file=sys.stderr)  # fmt: skip
            return 2
        return run(args)
    except (ValueError, OSError) as err:
        print(f"drafter-worker: error: {err}", file=sys.stderr)
        return 2
