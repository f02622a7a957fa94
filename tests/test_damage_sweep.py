"""No silent start after damage (issue 29): every single-bit flip of the newest snapshot's
manifest, and of the last (whole, acknowledged) ingest-log record, either refuses to start
with the damage error (`drafter serve` exits 3 on it) or starts with every acknowledged
ingest present. In-process, against :func:`open_live_parts`, which `drafter serve` opens
its live datastore with (tests/test_damaged_data.py runs the real process)."""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from drafter_service.datastore.sub_indices import SEPARATOR
from drafter_service.live.index_set import IndexSet
from drafter_service.live.live_datastore import LiveDatastore, LivePolicy
from drafter_service.live.pending_buffer import PendingBuffer
from drafter_service.live.startup import open_live_parts
from drafter_service.snapshot.array_files import DamagedDataError
from drafter_service.snapshot.store import TokenizerIdentity

VOCAB_SIZE = 1000
TOKENIZER = TokenizerIdentity("test-vocab", VOCAB_SIZE)
_HEADER = struct.Struct("<IQII")  # WAL1: magic, seq, n_tokens, crc32


_rng = np.random.default_rng(29)
WRITTEN = [tuple(_rng.integers(0, VOCAB_SIZE, int(_rng.integers(3, 12))).tolist())
           for _ in range(70)]  # fmt: skip
"""The 70 acknowledged documents of the ``data_dir`` fixture."""


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """WRITTEN[:30] ingested in snapshot s1, 30 more in s2 (the log they were in is
    discarded), then the last 10 waiting in the log."""
    data_dir = tmp_path / "data"
    live = LiveDatastore(data_dir, TOKENIZER, LivePolicy(keep_snapshots=5), background=False)
    for name, batch in (("s1", WRITTEN[:30]), ("s2", WRITTEN[30:60])):
        for doc in batch:
            live.ingest(doc)
        live.rebuild()
        live.snapshot(name)
    for doc in WRITTEN[60:]:
        live.ingest(doc)
    live.close()
    return data_dir


def held(buffer: PendingBuffer, index_set: IndexSet) -> Counter[tuple[int, ...]]:
    """Every document the opened parts hold: in their sub-indices or waiting in the log."""
    docs: Counter[tuple[int, ...]] = Counter()
    index = index_set.state
    for sub in (*(s for c in index.corpora for s in c.sub_indices), *index.learned):
        doc: list[int] = []
        for token in [*np.asarray(sub.tokens()).tolist(), SEPARATOR]:
            if token != SEPARATOR:
                doc.append(token)
            elif doc:
                docs[tuple(doc)] += 1
                doc = []
    docs.update(tuple(record.tokens.tolist()) for record in buffer.take())
    return docs


def put_byte(path: Path, at: int, value: int) -> None:
    """Overwrites one byte in place (no truncation, so no forced writeback: fast)."""
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([value]))


def sweep(
    path: Path, lo: int, hi: int, data_dir: Path, restore: Callable[[], None]
) -> Counter[str]:
    """Flips every bit of ``path``'s bytes [lo, hi) in turn and opens the datastore:
    counts each outcome; a start with an acknowledged document missing is "silent loss"."""
    original = path.read_bytes()
    everything = Counter(WRITTEN)
    outcomes: Counter[str] = Counter()
    for bit in range(8 * lo, 8 * hi):
        at = bit // 8
        put_byte(path, at, original[at] ^ (1 << (bit % 8)))
        try:
            buffer, index = open_live_parts(data_dir, TOKENIZER, None, False)
        except DamagedDataError:
            outcomes["refused as damage"] += 1
            continue
        except Exception as exc:  # any other refusal is not the damage error (exit 2, 1)
            outcomes[f"other error: {type(exc).__name__}"] += 1
            continue
        finally:
            restore()
            if path.stat().st_size == len(original):
                put_byte(path, at, original[at])
            else:  # cut (as a torn tail)
                path.write_bytes(original)
        buffer.close_log()
        missing = everything - held(buffer, index)
        outcomes["silent loss" if missing else "started, all present"] += 1
    assert path.read_bytes() == original
    return outcomes


def test_every_bit_flip_of_the_newest_manifest_refuses_or_keeps_everything(
    data_dir: Path,
) -> None:
    manifest = data_dir / "snapshots" / "s2" / "manifest.json"
    size = manifest.stat().st_size
    outcomes = sweep(manifest, 0, size, data_dir, lambda: None)
    assert sum(outcomes.values()) == 8 * size
    assert set(outcomes) <= {"refused as damage", "started, all present"}, outcomes
    assert outcomes["refused as damage"] > 0.9 * 8 * size, outcomes


def last_record_offset(segment: Path) -> int:
    data = segment.read_bytes()
    offset = last = 0
    while offset < len(data):
        last = offset
        offset += _HEADER.size + 4 * _HEADER.unpack_from(data, offset)[2]
    assert offset == len(data)
    return last


def test_every_bit_flip_of_the_last_log_record_refuses_or_keeps_everything(
    data_dir: Path,
) -> None:
    wal = data_dir / "wal"
    segment = max(wal.glob("*.log"))
    start = last_record_offset(segment)

    def remove_torn_tails() -> None:  # what a (wrongly) cut tail leaves beside the segment
        for torn in wal.glob("*.torn-*"):
            torn.unlink()

    outcomes = sweep(segment, start, segment.stat().st_size, data_dir, remove_torn_tails)
    assert outcomes == {"refused as damage": 8 * (segment.stat().st_size - start)}, outcomes
