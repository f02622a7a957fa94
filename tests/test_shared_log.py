"""Replicas that learn as one through a real Redis stream (issue 14): every replica's
ingests reach every replica, exactly once, in one order, whatever the rebuild timing;
the consumed offset survives restarts and snapshots."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from log_server import RedisServer

from drafter_service.live.live_datastore import LiveDatastore, LivePolicy
from drafter_service.live.stream_ids import StreamId
from drafter_service.replication.replicated_datastore import ReplicatedDatastore
from drafter_service.replication.shared_log import LogError, SharedLogConfig
from drafter_service.service.settings import ServeConfig
from drafter_service.snapshot.store import TokenizerIdentity

VOCAB = 1000
WAIT_S = 120  # for a replica to take the stream: a bound on failure only
TOKENIZER = TokenizerIdentity("test", VOCAB, "0" * 64)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path / "redis")
    yield srv
    srv.stop()


def docs(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=rng.integers(5, 60)).astype(np.int32) for _ in range(n)]


def policy(**overrides: object) -> LivePolicy:
    # Rebuilds only when a test asks: none brought forward (rebuild_max_share), which
    # on a slow machine would fold mid-test and change the rebuild counts.
    fields: dict[str, object] = {"rebuild_min_tokens": 10**9, "rebuild_interval_s": 3600.0,
                                 "rebuild_max_share": 0.0, "snapshot_interval_s": 0.0}  # fmt: skip
    fields.update(overrides)
    return LivePolicy(**fields)  # type: ignore[arg-type]


def replica(root: Path, name: str, config: SharedLogConfig, **kw: object) -> LiveDatastore:
    return ReplicatedDatastore(root / name, TOKENIZER, policy(**kw),
                               shared_log=config.stream("default"))  # fmt: skip


def newest(config: SharedLogConfig) -> StreamId:
    stream = config.stream("default")
    try:
        last = stream.last_id()
    finally:
        stream.close()
    assert last is not None
    return last


def settle(replicas: list[LiveDatastore], config: SharedLogConfig) -> None:
    """Every replica has taken the whole stream and folded it."""
    last = newest(config)
    for r in replicas:
        assert r._buffer.wait_consumed(last, WAIT_S), r.stats()
        r.rebuild()


def test_ingests_through_any_replica_reach_all_identically(
    tmp_path: Path, server: RedisServer
) -> None:
    config = SharedLogConfig(server.url, prefix="t1")
    replicas = [replica(tmp_path, f"r{i}", config) for i in range(3)]
    try:
        written = docs(30)
        for i, doc in enumerate(written):
            replicas[i % 3].ingest(doc)
            if i % 7 == 0:
                replicas[1].rebuild()  # rebuild timing differs between replicas
        settle(replicas, config)
        digests = {r.content_digest() for r in replicas}
        assert len(digests) == 1
        stats = [r.stats() for r in replicas]
        total = sum(len(d) for d in written)
        for s in stats:
            assert s.num_tokens == total + len(written) - 1  # one separator between docs
            assert s.consumed_offset == newest(config)
            assert s.stream_skipped == s.stream_errors == s.stream_lost == 0
        # Drafting sees the content on every replica: the suffix after a 5-token context.
        doc = written[11]
        for r in replicas:
            assert r.datastore.sub_indices[-1].find_range(doc[:5])[1] > 0
    finally:
        for r in replicas:
            r.close()


def test_restart_resumes_after_its_log_with_nothing_lost_or_twice(
    tmp_path: Path, server: RedisServer
) -> None:
    config = SharedLogConfig(server.url, prefix="t2")
    a = replica(tmp_path, "a", config)
    b = replica(tmp_path, "b", config)
    try:
        for doc in docs(10, seed=1):
            a.ingest(doc)
        assert b._buffer.wait_consumed(newest(config), WAIT_S)
        b.rebuild()
        b.snapshot()  # the WAL it covers is discarded: the offset lives in the manifest
        for doc in docs(5, seed=2):
            a.ingest(doc)
        assert b._buffer.wait_consumed(newest(config), WAIT_S)
        b.close()  # stopped with 5 records in its log after the snapshot
        for doc in docs(8, seed=3):  # ingested while b is down
            a.ingest(doc)
        b = replica(tmp_path, "b", config)
        settle([a, b], config)
        assert a.content_digest() == b.content_digest()
        assert a.stats().num_tokens == b.stats().num_tokens
    finally:
        a.close()
        b.close()


def test_fold_result_does_not_depend_on_batching(tmp_path: Path, server: RedisServer) -> None:
    config = SharedLogConfig(server.url, prefix="t3")
    # Small sub-indices: documents spill into new ones at different points of a batch.
    one = replica(tmp_path, "one", config, max_sub_index_tokens=200)
    each = replica(tmp_path, "each", config, max_sub_index_tokens=200)
    try:
        for doc in docs(40, seed=4):
            one.ingest(doc)
            assert each._buffer.wait_consumed(newest(config), WAIT_S)
            each.rebuild()
        settle([one, each], config)
        assert one.stats().rebuilds == 1 and each.stats().rebuilds == 40
        assert len(one.datastore.sub_indices) > 3
        assert one.content_digest() == each.content_digest()
    finally:
        one.close()
        each.close()


def test_trimmed_entries_are_reported_lost(tmp_path: Path, server: RedisServer) -> None:
    config = SharedLogConfig(server.url, prefix="t4", retention=5)
    a = replica(tmp_path, "a", config)
    try:
        stream = config.stream("default")
        for doc in docs(300, seed=5):  # approximate trimming drops whole nodes (~100)
            stream.append(doc)
        stream.close()
        late = replica(tmp_path, "late", config)
        try:
            assert late._buffer.wait_consumed(newest(config), WAIT_S)
            stats = late.stats()
            assert stats.stream_lost == 1
            assert "trimmed by retention" in (stats.last_error or "")
        finally:
            late.close()
    finally:
        a.close()


def test_a_bad_entry_is_skipped_and_later_ones_taken(tmp_path: Path, server: RedisServer) -> None:
    config = SharedLogConfig(server.url, prefix="t5")
    a = replica(tmp_path, "a", config)
    try:
        raw = server.client()
        raw.xadd("t5:default", {"v": "1", "tokens": b"\x00\x00\x00", "crc": "0"})
        bad_ids = np.array([5, VOCAB + 3], dtype="<i4").tobytes()
        import zlib

        raw.xadd("t5:default", {"v": "1", "tokens": bad_ids, "crc": str(zlib.crc32(bad_ids))})
        raw.close()
        good = docs(1, seed=6)[0]
        a.ingest(good)
        a.rebuild()
        stats = a.stats()
        assert stats.stream_skipped == 2
        assert stats.num_tokens == len(good)
    finally:
        a.close()


def test_log_server_down_then_back(tmp_path: Path, server: RedisServer) -> None:
    config = SharedLogConfig(server.url, prefix="t6", timeout_s=1.0)
    a = replica(tmp_path, "a", config)
    b = replica(tmp_path, "b", config)
    try:
        a.ingest(docs(1, seed=7)[0])
        server.stop()
        with pytest.raises(LogError):
            a.ingest(docs(1, seed=8)[0])
        deadline = time.monotonic() + 20
        while b.stats().stream_errors == 0:  # the follower notices and retries
            assert time.monotonic() < deadline
            time.sleep(0.05)
        server.start()  # same port, same append-only file: the first entry is still there
        a.ingest(docs(1, seed=9)[0])
        settle([a, b], config)
        assert a.content_digest() == b.content_digest()
        assert b.stats().num_tokens == a.stats().num_tokens > 0
    finally:
        a.close()
        b.close()


def test_config_errors_name_the_value() -> None:
    with pytest.raises(ValueError, match="'http://x'"):
        SharedLogConfig("http://x")
    with pytest.raises(ValueError, match="retention"):  # refused at the settings
        ServeConfig(shared_log="redis://x:6379", shared_log_retention=-1)
    with pytest.raises(ValueError, match="prefix"):
        SharedLogConfig("redis://x:6379", prefix="a b")


def test_restore_is_refused_when_following_a_stream(tmp_path: Path, server: RedisServer) -> None:
    config = SharedLogConfig(server.url, prefix="t7")
    a = replica(tmp_path, "a", config)
    try:
        a.ingest(docs(1)[0])
        a.rebuild()
        info = a.snapshot()
        with pytest.raises(Exception, match="shared ingest stream"):
            a.restore(info.path.name)
    finally:
        a.close()


def test_redis_client_is_real(server: RedisServer) -> None:
    assert isinstance(server.client(), redis.Redis)
