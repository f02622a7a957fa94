"""What the drafter's metrics cost the Draft hot path, per batch.

Times exactly the metric work one Draft call does (servicer: two clock reads, the
method context variable, the latency histogram; engine: batch size, tree sizes and
per-request time of one datastore's batch; job: two clock reads), for several batch
sizes, and for comparison the same tree sizes as one prometheus_client
``Histogram.observe`` per request. Budget: about 15 us per batch.

    python drafter_bench/metrics_overhead.py
"""

from __future__ import annotations

import argparse
import json
import time
import timeit

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Histogram

from drafter_service.metrics.drafter_metrics import TREE_NODES, DrafterMetrics


def tree_offsets(batch: int, seed: int = 0) -> npt.NDArray[np.int64]:
    """Offsets of ``batch`` trees of 0..32 nodes, as the native batch returns them."""
    sizes = np.random.default_rng(seed).integers(0, 33, size=batch)
    offsets = np.zeros(batch + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def per_batch_us(batch: int, number: int) -> float:
    """Microseconds of metric work per Draft batch of ``batch`` requests."""
    metrics = DrafterMetrics()
    offsets = tree_offsets(batch)

    def one_batch() -> None:
        start = time.perf_counter()  # servicer: call received
        job_start = time.perf_counter()  # job: around the native call
        job_seconds = time.perf_counter() - job_start
        metrics.record_trees("default", offsets, job_seconds)  # engine
        metrics.record_batch("Draft", batch)  # servicer: the batch's size, by method
        metrics.record_call("Draft", time.perf_counter() - start)  # servicer: answered

    return min(timeit.repeat(one_batch, number=number, repeat=5)) / number * 1e6


def observe_each_us(batch: int, number: int) -> float:
    """The naive alternative: one Histogram.observe per tree."""
    histogram = Histogram(
        "tree_nodes", "", ["datastore"], buckets=TREE_NODES, registry=CollectorRegistry()
    )
    child = histogram.labels("default")
    sizes = np.diff(tree_offsets(batch)).tolist()

    def one_batch() -> None:
        for size in sizes:
            child.observe(size)

    return min(timeit.repeat(one_batch, number=number, repeat=5)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000, help="batches per timing")
    parser.add_argument("--json", action="store_true", help="one JSON line per batch size")
    args = parser.parse_args()
    for batch in (1, 8, 64, 256):
        row = {
            "batch": batch,
            "metrics_us_per_batch": round(per_batch_us(batch, args.number), 2),
            "observe_each_us_per_batch": round(observe_each_us(batch, args.number // 4), 2),
        }
        print(json.dumps(row) if args.json else "  ".join(f"{k} {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
