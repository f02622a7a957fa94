"""The parts of a batch-64 service step, measured back to back on this machine.

Runs, interleaved for ``--rounds`` rounds (this machine's timings drift between
runs, so the parts are compared within a round):

* ``null_floor``: ``drafter_bench/grpc_floor.py``, the real client against a null
  DrafterService (empty trees, no state): what gRPC, protobuf and the client
  cost per step before any drafting;
* ``native_batch``: ``drafter-bench replay --batch 64``, one native call drafting
  64 trees (the 6.4M-token corpus, budget 16), with 1 and 2 threads, no gRPC
  and no Python around it;
* ``service``: ``drafter-bench load``, the real service end to end.

A service step does all the floor's work and all of the native call's, one
after the other (the drafts need the step's tokens; the answer needs the
drafts), so their sum bounds the step from below. Prints one JSON line per run.

    python drafter_bench/load_bound.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHAT = "dev/chat_alpacaeval_llama3_8b.jsonl.gz"
CORPUS = "corpus/datastore_llama3_family.jsonl.gz"


def _json_lines(cmd: list[str]) -> list[dict[str, object]]:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    data, corpus = str(args.data_dir / CHAT), str(args.data_dir / CORPUS)
    bench = [sys.executable, "-m", "drafter_bench.bench_cli"]
    batch = ["--batch", str(args.batch)]
    for round_ in range(args.rounds):
        parts: list[tuple[str, list[str]]] = [
            ("null_floor", [sys.executable, str(Path(__file__).with_name("grpc_floor.py")),
                            "--data", data, *batch]),
            *[("native_batch", [*bench, "replay", "--json", "--data", data, "--corpus", corpus,
                                "--budget", "16", "--sources", "both", "--no-pld", *batch,
                                "--threads", threads]) for threads in ("2", "1")],
            ("service", [*bench, "load", "--json", "--data", data, "--corpus", corpus, *batch]),
        ]  # fmt: skip
        for part, cmd in parts:
            for result in _json_lines(cmd):
                print(json.dumps({"part": part, "round": round_, **result}), flush=True)


if __name__ == "__main__":
    main()
