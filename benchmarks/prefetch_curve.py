"""Pre-drafting hit rate vs fan-out on the dev sets (issue 13): runs, table and plot.

Replays each dev set in corpus and live mode, budgets 16 and 32, with
``--prefetch 1,2,4,8`` (``drafter-bench replay``), writes one JSON line per run
(the replay's report plus the ``command`` that made it), prints the Markdown table
of docs/benchmarks.md and plots the hit rate against the fan-out::

    python -m benchmarks.prefetch_curve --data-dir ../shared/data \\
        --out benchmarks/results/prefetch.jsonl --plot docs/prefetch_hit_rate.png

``--no-run`` only reads ``--out`` again (table and plot).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.report import fmt, markdown_table
from benchmarks.run_all import CORPUS, DEV_SETS

FAN_OUTS = "1,2,4,8"
BUDGETS = (16, 32)
MODES = ("corpus", "live")
Row = dict[str, Any]


def replay_args(data_dir: Path, name: str, mode: str, limit: int | None) -> list[str]:
    """``drafter-bench replay`` arguments of one dev set and mode (both budgets)."""
    source = ["--corpus", str(data_dir / CORPUS)] if mode == "corpus" else ["--live"]
    budgets = [arg for b in BUDGETS for arg in ("--budget", str(b))]
    cap = ["--limit", str(limit)] if limit else []
    return ["replay", "--json", "--no-pld", "--data", str(data_dir / "dev" / f"{name}.jsonl.gz"),
            *source, *budgets, "--prefetch", FAN_OUTS, *cap]  # fmt: skip


def run_all(data_dir: Path, limit: int | None) -> list[Row]:
    rows: list[Row] = []
    for name in DEV_SETS:
        for mode in MODES:
            args = replay_args(data_dir, name, mode, limit)
            command = shlex.join(["drafter-bench", *args])
            print("+", command, file=sys.stderr, flush=True)
            cmd = [sys.executable, "-m", "benchmarks.bench_cli", *args]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows += [{**json.loads(line), "command": command}
                     for line in out.splitlines() if line.startswith("{")]  # fmt: skip
    return rows


def per_fan_out(row: Row, key: str) -> list[float]:
    return [f[key] for f in row["prefetch"]["per_fan_out"]]


def table(rows: list[Row]) -> str:
    """Hit rate per fan-out, the bounds at fan-out 8, the pre-draft's quality and cost."""
    header = ["dev set", "mode", "budget", "τ", "hit @1", "@2", "@4", "@8",
              "bonus known", "stop in top 8", "bonus in top 8", "accepted pre / plain @8",
              "same tree @8", "native µs @1 / @8", "nodes @8"]  # fmt: skip
    lines = []
    for r in rows:
        p = r["prefetch"]
        big = p["per_fan_out"][-1]
        accepted = f"{fmt(big['predraft_accepted_mean'], 2)} / {fmt(big['plain_accepted_mean'], 2)}"
        native_us = [fmt(f["native_us_per_request_step"], 0) for f in p["per_fan_out"]]
        lines.append([r["data"], r["mode"], r["budget"], fmt(r["tau"]),
                      *(fmt(h) for h in per_fan_out(r, "hit_rate")),
                      fmt(p["bonus_known_rate"]), fmt(big["stop_in_top_rate"]),
                      fmt(big["bonus_in_top_rate"]), accepted, fmt(big["same_tree_rate"]),
                      f"{native_us[0]} / {native_us[-1]}",
                      fmt(big["nodes_per_request_step"], 0)])  # fmt: skip
    return markdown_table(header, lines)


def plot(rows: list[Row], path: Path) -> None:
    """Hit rate vs fan-out: colour = dev set, marker = mode, line style = budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = dict(zip(DEV_SETS, ("tab:blue", "tab:orange", "tab:green"), strict=True))
    markers = dict(zip(MODES, ("o", "s"), strict=True))
    styles = dict(zip(BUDGETS, ("-", "--"), strict=True))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for r in rows:
        fan_outs = per_fan_out(r, "fan_out")
        ax.plot(fan_outs, per_fan_out(r, "hit_rate"), color=colours[r["data"]],
                marker=markers[r["mode"]], linestyle=styles[r["budget"]],
                label=f"{r['data']}, {r['mode']}, budget {r['budget']}")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    ax.set_xlabel("fan-out (pre-drafts per request and step)")
    ax.set_ylabel("hit rate (steps with an outcome)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("Pre-drafting: the observed outcome among the pre-drafted ones", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per run")
    parser.add_argument("--plot", type=Path, required=True, help="PNG to write")
    parser.add_argument("--limit", type=int, help="replay only the first N records of each set")
    parser.add_argument("--no-run", action="store_true", help="only read --out again")
    args = parser.parse_args()
    if not args.no_run:
        rows = run_all(args.data_dir, args.limit)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    plot(rows, args.plot)
    print(table(rows))


if __name__ == "__main__":
    main()
