"""The live datastore: durable ingest, rebuild policy, rotation, memory bound, recovery,
and no acknowledged ingest lost across real kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from drafter_service import Drafter
from drafter_service.datastore.sub_indices import SubIndex
from drafter_service.live.live_datastore import Corpus, DatastoreFull, LiveDatastore, LivePolicy
from drafter_service.live.rebuild import early_rebuild_due
from drafter_service.snapshot.store import (
    SnapshotError,
    TokenizerIdentity,
    list_snapshots,
    load_snapshot,
)

VOCAB = 1000
TOKENIZER = TokenizerIdentity(name="test", vocab_size=VOCAB, fingerprint="")


def doc(seed: int, length: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, size=length).astype(np.int32)


def contains(store: LiveDatastore, tokens: np.ndarray) -> bool:
    return any(s.find_range(tokens)[1] > s.find_range(tokens)[0]
               for s in store.datastore.sub_indices)


def test_ingest_then_rebuild_serves_the_documents(tmp_path: Path) -> None:
    swapped: list[int] = []
    policy = LivePolicy(rebuild_min_tokens=100)
    with LiveDatastore(tmp_path, TOKENIZER, policy, background=False,
                       on_swap=lambda ds: swapped.append(ds.num_tokens)) as store:
        store.ingest(doc(1))
        assert not contains(store, doc(1))  # 40 < 100 tokens: not rebuilt yet
        store.ingest(doc(2, 70))  # 110 tokens pending: due
        assert contains(store, doc(1)) and contains(store, doc(2, 70))
        stats = store.stats()
        assert stats.rebuilds == 1 and stats.pending_tokens == 0
        assert stats.num_tokens == 40 + 1 + 70
        assert swapped == [0, 111]


def test_newest_grows_until_full_then_oldest_is_dropped(tmp_path: Path) -> None:
    policy = LivePolicy(rebuild_min_tokens=1, max_sub_index_tokens=100, max_sub_indices=2)
    with LiveDatastore(tmp_path, TOKENIZER, policy, background=False) as store:
        store.ingest(doc(1, 60))
        store.ingest(doc(2, 30))  # 60 + 1 + 30 fits: the newest is rebuilt with both
        assert [s.num_tokens for s in store.datastore.sub_indices] == [91]
        store.ingest(doc(3, 50))  # does not fit: a new sub-index
        store.ingest(doc(4, 50))  # neither: a third, so the oldest goes
        assert [s.num_tokens for s in store.datastore.sub_indices] == [50, 50]
        assert not contains(store, doc(1, 60)) and contains(store, doc(4, 50))


def test_memory_bound_drops_oldest_and_refuses_what_cannot_fit(tmp_path: Path) -> None:
    # A sub-index of n tokens is 8 * n bytes + a 4 * (VOCAB + 1) first-token table:
    # 4644 for 80 tokens (fits), 4804 for 100 (does not), two of 80 do not either.
    policy = LivePolicy(rebuild_min_tokens=1, max_sub_index_tokens=100, max_resident_bytes=4700)
    with LiveDatastore(tmp_path, TOKENIZER, policy, background=False) as store:
        for seed in range(4):
            store.ingest(doc(seed, 80))
            assert store.stats().resident_bytes <= 4700
            assert store.stats().sub_indices == 1  # the older one is dropped each time
        with pytest.raises(DatastoreFull, match="max_resident_bytes"):
            store.ingest(doc(9, 100))  # 4804 > 4700 even with nothing older left
        assert contains(store, doc(3, 80))  # still serving after the refusal


def test_bad_ingest_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    with LiveDatastore(tmp_path, TOKENIZER, LivePolicy(rebuild_min_tokens=1),
                       background=False) as store:
        for bad, match in (([], "empty"), ([1, VOCAB], "token id 1000"), ([-3], "token id -3")):
            with pytest.raises(ValueError, match=match):
                store.ingest(bad)
        assert store.stats().wal_position == 0
        store.ingest(doc(1))
        assert store.stats().wal_position == 1


def test_generation_stores_output_with_prompt_context(tmp_path: Path) -> None:
    policy = LivePolicy(rebuild_min_tokens=1, prompt_context_tokens=2)
    with LiveDatastore(tmp_path, TOKENIZER, policy, background=False) as store:
        store.ingest_generation([5, 6, 7, 8], [9, 10])
        assert store.datastore.sub_indices[0].tokens().tolist() == [7, 8, 9, 10]


def test_restart_restores_snapshot_and_replays_the_log(tmp_path: Path) -> None:
    policy = LivePolicy(rebuild_min_tokens=1_000_000, snapshot_interval_s=0)
    with LiveDatastore(tmp_path, TOKENIZER, policy, background=False) as store:
        store.ingest(doc(1))
        store.rebuild()
        info = store.snapshot()
        assert info.wal_position == 1
        store.ingest(doc(2))  # only in the log
    with LiveDatastore(tmp_path, TOKENIZER, policy, background=False) as store:
        assert contains(store, doc(1)) and contains(store, doc(2))
        assert store.stats().wal_position == 2
        store.snapshot()
        assert store.stats().wal_bytes == 0  # covered by the snapshot: log discarded
    with LiveDatastore(tmp_path, TOKENIZER, policy, background=False) as store:
        assert contains(store, doc(2))
    other = TokenizerIdentity(name="other", vocab_size=VOCAB + 1, fingerprint="")
    with pytest.raises(SnapshotError, match="other"):
        LiveDatastore(tmp_path, other, policy, background=False)


def test_drafting_uses_the_swapped_datastore(tmp_path: Path) -> None:
    drafter = Drafter(VOCAB)
    policy = LivePolicy(rebuild_min_tokens=1)
    with LiveDatastore(tmp_path, TOKENIZER, policy, background=True,
                       on_swap=drafter.set_datastore) as store:
        store.ingest([1, 2, 3, 4, 5, 6])
        deadline = time.monotonic() + 120  # a bound on failure only
        while store.stats().rebuilds == 0:
            assert time.monotonic() < deadline, "the background rebuild never ran"
            time.sleep(0.01)
        drafter.start("r", [9, 1, 2, 3])
        tree = drafter.speculate(["r"], [[]], 3).tree(0)
        assert tree.tokens.tolist() == [4, 5, 6]


def test_cheap_rebuilds_are_brought_forward(tmp_path: Path) -> None:
    """rebuild_max_share folds a small datastore's documents in about a second after the
    last rebuild, long before rebuild_interval_s; 0 leaves only the interval. The schedule
    is stepped by hand at chosen times (run_maintenance_once), never waited for; then the
    background thread brings a cheap rebuild forward too."""
    hourly = {"rebuild_min_tokens": 10**9, "rebuild_interval_s": 3600.0}
    with LiveDatastore(tmp_path / "off", TOKENIZER, LivePolicy(**hourly, rebuild_max_share=0),
                       background=False) as store:  # fmt: skip
        store.ingest(doc(1))
        last = store._index.state.last_rebuild_monotonic
        for since_s in (0.5, 1.0, 2.5, 60.0, 3599.0):
            assert store.run_maintenance_once(last + since_s) == (False, False), since_s
        assert store.stats().rebuilds == 0 and not contains(store, doc(1))
        # Just past each bound: (last + x) - last can round to under x for a large clock.
        assert store.run_maintenance_once(last + 3600.001) == (True, False)  # the interval
        assert store.stats().rebuilds == 1 and contains(store, doc(1))
    with LiveDatastore(tmp_path / "on", TOKENIZER, LivePolicy(**hourly, rebuild_max_share=0.05),
                       background=False) as store:  # fmt: skip
        store.ingest(doc(1))
        last = store._index.state.last_rebuild_monotonic
        assert store.run_maintenance_once(last + 0.5) == (False, False)  # never under 1 s apart
        assert store.stats().rebuilds == 0
        assert store.run_maintenance_once(last + 1.001) == (True, False)  # cheap: brought forward
        assert store.stats().rebuilds == 1 and contains(store, doc(1))
    cheap = LivePolicy(**hourly, rebuild_max_share=0.05)
    with LiveDatastore(tmp_path / "thread", TOKENIZER, cheap, background=True) as store:
        store.ingest(doc(1))
        deadline = time.monotonic() + 120  # a bound on failure only (the interval is 1 h)
        while store.stats().rebuilds == 0:
            assert time.monotonic() < deadline, "the cheap rebuild was not brought forward"
            time.sleep(0.01)
        assert contains(store, doc(1))


def test_an_expensive_rebuild_waits_for_its_share(tmp_path: Path) -> None:
    """The expected duration scales with the newest sub-index, which the rebuild re-sorts:
    at the measured rate, 200,000 tokens wait 2x longer than 100,000."""
    policy = LivePolicy(rebuild_min_tokens=1, max_sub_index_tokens=10**6, rebuild_max_share=0.1)
    with LiveDatastore(tmp_path, TOKENIZER, policy, background=False) as store:
        store.ingest(doc(1, 100_000))  # rebuilt at once: the newest sub-index
        store.update_policy(rebuild_min_tokens=10**9)
        store.ingest(doc(2, 99_999))  # waits: with the newest, 200,000 tokens to re-sort
        progress, stats = store._index.state, store.stats()
        assert stats.rebuilds == 1 and progress.rebuild_tokens_per_s > 0  # measured
        progress = replace(progress, rebuild_tokens_per_s=1e6)  # fix the rate: 0.2 s of sorting
        policy, waiting = store.policy, stats.pending_tokens
        assert not early_rebuild_due(progress, waiting, policy, 1.9)  # 0.2 s is over 10% of 1.9 s
        assert early_rebuild_due(progress, waiting, policy, 2.0)
        progress = replace(progress, rebuild_tokens_per_s=1e9)
        assert not early_rebuild_due(progress, waiting, policy, 0.5)  # never under 1 s apart
        assert early_rebuild_due(progress, waiting, policy, 1.0)
        assert not early_rebuild_due(progress, waiting, replace(policy, rebuild_max_share=0), 10**6)


def test_a_restore_swaps_in_its_corpora_as_the_base_as_a_restart_would(tmp_path: Path) -> None:
    """The restored datastore drafts from its corpora as a source of their own (the base),
    as the same snapshot opened at a restart does, not as one source with the learned."""
    corpus = Corpus("c", (SubIndex.from_text(doc(9), VOCAB),))
    swapped: list[int] = []
    with LiveDatastore(tmp_path, TOKENIZER, LivePolicy(rebuild_min_tokens=1), background=False,
                       on_swap=lambda ds: swapped.append(ds.base_count)) as store:  # fmt: skip
        store.ingest(doc(1))
        info = store.add_corpus(corpus)
        store.ingest(doc(2))
        store.restore(info.path.name)
        assert [len(store.datastore.sub_indices), store.datastore.base_count] == [2, 1]
        assert swapped[-1] == 1
    with LiveDatastore(tmp_path, TOKENIZER, background=False) as again:
        assert [len(again.datastore.sub_indices), again.datastore.base_count] == [2, 1]


CHILD = r"""
import sys, numpy as np
from drafter_service.live.live_datastore import LiveDatastore, LivePolicy
from drafter_service.snapshot.store import TokenizerIdentity
store = LiveDatastore(sys.argv[1], TokenizerIdentity("test", 1000, ""),
                      LivePolicy(rebuild_min_tokens=2000, rebuild_interval_s=0.05,
                                 snapshot_interval_s=0.1, max_sub_index_tokens=20000,
                                 max_sub_indices=100000),
                      background=True)
