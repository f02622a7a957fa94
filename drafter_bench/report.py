"""Renders benchmarks/results/*.jsonl as the Markdown tables of docs/benchmarks.md.

    python drafter_bench/report.py benchmarks/results
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

Row = dict[str, Any]

# SSSD reference implementation, same greedy replay (from the issue): (set, mode, budget) -> tau,
# written as one row of taus per dev set, in the order of _REFERENCE_COLUMNS.
_REFERENCE_COLUMNS = (("corpus", 16), ("corpus", 32), ("live", 16), ("live", 32))
REFERENCE = {
    (data, mode, budget): tau
    for data, taus in {
        "chat_alpacaeval_llama3_8b": (1.804, 1.897, 1.526, 1.570),
        "multilingual_mtbench_suzume": (1.825, 1.870, 2.025, 2.116),
        "code_humaneval_llama31_8b": (2.126, 2.246, 2.513, 2.670),
    }.items()
    for (mode, budget), tau in zip(_REFERENCE_COLUMNS, taus, strict=True)
}
METHODS = ("pld", "input", "datastore", "both")
PLD_TO_BOTH = ("PLD", "input", "datastore", "both")  # the column titles of METHODS


def load(path: Path) -> list[Row]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def markdown_table(header: Sequence[str], lines: Iterable[Sequence[object]]) -> str:
    """A Markdown table: the header row, its rule, then one row per item of ``lines``."""
    rule = "|" + "---|" * len(header)
    body = ["| " + " | ".join(map(str, row)) + " |" for row in [header, *lines]]
    return "\n".join([body[0], rule, *body[1:]])


def acceptance_table(rows: list[Row]) -> str:
    by_key = {(r["data"], r["mode"], r["budget"], r["method"]): r for r in rows}
    lines = []
    for data, mode, budget in sorted({(r["data"], r["mode"], r["budget"]) for r in rows}):
        taus = [by_key.get((data, mode, budget, m), {}).get("tau") for m in METHODS]
        ref = REFERENCE.get((data, mode, budget))
        both = taus[3]
        gain = "—" if ref is None or both is None else f"{(both / ref - 1) * 100:+.1f}%"
        lines.append([data, mode, budget, *(fmt(t) for t in taus), fmt(ref), gain])
    header = ["dev set", "mode", "budget", *PLD_TO_BOTH, "SSSD ref.", "both vs ref."]
    return markdown_table(header, lines)


def latency_table(rows: list[Row]) -> str:
    header = ["dev set", "mode", "budget", "method", "draft µs p50", "draft µs p99"]
    lines = []
    for r in rows:
        if r["method"] in ("input", "datastore", "both") and r.get("draft_us_p50") is not None:
            p50, p99 = fmt(r["draft_us_p50"], 1), fmt(r["draft_us_p99"], 1)
            lines.append([r["data"], r["mode"], r["budget"], r["method"], p50, p99])
    return markdown_table(header, lines)


def batch_table(rows: list[Row]) -> str:
    header = ["dev set", "budget", "threads", "batch", "step ms p50", "step ms p99", "tau"]
    lines = []
    for r in rows:
        p50, p99 = fmt(r["batch_ms_p50"]), fmt(r["batch_ms_p99"])
        lines.append([r["data"], r["budget"], r["threads"], r["batch"], p50, p99, fmt(r["tau"])])
    return markdown_table(header, lines)


def main() -> None:
    results = Path(sys.argv[1])
    replay = load(results / "replay.jsonl")
    print("### Acceptance (τ = output tokens / steps)\n")
    print(acceptance_table(replay))
    print("\n### Per-request drafting latency (batch 1, one thread)\n")
    print(latency_table(replay))
    if (results / "batch.jsonl").exists():
        print("\n### Batch step time (one native call for 64 requests)\n")
        print(batch_table(load(results / "batch.jsonl")))


if __name__ == "__main__":
    main()
