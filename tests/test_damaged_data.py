"""Damage on disk never costs acknowledged data silently (issue 17, items 1 and 2; issue 29:
a flipped manifest bit, a damaged last log record, a snapshot file failing its checksum, a
log that does not continue where the snapshot ends): the real `drafter serve` refuses to
start, naming the file and what would be lost, and `--salvage true` starts with everything
readable, the damaged files moved aside."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest
from client_servers import VOCAB_SIZE, DrafterProcess, drafter_command

from drafter_service.live.ingest_log import IngestLog, WalCorruptError
from drafter_service.live.live_datastore import LiveDatastore, LivePolicy
from drafter_service.replication.peer_bootstrap import offset_on_disk
from drafter_service.snapshot.array_files import DamagedDataError
from drafter_service.snapshot.store import TokenizerIdentity, list_snapshots, read_manifest
from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc

pytestmark = pytest.mark.system

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


def _two_snapshots(data_dir: Path, after: int = 0) -> None:
    """Ingest 10, snapshot s1, ingest 10, snapshot s2 (the log through record 20 is
    discarded), ingest ``after`` more (waiting in the log), stop."""
    live = LiveDatastore(data_dir, TOKENIZER, LivePolicy(keep_snapshots=5), background=False)
    for doc in docs(10, seed=2):
        live.ingest(doc)
    live.rebuild()
    live.snapshot("s1")
    for doc in docs(10, seed=3):
        live.ingest(doc)
    live.rebuild()
    live.snapshot("s2")
    for doc in docs(after, seed=4):
        live.ingest(doc)
    live.close()


def _two_snapshots_then_garbage(data_dir: Path) -> Path:
    """:func:`_two_snapshots`, then garbage in s2's manifest."""
    _two_snapshots(data_dir)
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


# -- issue 29: no silent start after damage -------------------------------------------------


def test_a_flipped_bit_in_the_newest_manifest_refuses_to_start(tmp_path: Path) -> None:
    """One bit of s2's created_unix flipped (older than s1: s1 would be loaded, and the
    ingests only s2 holds served no more): the manifest fails its own checksum."""
    data_dir = tmp_path / "data"
    _two_snapshots(data_dir)
    manifest = data_dir / "snapshots" / "s2" / "manifest.json"
    text = manifest.read_bytes()
    at = text.index(b'"created_unix": ') + len(b'"created_unix": ')
    digit = next(i for i in range(at + 1, at + 10) if text[i] in b"13579")  # odd: flip lowers it
    flipped = bytearray(text)
    flipped[digit] ^= 0x01
    manifest.write_bytes(bytes(flipped))

    refused = serve_once(data_dir)
    assert refused.returncode == 3, refused.stderr
    assert f"{manifest}: manifest fails its checksum" in refused.stderr, refused.stderr
    assert "--salvage true" in refused.stderr and "Traceback" not in refused.stderr
    assert manifest.read_bytes() == bytes(flipped)  # left as it was


def test_a_log_that_starts_after_the_loaded_snapshot_is_a_gap_not_covered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """s2 gone: s1 covers records 1-10, the log starts at 21. Records 11-20 are nowhere."""
    data_dir = tmp_path / "data"
    _two_snapshots(data_dir, after=5)
    shutil.rmtree(data_dir / "snapshots" / "s2")
    with pytest.raises(DamagedDataError, match=r"s1, covers the ingest log through record 10, "
                       r"but the log .* starts at record 21: records 11 to 20 are in neither.*"
                       r"--salvage true"):  # fmt: skip
        LiveDatastore(data_dir, TOKENIZER, background=False)
    live = LiveDatastore(data_dir, TOKENIZER, background=False, salvage=True)
    try:
        assert live.stats().num_tokens > 0 and "--salvage: serving what remains" in caplog.text
    finally:
        live.close()


def test_a_damaged_last_log_record_refuses_to_start_and_salvage_drops_only_it(
    tmp_path: Path,
) -> None:
    """A bit flipped in the last record, whole and acknowledged: damage, not a torn tail."""
    data_dir = tmp_path / "data"
    written = docs(20, seed=5)
    live = LiveDatastore(data_dir, TOKENIZER, LivePolicy(rebuild_min_tokens=10**9),
                         background=False)  # fmt: skip
    for doc in written:
        live.ingest(doc)
    live.close()
    segment = max((data_dir / "wal").glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0x10  # inside the last record's tokens
    segment.write_bytes(bytes(data))

    refused = serve_once(data_dir)
    assert refused.returncode == 3, refused.stderr
    assert f"{segment}: the last record, at byte" in refused.stderr, refused.stderr
    assert "not a torn tail" in refused.stderr and "--salvage true" in refused.stderr
    assert segment.read_bytes() == bytes(data) and not list(segment.parent.glob("*.torn-*"))

    salvaged = DrafterProcess(data_dir, "--salvage", "true")
    try:
        everything = sum(len(d) for d in written) + len(written) - 1  # separators between
        assert everything - stored_tokens(salvaged) == len(written[-1]) + 1  # only it is gone
        assert (data_dir / "wal" / "damaged" / segment.name).read_bytes() == bytes(data)
    finally:
        salvaged.stop()


def test_a_snapshot_file_failing_its_checksum_refuses_and_salvage_serves_the_rest(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    _two_snapshots(data_dir)
    s1, s2 = (data_dir / "snapshots" / name for name in ("s1", "s2"))
    served_by_s1 = read_manifest(s1).num_tokens
    # a file of s2 alone (unchanged sub-indices are hardlinked from s1)
    damaged = next(p for p in sorted(s2.glob("*.i32")) if p.stat().st_nlink == 1
                   and p.stat().st_size)  # fmt: skip
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(data))

    refused = serve_once(data_dir)
    assert refused.returncode == 3, refused.stderr
    assert f"{damaged} fails its checksum" in refused.stderr, refused.stderr
    assert "--salvage true" in refused.stderr and "Traceback" not in refused.stderr
    assert damaged.read_bytes() == bytes(data)

    salvaged = DrafterProcess(data_dir, "--salvage", "true")
    try:
        assert stored_tokens(salvaged) == served_by_s1
        assert (data_dir / "damaged" / "s2" / damaged.name).read_bytes() == bytes(data)
        assert [s.path.name for s in list_snapshots(data_dir / "snapshots")] == ["s1"]
    finally:
        salvaged.stop()


def test_the_shared_log_check_before_a_bootstrap_reads_a_damaged_log_as_opening_does(
    tmp_path: Path,
) -> None:
    """With --shared-log and --bootstrap-peers, the replica reads its log for the newest
    stream entry before opening the datastore: a damaged record refuses there too, and
    --salvage keeps the readable records there as it will at the open (it used to refuse
    even with --salvage true, so the salvage asked for never ran)."""
    wal = tmp_path / "wal"
    ingest_log = IngestLog(wal)
    for i in range(1, 6):
        ingest_log.append(np.arange(i, i + 50, dtype=np.int32), origin=(1000 + i, 0))
    ingest_log.close()
    (segment,) = wal.glob("*.log")
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x5A  # one flipped byte in the middle of the segment
    segment.write_bytes(bytes(data))
    with pytest.raises(WalCorruptError, match="--salvage true"):
        offset_on_disk(tmp_path)
    assert offset_on_disk(tmp_path, salvage=True) == (1005, 0)  # the records after it kept