seed = int(sys.argv[2])
while True:
    rng = np.random.default_rng(seed)
    store.ingest(rng.integers(0, 1000, size=int(rng.integers(20, 400))).astype(np.int32))
    print(seed, flush=True)
    seed += 1
"""


def test_no_acknowledged_ingest_is_lost_across_kill_9(tmp_path: Path) -> None:
    """Each of 10 children is killed once it has acknowledged a random number of ingests
    (gated on its output, not on time: a loaded machine's child may take seconds to
    start), then after a random pause, so the kill lands anywhere in its background
    rebuilds and snapshots."""
    rng = np.random.default_rng(0)
    acked: list[int] = []
    gated = 0
    seed = 0
    for _ in range(10):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(seed)],
                                 stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert child.stdout is not None
        wanted = int(rng.integers(10, 30))
        for _ in range(wanted):
            line = child.stdout.readline()
            assert line, "the child stopped before acknowledging its ingests"
            acked.append(int(line))
        gated += wanted
        time.sleep(float(rng.uniform(0, 0.3)))  # where the kill lands, not a wait
        os.kill(child.pid, signal.SIGKILL)
        out, _ = child.communicate()
        acked += [int(line) for line in out.split()]
        seed = acked[-1] + 1
        for snap in list_snapshots(tmp_path / "snapshots"):  # every complete one loads
            load_snapshot(snap.path, expect_tokenizer=TOKENIZER)
    assert len(acked) >= gated >= 100
    policy = LivePolicy(max_sub_index_tokens=20000, max_sub_indices=100000)
    with LiveDatastore(tmp_path, TOKENIZER, policy, background=False) as store:
        for s in acked:
            r = np.random.default_rng(s)
            tokens = r.integers(0, 1000, size=int(r.integers(20, 400))).astype(np.int32)
            assert contains(store, tokens), f"acknowledged ingest {s} was lost"
