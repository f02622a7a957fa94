"""Drafting latency while the live datastore rebuilds, against no rebuild.

The live datastore starts from a snapshot of the 6.4M-token corpus (so every
rebuild re-sorts about 6.4M tokens in the background). One thread drafts for
real chat replays, one request at a time through the public API, while another
keeps ingesting documents and rebuilding, at the nice value `drafter serve` gives its
background threads (``--background-nice``). Prints one JSON object: draft p50/p99
without and during rebuilds, and their ratio (target <= 1.2). ``--cpus 1`` runs the
whole process on one core, where drafting and rebuilds take turns.

    python drafter_bench/live_rebuild_latency.py --data-dir ../shared/data --seconds 8
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from drafter_bench.token_records import Record, iter_documents, read_records
from drafter_service import Datastore, Drafter, SubIndex
from drafter_service.datastore.sub_indices import concat_documents
from drafter_service.live.live_datastore import LiveDatastore, LivePolicy
from drafter_service.live.thread_priority import MAX_NICE, lower_thread_priority
from drafter_service.snapshot.store import TokenizerIdentity, write_snapshot

VOCAB = 128256


def draft_loop(drafter: Drafter, records: list[Record], stop: threading.Event,
               samples: list[tuple[float, float]]) -> None:
    """Replays records' outputs token by token; appends (start time, seconds) per call."""
    i = 0
    while not stop.is_set():
        record = records[i % len(records)]
        rid = f"r{i}"
        drafter.start(rid, record.prompt_ids)
        out = record.output_ids
        for p in range(len(out)):
            if stop.is_set():
                break
            start = time.perf_counter()
            drafter.speculate([rid], [out[p : p + 1]], 32)
            samples.append((start, time.perf_counter() - start))
        drafter.stop(rid)
        i += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--background-nice", type=int, default=0,
                        help=f"nice value of the rebuilding thread, 0..{MAX_NICE} (drafter "
                        "serve --background-nice; 0, its default: as drafting)")
    parser.add_argument("--cpus", type=int, default=None,
                        help="run on the first N CPUs of this process's set (default: all)")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if args.cpus is not None:
        if not 1 <= args.cpus <= len(cpus):
            parser.error(f"--cpus {args.cpus}: this process may use {len(cpus)} CPUs")
        cpus = cpus[: args.cpus]
        os.sched_setaffinity(0, cpus)  # threads started later inherit it
    text = concat_documents(
        iter_documents(args.data_dir / "corpus" / "datastore_llama3_family.jsonl.gz"), VOCAB
    )
    records = read_records(args.data_dir / "dev" / "chat_alpacaeval_llama3_8b.jsonl.gz", limit=50)
    tokenizer = TokenizerIdentity(name="llama3", vocab_size=VOCAB, fingerprint="")
    drafter = Drafter(VOCAB)
    with tempfile.TemporaryDirectory() as root:
        write_snapshot(Path(root) / "snapshots" / "initial",
                       Datastore([SubIndex.from_text(text, VOCAB)], VOCAB), tokenizer)
        policy = LivePolicy(rebuild_min_tokens=10**9, snapshot_interval_s=0)
        store = LiveDatastore(root, tokenizer, policy, on_swap=drafter.set_datastore,
                              background=False)
        rebuilds: list[tuple[float, float]] = []

        def rebuild_loop(deadline: float) -> None:
            """Ingests and rebuilds until the deadline, as the live datastore's own thread
            would: at the background nice value."""
            lower_thread_priority(args.background_nice)
            rng = np.random.default_rng(0)
            while time.perf_counter() < deadline:
                store.ingest(rng.integers(0, VOCAB, size=500).astype(np.int32))
                start = time.perf_counter()
                store.rebuild()
                rebuilds.append((start, time.perf_counter()))

        def phase(with_rebuilds: bool) -> list[tuple[float, float]]:
            samples: list[tuple[float, float]] = []
            stop = threading.Event()
            worker = threading.Thread(target=draft_loop, args=(drafter, records, stop, samples))
            worker.start()
            deadline = time.perf_counter() + args.seconds
            if with_rebuilds:
                rebuilder = threading.Thread(target=rebuild_loop, args=(deadline,))
                rebuilder.start()
                rebuilder.join()
            else:
                time.sleep(args.seconds)
            stop.set()
            worker.join()
            return samples

        quiet = phase(False)
        busy = [(t, d) for t, d in phase(True)
                if any(a <= t <= b for a, b in rebuilds)]  # drafts that overlapped a rebuild
        store.close()
    q = np.array([d for _, d in quiet]) * 1e6
    b = np.array([d for _, d in busy]) * 1e6
    print(json.dumps({
        "cpus": len(cpus),
        "background_nice": args.background_nice,
        "datastore_tokens": len(text),
        "rebuilds": len(rebuilds),
        "rebuild_s_mean": round(float(np.mean([e - s for s, e in rebuilds])), 3),
        "drafts_quiet": len(q), "drafts_during_rebuild": len(b),
        "draft_us_p50_quiet": round(float(np.percentile(q, 50)), 1),
        "draft_us_p99_quiet": round(float(np.percentile(q, 99)), 1),
        "draft_us_p50_rebuild": round(float(np.percentile(b, 50)), 1),
        "draft_us_p99_rebuild": round(float(np.percentile(b, 99)), 1),
        "p99_ratio": round(float(np.percentile(b, 99) / np.percentile(q, 99)), 3),
    }))


if __name__ == "__main__":
    main()
