"""Renders benchmarks/results/*.jsonl as the Markdown tables of docs/benchmarks.md.

    python benchmarks/report.py benchmarks/results
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

Row = dict[str, Any]

# SSSD reference implementation, same greedy replay (from the issue): (set, mode, budget) -> tau.
REFERENCE = {
    ("chat_alpacaeval_llama3_8b", "corpus", 16): 1.804,
    ("chat_alpacaeval_llama3_8b", "corpus", 32): 1.897,
    ("chat_alpacaeval_llama3_8b", "live", 16): 1.526,
    ("chat_alpacaeval_llama3_8b", "live", 32): 1.570,
    ("multilingual_mtbench_suzume", "corpus", 16): 1.825,
    ("multilingual_mtbench_suzume", "corpus", 32): 1.870,
    ("multilingual_mtbench_suzume", "live", 16): 2.025,
    ("multilingual_mtbench_suzume", "live", 32): 2.116,
    ("code_humaneval_llama31_8b", "corpus", 16): 2.126,
    ("code_humaneval_llama31_8b", "corpus", 32): 2.246,
    ("code_humaneval_llama31_8b", "live", 16): 2.513,
    ("code_humaneval_llama31_8b", "live", 32): 2.670,
}
METHODS = ("pld", "input", "datastore", "both")


def load(path: Path) -> list[Row]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def acceptance_table(rows: list[Row]) -> str:
    by_key = {(r["data"], r["mode"], r["budget"], r["method"]): r for r in rows}
    out = [
        "| dev set | mode | budget | PLD | input | datastore | both | SSSD ref. | both vs ref. |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for data, mode, budget in sorted({(r["data"], r["mode"], r["budget"]) for r in rows}):
        taus = [by_key.get((data, mode, budget, m), {}).get("tau") for m in METHODS]
        ref = REFERENCE.get((data, mode, budget))
        both = taus[3]
        gain = "—" if ref is None or both is None else f"{(both / ref - 1) * 100:+.1f}%"
        out.append(f"| {data} | {mode} | {budget} | " + " | ".join(fmt(t) for t in taus)
                   + f" | {fmt(ref)} | {gain} |")
    return "\n".join(out)


def latency_table(rows: list[Row]) -> str:
    out = [
        "| dev set | mode | budget | method | draft µs p50 | draft µs p99 |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["method"] in ("input", "datastore", "both") and r.get("draft_us_p50") is not None:
            out.append(f"| {r['data']} | {r['mode']} | {r['budget']} | {r['method']} | "
                       f"{fmt(r['draft_us_p50'], 1)} | {fmt(r['draft_us_p99'], 1)} |")
    return "\n".join(out)


def batch_table(rows: list[Row]) -> str:
    out = [
        "| dev set | budget | threads | batch | step ms p50 | step ms p99 | tau |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {r['data']} | {r['budget']} | {r['threads']} | {r['batch']} | "
                   f"{fmt(r['batch_ms_p50'])} | {fmt(r['batch_ms_p99'])} | {fmt(r['tau'])} |")
    return "\n".join(out)


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
