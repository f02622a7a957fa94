"""Plots of a ``drafter-bench gpu`` run (its JSON lines, e.g. a device run's ``gpu.jsonl``):

- ``gpu_tokens_per_s.png``: tokens/s against batch size, without drafts, with budget-rule
  trees and with each chain length;
- ``gpu_verify_cost.png``: the forward pass's time against tree tokens per request, one
  line per batch size, with the budget rule's tree size marked on each.

Run::

    python -m drafter_bench.gpu_plots benchmarks/results/gpu.jsonl --out-dir docs
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def read_rows(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not any(r.get("bench") == "gpu" for r in rows):
        raise ValueError(f"{path}: no drafter-bench gpu rows")
    return [r for r in rows if r.get("bench") == "gpu"]


def plot(rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Writes both plots into ``out_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = rows[0]
    title = f"{first['model']} on {first['device']} ({first['dtype']}), teacher-forced"
    out_dir.mkdir(parents=True, exist_ok=True)
    speed = out_dir / "gpu_tokens_per_s.png"
    lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        if r["kind"] == "decode" and r["tokens_per_s"] is not None:
            label = {"none": "no drafts", "tree": "trees (budget rule)"}.get(
                r["mode"], f"chains of {r['chain']}"
            )
            lines[label].append((r["batch"], r["tokens_per_s"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in lines.items():
        points.sort()
        ax.plot([b for b, _ in points], [t for _, t in points], marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="tokens/s", title=title)
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(speed, dpi=120)
    plt.close(fig)

    cost = out_dir / "gpu_verify_cost.png"
    curves: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        if r["kind"] == "verify_cost" and r["forward_ms"] is not None:
            curves[r["batch"]].append((r["nodes"], r["forward_ms"]))
    rule = {r["batch"]: r["rule_tree_tokens"] for r in rows if r["kind"] == "ridge"}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for batch in sorted(curves):
        points = sorted(curves[batch])
        (line,) = ax.plot([n for n, _ in points], [ms for _, ms in points], marker="o",
                          label=f"batch {batch}")  # fmt: skip
        if batch in rule:
            ax.axvline(rule[batch], color=line.get_color(), linestyle=":", alpha=0.6)
    ax.set(xscale="log", yscale="log", xlabel="tree tokens per request (root included)",
           ylabel="forward pass, ms")  # fmt: skip
    ax.set_title(f"{title}\ndotted: the budget rule's tree size")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(cost, dpi=120)
    plt.close(fig)
    return [speed, cost]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rows", type=Path, help="drafter-bench gpu JSON lines")
    p.add_argument("--out-dir", type=Path, default=Path("."), help="where the PNGs go")
    args = p.parse_args()
    for path in plot(read_rows(args.rows), args.out_dir):
        print(path)


if __name__ == "__main__":
    main()
