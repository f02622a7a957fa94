"""Micro-benchmark of tree packing and verification (issue 5): 64 trees of 16 nodes.

    python drafter_bench/verify_bench.py \\
        [--data ../shared/data/dev/code_humaneval_llama31_8b.jsonl.gz]

The trees are real drafter trees when the dev data is there: the first 64
HumanEval records start with their prompt and half their output, the outputs of
the next records form the datastore, and one drafting step with budget 16 gives
the batch. Otherwise (or with ``--random``) a random tree generator does.

Prints one JSON line per case with p50/p99 in ms over ``--iters`` calls:
``pack_trees``, ``accept`` (target tokens given), ``pack+accept`` (the issue's
target: <= 1 ms on this CPU). Then
``sample_targets`` (greedy, sampling, sampling with top-k/top-p) at vocab 32000
and 128256 on ``--sampler-trees`` trees (T rows each): that is the engine's own
sampler, run for plain decoding too (there on one row per request instead of T),
so it is timed apart from verification. ``us_per_row`` scales it to any batch.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from verifier_client.results import Tree
from verifier_client.verification.tree_packing import pack_trees
from verifier_client.verification.tree_verification import accept, sample_targets

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "dev"
DEFAULT_DATA = DATA_DIR / "code_humaneval_llama31_8b.jsonl.gz"
LLAMA3_VOCAB = 128256



def _first_child(parents: torch.Tensor) -> torch.Tensor:
    """Each node's first (lowest-column) child in its row, -1 for none."""
    first = torch.full(parents.shape, -1, dtype=torch.int64)
    for col in range(parents.shape[1] - 1, 0, -1):  # the lowest column is written last
        parent = parents[:, col]
        rows = (parent >= 0).nonzero().flatten()
        first[rows, parent[rows]] = col
    return first

def drafter_trees(data: Path, batch: int, budget: int) -> tuple[list[Tree | None], list[int]]:
    """One drafting step of ``batch`` real requests: their trees and last tokens."""
    from drafter_service import Datastore, Drafter

    records = []
    with gzip.open(data, "rt", encoding="utf-8") as f:
        for line in f:
            records.append(json.loads(line))
            if len(records) == batch + 150:
                break
    store = Datastore.from_documents([r["output_ids"] for r in records[batch:]], LLAMA3_VOCAB)
    drafter = Drafter(LLAMA3_VOCAB, datastore=store)
    ids, last = [], []
    for i, r in enumerate(records[:batch]):
        out = r["output_ids"]
        half = len(out) // 2
        drafter.start(str(i), r["prompt_ids"] + out[:half])
        ids.append(str(i))
        last.append(out[half])
    drafts = drafter.speculate(ids, [[t] for t in last], budget)
    trees: list[Tree | None] = []
    for i in range(batch):
        t = drafts.tree(i)
        trees.append(Tree.of(t.tokens.tolist(), t.parents.tolist(), t.scores.tolist()))
    return trees, last


def random_trees(batch: int, nodes: int, seed: int) -> tuple[list[Tree | None], list[int]]:
    """Breadth-first random trees: each node's parent among the few nodes before it."""
    rng = np.random.default_rng(seed)
    trees: list[Tree | None] = []
    for _ in range(batch):
        parents = sorted(int(rng.integers(max(-1, i - 4), i)) for i in range(nodes))
        tokens = rng.integers(0, LLAMA3_VOCAB, nodes).tolist()
        trees.append(Tree.of(tokens, parents, rng.random(nodes).tolist()))
    return trees, rng.integers(0, LLAMA3_VOCAB, batch).tolist()


def measure(fn: Callable[[], object], iters: int, warmup: int = 10) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1e6)
    return times


def report(case: str, times: list[float], **extra: object) -> None:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    print(json.dumps({
        "case": case, "iters": len(times), "p50_ms": round(statistics.median(times), 4),
        "p99_ms": round(p99, 4), "mean_ms": round(statistics.fmean(times), 4), **extra,
    }), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--random", action="store_true", help="random trees, not the drafter's")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--nodes", type=int, default=16, help="draft budget per tree")
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--sampler-trees", type=int, default=1)
    parser.add_argument("--sampler-iters", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args.random or not args.data.is_file():
        source = "random"
        trees, roots = random_trees(args.batch, args.nodes, seed=0)
    else:
        source = "drafter"
        trees, roots = drafter_trees(args.data, args.batch, args.nodes)
    lens = [1000 + 7 * i for i in range(args.batch)]
    sizes = [0 if t is None else len(t) for t in trees]
    common = {
        "source": source, "batch": args.batch, "mean_nodes": round(statistics.fmean(sizes), 2),
        "max_nodes": max(sizes), "threads": args.threads,
    }  # fmt: skip

    packed = pack_trees(trees, roots, lens)
    # Targets that follow each tree's first branch for a while, then miss: a mix
    # of accepted lengths like a real step's (random targets would accept nothing).
    gen = torch.Generator().manual_seed(0)
    targets = torch.randint(0, LLAMA3_VOCAB, packed.tokens.shape, generator=gen)
    first_child = _first_child(packed.parents)
    follow = (first_child >= 0) & (torch.rand(packed.tokens.shape, generator=gen) < 0.8)
    children = packed.tokens.gather(1, first_child.clamp(min=0))
    targets = torch.where(follow, children, targets)
    result = accept(packed, targets)
    common["mean_accepted"] = round(float(result.accept_lengths.float().mean()), 2)

    report("pack_trees", measure(lambda: pack_trees(trees, roots, lens), args.iters), **common)
    report("accept", measure(lambda: accept(packed, targets), args.iters), **common)
    report("pack+accept", measure(lambda: accept(pack_trees(trees, roots, lens), targets),
                                  args.iters), **common)  # fmt: skip

    rows = args.sampler_trees * packed.width
    modes = [  # name, temperature, top_k, top_p
        ("greedy", 0.0, 0, 1.0),
        ("sample", 0.8, 0, 1.0),
        ("sample_top_k50_top_p0.9", 0.8, 50, 0.9),
    ]
    for vocab in (32000, LLAMA3_VOCAB):
        logits = torch.randn((args.sampler_trees, packed.width, vocab), generator=gen)
        for mode, temperature, top_k, top_p in modes:

            def sample(
                logits: torch.Tensor = logits, t: float = temperature, k: int = top_k,
                p: float = top_p,
            ) -> torch.Tensor:
                return sample_targets(logits, temperature=t, top_k=k, top_p=p, generator=gen)

            times = measure(sample, args.sampler_iters, warmup=3)
            report(f"sample_targets/{mode}", times, vocab=vocab, rows=rows,
                   us_per_row=round(statistics.median(times) * 1000 / rows, 2),
                   threads=args.threads)  # fmt: skip


if __name__ == "__main__":
    main()
