"""Live cold start: tau per window of finished records as the datastore learns.

Replays each dev set from an empty live datastore (every finished record is
ingested before the next starts) and records tau over each window of records,
for the full method (``both``) with the hand-set fusion and with the learned node score
shipped in the package, and for the input trie alone (which learns nothing across
records); the SSSD reference's whole-set live tau is marked on each panel. Then the
learned score once more with no rebuild in the whole run (a rebuild policy that never
comes due, as a service between rebuilds): with the recent tier (the default), which
holds every stored record until a rebuild, and without it (``recent_samples=0``), which
leaves the datastore empty. Writes live_curve.jsonl and a plot, and prints a Markdown
table.

    python drafter_bench/live_curve.py --data-dir ../shared/data --out benchmarks/results \
        --plot docs/live_curve.png
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from drafter_bench.run_all import DEV_SETS

WINDOW = 50


REFERENCE_LIVE_TAU_BUDGET16 = {
    "chat_alpacaeval_llama3_8b": 1.526,
    "code_humaneval_llama31_8b": 2.513,
    "multilingual_mtbench_suzume": 2.025,
}
"""The SSSD reference implementation's live tau over each whole dev set at budget 16
(docs/benchmarks.md, "Acceptance"); its per-window curve is not published."""


NEVER = ["--live-rebuild-tokens", str(10**12)]  # a rebuild policy that never comes due
RUNS: tuple[tuple[str, list[str], list[str], str], ...] = (
    # node score, sources, more flags, what the row is (``rebuild`` in the JSON)
    ("hand", ["input", "both"], [], "every record"),
    ("default", ["both"], [], "every record"),
    ("default", ["both"], NEVER, "never, recent tier"),
    ("default", ["both"], [*NEVER, "--config", "recent_samples=0"], "never, no tier"),
)


def run(data: Path, budget: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for node_score, sources, flags, rebuild in RUNS:
        cmd = [sys.executable, "-m", "drafter_bench.bench_cli", "replay", "--json", "--live",
               "--no-pld", "--budget", str(budget), "--curve", str(WINDOW), "--data", str(data),
               "--node-score", node_score, *flags]  # fmt: skip
        for source in sources:
            cmd += ["--sources", source]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows += [{**json.loads(line), "rebuild": rebuild}
                 for line in out.splitlines() if line.startswith("{")]  # fmt: skip
    return rows


def _label(row: dict[str, Any]) -> str:
    if row["method"] == "input":
        return "input trie alone"
    if row["rebuild"] != "every record":
        return f"learned score, no rebuild ({row['rebuild'].removeprefix('never, ')})"
    return "live datastore + input, " + (
        "learned node score" if row.get("node_score") == "default" else "hand-set fusion"
    )


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
                ax.plot(xs, ys, marker="o", label=_label(row))
        ref = REFERENCE_LIVE_TAU_BUDGET16.get(name)
        if ref is not None:
            ax.axhline(ref, color="grey", linestyle="--", label="SSSD reference, whole set")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("records finished")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"tau over the last {WINDOW} records")
    axes[0].legend(fontsize=7)
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
    kinds = (("input", "hand", "every record"), ("both", "hand", "every record"),
             ("both", "default", "every record"), ("both", "default", "never, recent tier"),
             ("both", "default", "never, no tier"))  # fmt: skip
    for name in DEV_SETS:
        curves = [next(r for r in rows if r["data"] == name and r["method"] == method
                       and r.get("node_score") == score and r["rebuild"] == rebuild)
                  for method, score, rebuild in kinds]  # fmt: skip
        print(f"\n{name} (budget {args.budget}; tau over each window of {WINDOW} records)\n")
        print("| records | input only | live datastore + input | gain | with the learned score "
              "| no rebuild, recent tier | no rebuild, no tier |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for points in zip(*(c["tau_curve"] for c in curves), strict=True):
            n, (t_in, t_both, *rest) = points[0][0], [t for _, t in points]
            cells = " | ".join(f"{t:.3f}" for t in rest)
            print(f"| {n} | {t_in:.3f} | {t_both:.3f} | {t_both / t_in - 1:+.1%} | {cells} |")


if __name__ == "__main__":
    main()
