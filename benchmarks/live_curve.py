"""Live cold start: tau per window of finished records as the datastore learns.

Replays each dev set from an empty live datastore (every finished record is
ingested before the next starts) and records tau over each window of records,
for the full method (``both``) and for the input trie alone (which learns
nothing across records). Writes live_curve.jsonl and a plot, and prints a
Markdown table.

    python benchmarks/live_curve.py --data-dir ../shared/data --out benchmarks/results \
        --plot docs/live_curve.png
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.run_all import DEV_SETS

WINDOW = 50


def run(data: Path, budget: int) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "benchmarks.bench_cli", "replay", "--json", "--live",
           "--no-pld", "--sources", "input", "--sources", "both", "--budget", str(budget),
           "--curve", str(WINDOW), "--data", str(data)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DEV_SETS), figsize=(5 * len(DEV_SETS), 3.6), sharey=False)
    for ax, name in zip(axes, DEV_SETS, strict=True):
        for row in rows:
            if row["data"] == name:
                xs = [n for n, _ in row["tau_curve"]]
                ys = [t for _, t in row["tau_curve"]]
                ax.plot(xs, ys, marker="o", label=row["method"])
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("records finished")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"tau over the last {WINDOW} records")
    axes[0].legend()
    fig.suptitle("Live cold start (budget 16): the datastore learns from finished generations")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plot", type=Path, required=True)
    parser.add_argument("--budget", type=int, default=16)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name in DEV_SETS:
        rows += run(args.data_dir / "dev" / f"{name}.jsonl.gz", args.budget)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "live_curve.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot(rows, args.plot)
    for name in DEV_SETS:
        both = next(r for r in rows if r["data"] == name and r["method"] == "both")
        alone = next(r for r in rows if r["data"] == name and r["method"] == "input")
        print(f"\n{name} (budget {args.budget}; tau over each window of {WINDOW} records)\n")
        print("| records | input only | live datastore + input | gain |")
        print("|---|---|---|---|")
        for (n, t_in), (_, t_both) in zip(alone["tau_curve"], both["tau_curve"], strict=True):
            print(f"| {n} | {t_in:.3f} | {t_both:.3f} | {t_both / t_in - 1:+.1%} |")


if __name__ == "__main__":
    main()
