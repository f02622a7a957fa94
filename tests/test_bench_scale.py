"""``drafter-bench scale`` end to end (issue 14): a real Redis and 1 and 2 ``drafter serve``
processes, tiny synthetic records; the report of each replica count has its step times,
ingest-to-visible latencies and live τ, and the replay split over the replicas reaches
exactly the one-replica τ (the rounds make the datastore content identical)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.system

VOCAB_SIZE = 1000


def write_records(path: Path, seed: int, count: int) -> Path:
    """Records built from a few shared phrases, so that finished ones teach later ones."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(1, 60, size=int(rng.integers(3, 9))) for _ in range(10)]
    lines = []
    for i in range(count):
        picks = rng.integers(0, len(phrases), size=int(rng.integers(4, 20)))
        text = np.concatenate([phrases[j] for j in picks]).tolist()
        cut = int(rng.integers(1, len(text)))
        lines.append(json.dumps({"id": f"r{i}", "prompt_ids": text[:cut],
                                 "output_ids": text[cut:]}))  # fmt: skip
    path.write_bytes(gzip.compress("".join(line + "\n" for line in lines).encode()))
    return path


def test_scale_benchmark_reports_each_replica_count(tmp_path: Path) -> None:
    if subprocess.run(["which", "redis-server"], capture_output=True).returncode:
        pytest.fail("redis-server not found: `make setup` installs it (Debian redis-server)")
    data = write_records(tmp_path / "dev_set.jsonl.gz", 0, 12)
    corpus = write_records(tmp_path / "corpus.jsonl.gz", 1, 20)
    cmd = [sys.executable, "-m", "drafter_bench.bench_cli", "scale", "--replicas", "1,2",
           "--data", str(data), "--corpus", str(corpus), "--batch", "4", "--steps", "40",
           "--warmup", "5", "--visible-samples", "4", "--tau-records", "6", "--workers", "3",
           "--vocab-size", str(VOCAB_SIZE), "--client-deadline-ms", "120000", "--json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # failure bound only
    assert proc.returncode == 0, proc.stderr
    one, two = [json.loads(line) for line in proc.stdout.splitlines()]
    assert (one["replicas"], two["replicas"]) == (1, 2)
    for row in (one, two):
        assert row["command"].startswith("drafter-bench scale --replicas 1,2 --data ")
        assert row["batch"] == 4 and row["budget"] == 16 and row["steps"] == 40
        assert row["rebuild_interval_s"] == 0.05 and row["rebuild_min_tokens"] == 1
        assert 0 < row["step_ms_p50"] <= row["step_ms_p99"]
        # Steps past the deadline depend on the machine's load: counted, not asserted away.
        assert 0 <= row["fallback_rate"] <= 1 and 0 <= row["failed_steps"] <= row["steps"]
        assert 0 < row["visible_ms_p50"] <= row["visible_ms_p99"]
        assert row["visible_samples"] == 4
        assert row["tau"] >= 1 and row["tau_records"] == 6 and row["tau_lost_steps"] == 0
        assert row["tau_datastore_tokens"] > 0
    assert one["tau_ratio"] is None
    # Same rounds, same finishes in the same order: the same content, the same trees.
    assert two["tau_content_equal"] is True
    assert two["tau_ratio"] == 1.0 and two["tau_steps"] == one["tau_steps"]


def test_scale_benchmark_refuses_bad_replica_counts(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "drafter_bench.bench_cli", "scale", "--replicas", "0,2",
           "--data", str(tmp_path / "none.jsonl")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "replica counts must be >= 1" in proc.stderr
