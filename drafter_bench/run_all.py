"""Runs the greedy-replay matrix behind docs/benchmarks.md and writes its JSON.

    python drafter_bench/run_all.py --data-dir ../shared/data --out benchmarks/results

Writes replay.jsonl (acceptance and per-request latency: every dev set, corpus
and live, budgets 8/16/32, PLD / input / datastore / both) and batch.jsonl
(batch-64 step time), then prints the Markdown tables (drafter_bench/report.py).
Every replay drafts with ``--node-score`` (default: the shipped learned score, what
``drafter serve`` drafts with) and the DraftConfig defaults, changed by ``--config``.
Takes about ten minutes on 2 cores. The hand-set SSSD fusion with the paper's
retrieval: ``--node-score hand --config datastore_max_continuation=16 --config
datastore_min_tree_nodes=50``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

DEV_SETS = (
    "chat_alpacaeval_llama3_8b",
    "multilingual_mtbench_suzume",
    "code_humaneval_llama31_8b",
)
CORPUS = "corpus/datastore_llama3_family.jsonl.gz"


def replay(args: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "drafter_bench.bench_cli", "replay", "--json", *args]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--node-score", default="default",
                        help="passed to every replay: default (shipped), hand, or a FILE")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a DraftConfig field, passed to every replay; repeatable")
    args = parser.parse_args()
    draft_args = ["--node-score", args.node_score]
    for pair in args.config:
        draft_args += ["--config", pair]
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = str(args.data_dir / CORPUS)
    budgets = ["--budget", "8", "--budget", "16", "--budget", "32"]
    methods = ["--sources", "input", "--sources", "datastore", "--sources", "both"]

    lines: list[str] = []
    for name in DEV_SETS:
        data = str(args.data_dir / "dev" / f"{name}.jsonl.gz")
        lines += replay(["--data", data, "--corpus", corpus, *budgets, *methods, *draft_args])
        lines += replay(["--data", data, "--live", *budgets, *methods, *draft_args])
    (args.out / "replay.jsonl").write_text("\n".join(lines) + "\n")

    batch: list[str] = []
    for name in DEV_SETS[:2]:  # enough records to keep 64 in flight
        data = str(args.data_dir / "dev" / f"{name}.jsonl.gz")
        for threads in ("1", "2"):
            batch += replay([
                "--data", data, "--corpus", corpus, "--budget", "16", "--budget", "32",
                "--sources", "both", "--no-pld", "--batch", "64", "--threads", threads, *draft_args,
            ])
    (args.out / "batch.jsonl").write_text("\n".join(batch) + "\n")

    subprocess.run([sys.executable, str(Path(__file__).with_name("report.py")), str(args.out)],
                   check=True)


if __name__ == "__main__":
    main()
