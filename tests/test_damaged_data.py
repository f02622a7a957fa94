"""Damage on disk never costs acknowledged data silently (issue 17, items 1 and 2): the
real `drafter serve` refuses to start, naming the file and what would be lost, and
`--salvage true` starts with everything readable, the damaged files moved aside."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest
from client_servers import VOCAB_SIZE, DrafterProcess, drafter_command

from drafter_service.live.live_datastore import LiveDatastore, LivePolicy
from drafter_service.snapshot.array_files import DamagedDataError
from drafter_service.snapshot.store import TokenizerIdentity, list_snapshots
from sssd.drafter.v1 import drafter_pb2 as pb
from sssd.drafter.v1 import drafter_pb2_grpc as pb_grpc

TOKENIZER = TokenizerIdentity("test-vocab", VOCAB_SIZE)


def docs(n: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB_SIZE, size=int(rng.integers(5, 40))).tolist() for _ in range(n)]


def serve_once(data_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`drafter serve` that must refuse at startup (never listens)."""
    cmd = [*drafter_command(), "--port", "0", "--data-dir", str(data_dir), "--vocab-size",
           str(VOCAB_SIZE), "--metrics-port", "-1", "--admin-port", "-1", *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def stored_tokens(server: DrafterProcess) -> int:
    return sum(d.num_tokens for d in server.info().datastores)


def test_a_corrupt_log_record_refuses_to_start_and_salvage_keeps_the_rest(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    server = DrafterProcess(data_dir, "--rebuild-min-tokens", "1000000000")
    written = docs(50, seed=1)
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.DrafterServiceStub(channel)
        for doc in written:  # 50 acknowledged ingests, each durable when answered
            answer = stub.Ingest(pb.IngestRequest(sequences=[pb.TokenSequence(tokens=doc)]),
                                 timeout=10)  # fmt: skip
            assert answer.accepted == 1
    assert server.proc is not None
    server.proc.kill()  # kill -9
    server.proc.wait()
    server.proc = None
    segment = max((data_dir / "wal").glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x5A  # one flipped byte in the middle of the newest segment
    segment.write_bytes(bytes(data))

    refused = serve_once(data_dir)
    assert refused.returncode == 3, refused.stderr
    assert "damaged data" in refused.stderr and segment.name in refused.stderr
    assert "readable record(s)" in refused.stderr and "--salvage" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert segment.read_bytes() == bytes(data)  # nothing truncated: the evidence stays

    salvaged = DrafterProcess(data_dir, "--salvage", "true")
    try:
        kept = stored_tokens(salvaged)
        everything = sum(len(d) for d in written) + len(written) - 1  # separators between
        lost = [len(d) + 1 for d in written]
        assert everything - kept in lost  # exactly one record (the damaged one) is gone
        assert (data_dir / "wal" / "damaged" / segment.name).read_bytes() == bytes(data)
    finally:
        salvaged.stop()


def _two_snapshots_then_garbage(data_dir: Path) -> Path:
    """Ingest 10, snapshot s1, ingest 10, snapshot s2, stop; garbage in s2's manifest."""
    live = LiveDatastore(data_dir, TOKENIZER, LivePolicy(keep_snapshots=5), background=False)
    for doc in docs(10, seed=2):
        live.ingest(doc)
    live.rebuild()
    live.snapshot("s1")
    for doc in docs(10, seed=3):
        live.ingest(doc)
    live.rebuild()
    live.snapshot("s2")
    live.close()
    manifest = data_dir / "snapshots" / "s2" / "manifest.json"
    manifest.write_text("{ this is not json")
    return manifest


def test_an_unreadable_newest_snapshot_refuses_to_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    manifest = _two_snapshots_then_garbage(data_dir)
    with pytest.raises(DamagedDataError, match=r"s2/manifest\.json.*newest readable snapshot "
                       r"s1 covers the ingest log through record 10"):  # fmt: skip
        LiveDatastore(data_dir, TOKENIZER, background=False)

    refused = serve_once(data_dir)
    assert refused.returncode == 3 and str(manifest) in refused.stderr, refused.stderr
    assert "--salvage" in refused.stderr and "Traceback" not in refused.stderr
    assert manifest.read_text() == "{ this is not json"  # left as it was


def test_salvage_moves_the_damaged_snapshot_aside_and_serves_the_rest(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    _two_snapshots_then_garbage(data_dir)
    live = LiveDatastore(data_dir, TOKENIZER, background=False, salvage=True)
    try:
        assert [s.path.name for s in list_snapshots(data_dir / "snapshots")] == ["s1"]
        assert (data_dir / "damaged" / "s2" / "manifest.json").exists()
        assert live.stats().num_tokens == live.datastore.num_tokens > 0
    finally:
        live.close()


def test_an_unreadable_snapshot_the_log_still_covers_only_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "data"
    live = LiveDatastore(data_dir, TOKENIZER, LivePolicy(keep_snapshots=5), background=False)
    for doc in docs(5, seed=4):
        live.ingest(doc)
    live.close()  # no snapshot yet: the log holds every record
    broken = data_dir / "snapshots" / "half-copied"
    broken.mkdir()
    (broken / "manifest.json").write_text("[]")
    again = LiveDatastore(data_dir, TOKENIZER, background=False)
    try:
        assert again.datastore.num_tokens > 0
        assert "nothing is lost" in caplog.text and broken.exists()
    finally:
        again.close()
