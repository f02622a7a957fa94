"""The ingest log: durable appends, torn-tail recovery, corruption refused, segments discarded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from drafter_service.live.ingest_log import IngestLog, WalCorruptError
from drafter_service.live.stream_ids import StreamId


def docs(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, size=rng.integers(1, 50)).astype(np.int32) for _ in range(n)]


def test_records_survive_reopen_in_order(tmp_path: Path) -> None:
    log = IngestLog(tmp_path)
    written = docs(30)
    seqs = [log.append(d) for d in written]
    assert seqs == list(range(1, 31))
    log.close()
    again = IngestLog(tmp_path)
    got = again.recovered()
    assert [s for s, *_ in got] == seqs
    assert all(np.array_equal(a, b) for (_, a, _), b in zip(got, written, strict=True))
    assert again.append(docs(1, seed=9)[0]) == 31


@pytest.mark.parametrize("cut", [1, 7, 16, 20])
def test_torn_tail_is_truncated_and_earlier_records_kept(tmp_path: Path, cut: int) -> None:
    log = IngestLog(tmp_path)
    for d in docs(5):
        log.append(d)
    log.close()
    segment = next(tmp_path.iterdir())
    size = segment.stat().st_size
    with open(segment, "r+b") as f:  # a crash in the middle of the last append
        f.truncate(size - cut)
    again = IngestLog(tmp_path)
    assert [s for s, *_ in again.recovered()] == [1, 2, 3, 4]
    assert again.append(np.array([1, 2], dtype=np.int32)) == 5
    again.close()
    assert [s for s, *_ in IngestLog(tmp_path).recovered()] == [1, 2, 3, 4, 5]


def test_flipped_byte_in_an_older_segment_is_refused(tmp_path: Path) -> None:
    log = IngestLog(tmp_path)
    log.append(np.arange(10, dtype=np.int32))
    log.roll()
    log.append(np.arange(5, dtype=np.int32))
    log.close()
    oldest = sorted(tmp_path.iterdir())[0]
    data = bytearray(oldest.read_bytes())
    data[30] ^= 0xFF
    oldest.write_bytes(bytes(data))
    with pytest.raises(WalCorruptError, match=oldest.name):
        IngestLog(tmp_path)


def test_discard_through_deletes_only_covered_segments(tmp_path: Path) -> None:
    log = IngestLog(tmp_path)
    for d in docs(3):
        log.append(d)  # segment 1: seqs 1-3
    log.roll()
    for d in docs(2, seed=1):
        log.append(d)  # segment 2: seqs 4-5
    log.discard_through(2)
    assert len(list(tmp_path.iterdir())) == 2  # segment 1 still holds seq 3
    log.discard_through(3)
    assert [p.name for p in tmp_path.iterdir()] == [f"{4:020d}.log"]
    log.close()
    assert [s for s, *_ in IngestLog(tmp_path, covered_seq=3).recovered()] == [4, 5]


def test_numbering_continues_after_the_snapshot_position(tmp_path: Path) -> None:
    log = IngestLog(tmp_path)
    log.append(np.arange(3, dtype=np.int32))
    log.roll()
    log.discard_through(1)
    assert not any(tmp_path.iterdir())  # everything covered: no segment left
    log.close()
    again = IngestLog(tmp_path, covered_seq=1)
    assert again.recovered() == []
    assert again.append(np.arange(2, dtype=np.int32)) == 2


def _fifty_records_then_flip(tmp_path: Path) -> tuple[Path, int]:
    """The issue's reproduction: 50 acknowledged records, one byte flipped mid-segment."""
    log = IngestLog(tmp_path)
    for d in docs(50, seed=3):
        log.append(d)
    log.close()
    segment = next(p for p in tmp_path.iterdir() if p.suffix == ".log")
    data = bytearray(segment.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0x5A
    segment.write_bytes(bytes(data))
    return segment, middle


def test_a_flipped_byte_in_the_newest_segment_is_refused_not_cut(tmp_path: Path) -> None:
    segment, _ = _fifty_records_then_flip(tmp_path)
    before = segment.read_bytes()
    with pytest.raises(WalCorruptError, match=rf"{segment.name}: unreadable record at byte \d+ "
                       r"of \d+, followed by \d+ readable record\(s\).*--salvage"):  # fmt: skip
        IngestLog(tmp_path)
    assert segment.read_bytes() == before  # the evidence is untouched


def test_salvage_keeps_every_readable_record_and_the_damaged_segment(tmp_path: Path) -> None:
    segment, _ = _fifty_records_then_flip(tmp_path)
    damaged = segment.read_bytes()
    log = IngestLog(tmp_path, salvage=True)
    seqs = [s for s, *_ in log.recovered()]
    assert len(seqs) == 49 and seqs == sorted(seqs) and seqs[-1] == 50  # one record lost
    assert (tmp_path / "damaged" / segment.name).read_bytes() == damaged
    assert log.append(np.arange(4, dtype=np.int32)) == 51
    log.close()
    again = [s for s, *_ in IngestLog(tmp_path).recovered()]  # clean now: no flag needed
    assert again == [*seqs, 51]


def test_a_torn_tail_is_kept_beside_the_segment(tmp_path: Path) -> None:
    log = IngestLog(tmp_path)
    for d in docs(3):
        log.append(d)
    log.close()
    segment = next(tmp_path.iterdir())
    whole = segment.read_bytes()
    segment.write_bytes(whole[:-5])  # the last append, cut short by a crash
    assert [s for s, *_ in IngestLog(tmp_path).recovered()] == [1, 2]
    torn = [p for p in tmp_path.iterdir() if ".torn-" in p.name]
    assert len(torn) == 1 and whole.startswith(segment.read_bytes() + torn[0].read_bytes())


# -- issue 29: a whole last record failing its checksum is damage, not a torn tail ----------


def _last_record(tmp_path: Path, origin: StreamId | None = None) -> tuple[Path, bytes, int]:
    """Five records, the last taken from the shared stream when ``origin`` is given:
    the segment, its bytes and the offset of its last record."""
    log = IngestLog(tmp_path)
    for d in docs(4):
        log.append(d)
    log.append(np.array([7, 8, 9], dtype=np.int32), origin)
    log.close()
    segment = next(tmp_path.iterdir())
    data = segment.read_bytes()
    return segment, data, len(data) - (20 + 16 * (origin is not None) + 12)


@pytest.mark.parametrize(("field", "at", "mask"), [  # WAL1: magic, seq u64, n u32, crc u32
    ("magic", 0, 0x01), ("seq", 4, 0x01), ("n_tokens, larger", 15, 0x80),
    ("n_tokens, smaller", 12, 0x01), ("crc", 16, 0x01), ("tokens", 20, 0x01),
])  # fmt: skip
def test_a_flipped_bit_in_the_last_whole_record_is_refused_not_cut(
    tmp_path: Path, field: str, at: int, mask: int
) -> None:
    segment, data, last = _last_record(tmp_path)
    flipped = bytearray(data)
    flipped[last + at] ^= mask
    segment.write_bytes(bytes(flipped))
    why = rf"{segment.name}: the last record, at byte {last} of {len(data)}, is whole .* not a"
    with pytest.raises(WalCorruptError, match=rf"{why} torn tail.*--salvage true"):
        IngestLog(tmp_path)
    assert segment.read_bytes() == bytes(flipped)  # nothing cut: the evidence stays
    assert sorted(p.name for p in tmp_path.iterdir()) == [segment.name]


def test_salvage_drops_only_a_damaged_last_record_and_keeps_its_bytes(tmp_path: Path) -> None:
    segment, data, _ = _last_record(tmp_path)
    flipped = bytearray(data)
    flipped[-1] ^= 0x40
    segment.write_bytes(bytes(flipped))
    log = IngestLog(tmp_path, salvage=True)
    assert [s for s, *_ in log.recovered()] == [1, 2, 3, 4]
    assert (tmp_path / "damaged" / segment.name).read_bytes() == bytes(flipped)
    assert log.append(np.arange(3, dtype=np.int32)) == 5
    log.close()


def test_every_bit_flip_of_a_last_shared_stream_record_is_refused(tmp_path: Path) -> None:
    segment, data, last = _last_record(tmp_path, StreamId(1_700_000_000_000, 3))
    refused = 0
    for bit in range(8 * last, 8 * len(data)):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        segment.write_bytes(bytes(flipped))
        try:
            IngestLog(tmp_path).close()
        except WalCorruptError:
            refused += 1
    assert refused == 8 * (len(data) - last)
    assert sorted(p.name for p in tmp_path.iterdir()) == [segment.name]


@pytest.mark.parametrize("torn_bytes", [0, 9])
def test_a_crash_after_creating_a_segment_leaves_a_log_that_appends(
    tmp_path: Path, torn_bytes: int
) -> None:
    """kill -9 between creating a new segment and writing its first record (an empty file,
    or one recovery cuts to nothing): after reopening, the datastore folds and rolls, and
    the next append goes into that same segment instead of failing to create it."""
    log = IngestLog(tmp_path)
    for d in docs(5):
        log.append(d)
    log.roll()
    log.close()
    torn = b"WAL1\x06" + bytes(torn_bytes - 5) if torn_bytes else b""
    (tmp_path / f"{6:020d}.log").write_bytes(torn)
    again = IngestLog(tmp_path)
    assert [s for s, *_ in again.recovered()] == [1, 2, 3, 4, 5]
    again.roll()  # what a fold after recovery does
    assert again.append(np.array([7, 8], dtype=np.int32)) == 6
    again.close()
    assert [s for s, *_ in IngestLog(tmp_path).recovered()] == [1, 2, 3, 4, 5, 6]


def test_a_segment_holding_bytes_of_another_numbering_is_refused(tmp_path: Path) -> None:
    log = IngestLog(tmp_path)
    log.append(docs(1)[0])
    log.roll()
    (tmp_path / f"{2:020d}.log").write_bytes(b"not a record")  # written behind the log's back
    with pytest.raises(WalCorruptError, match="already exists and holds 12 bytes"):
        log.append(docs(1)[0])
