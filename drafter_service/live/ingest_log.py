"""Append-only ingest log (write-ahead log) of the live datastore.

Every record is fsynced before ``append`` returns, so an acknowledged ingest survives
``kill -9`` and power loss. Segments are named by their first record's sequence number;
``roll`` starts a new one once everything is folded into sub-indices, and
``discard_through`` deletes those a snapshot covers. Record layouts (little-endian)::

    magic u32 = 0x314C4157 ("WAL1") | seq u64 | n_tokens u32 | crc32 u32 | n_tokens x int32
    magic u32 = 0x324C4157 ("WAL2") | seq u64 | n_tokens u32 | crc32 u32
                                    | origin ms u64 | origin seq u64 | n_tokens x int32

``WAL2`` carries the shared-stream entry id (``origin``) so the newest record says where
consuming resumes; other documents are ``WAL1``. The CRC covers seq, n_tokens, origin and
payload. A crash can only tear the newest segment's last record (cut short or zeros,
nothing readable after it): recovery moves those never-acknowledged bytes aside
(``<segment>.torn-<offset>``, kept as evidence) and truncates there. Any other bad record,
including a whole last record failing its CRC (its append completed, so it was
acknowledged), is corruption: opening refuses (:class:`WalCorruptError`, naming file,
offset and what would be lost) unless ``salvage`` moves the segment into ``damaged/`` and
keeps a copy of every readable record.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from drafter_service.live.stream_ids import StreamId
from drafter_service.snapshot.array_files import DamagedDataError, fsync_dir, move_aside

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<IQII")
_ORIGIN = struct.Struct("<QQ")  # after the header of a WAL2 record
_MAGIC = 0x314C4157
_MAGIC_ORIGIN = 0x324C4157
_MAGIC_PREFIX = b"WAL"  # both magics start so (little-endian)
_SUFFIX = ".log"


class LogRecord(NamedTuple):
    """One record; ``origin``: its shared-stream entry id, if it came from the stream."""

    seq: int
    tokens: npt.NDArray[np.int32]
    origin: StreamId | None = None


class WalCorruptError(DamagedDataError):
    """A log record outside the torn tail is unreadable."""


def _crc(seq: int, payload: bytes, origin: StreamId | None = None) -> int:
    head = struct.pack("<QI", seq, len(payload) // 4)
    if origin is not None:
        head += _ORIGIN.pack(*origin)
    return zlib.crc32(payload, zlib.crc32(head))


def _torn(data: bytes, offset: int) -> bool:
    """Whether the unreadable bytes from ``offset`` on can be an append a crash cut short:
    zeros, less than a header, or a header announcing more bytes than follow (unless they
    match its CRC: a whole record under a damaged length). A whole record failing its CRC,
    or a header with no magic, is damage: that append completed and was acknowledged."""
    header = _header_at(data, offset)
    if header is None or not data[offset:].strip(b"\0"):
        return True
    magic, seq, n, crc, origin, start = header
    if magic not in (_MAGIC, _MAGIC_ORIGIN) or start + 4 * n <= len(data):
        return False
    rest = data[start:]
    return len(rest) % 4 != 0 or _crc(seq, rest, origin) != crc


def _header_at(
    data: bytes, offset: int
) -> tuple[int, int, int, int, StreamId | None, int] | None:
    """(magic, seq, n, crc, origin, payload start) at ``offset``; None past the end."""
    if offset + _HEADER.size > len(data):
        return None
    magic, seq, n, crc = _HEADER.unpack_from(data, offset)
    start = offset + _HEADER.size
    if magic != _MAGIC_ORIGIN:
        return magic, seq, n, crc, None, start
    if start + _ORIGIN.size > len(data):
        return None
    return magic, seq, n, crc, StreamId(*_ORIGIN.unpack_from(data, start)), start + _ORIGIN.size


def _first_seq(segment: Path) -> int:
    return int(segment.name[: -len(_SUFFIX)])


class IngestLog:
    """The log in ``directory``. Not thread-safe: the live datastore serialises calls."""

    def __init__(
        self, directory: str | Path, *, covered_seq: int = 0, salvage: bool = False
    ) -> None:
        """Opens (or creates) the log. Numbering continues after ``covered_seq`` (what the
        newest snapshot covers) even if every segment was discarded; only later records
        are :meth:`recovered`. ``salvage``: keep a corrupt segment's readable records."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._salvage = salvage
        self._last_seq = 0
        self._last_origin: StreamId | None = None
        self._file: int | None = None  # fd of the newest segment, opened for appending
        self._records = [r for r in self._recover() if r.seq > covered_seq]
        self._last_seq = max(self._last_seq, covered_seq)

    # -- recovery ---------------------------------------------------------------------------

    def _segments(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if p.name.endswith(_SUFFIX))

    @property
    def first_seq(self) -> int | None:
        """Sequence number the oldest segment starts at (None: no segment)."""
        segments = self._segments()
        return _first_seq(segments[0]) if segments else None

    def _recover(self) -> Iterator[LogRecord]:
        segments = self._segments()
        for i, path in enumerate(segments):
            newest = i == len(segments) - 1
            data = path.read_bytes()
            offset = 0
            while offset < len(data):
                record = self._parse(data, offset)
                if record is None:
                    after = self._readable_after(data, offset)
                    if newest and not after and _torn(data, offset):
                        self._cut_torn_tail(path, data, offset)
                        break
                    if not self._salvage:
                        raise WalCorruptError(
                            self._corruption(path, data, offset, len(after), len(segments) - 1 - i)
                        )
                    yield from self._salvaged(path, data, offset)
                    break
                offset = record[1]
                yield self._took(record[0])
        if segments:
            self._file = os.open(segments[-1], os.O_WRONLY | os.O_APPEND)

    def _corruption(self, path: Path, data: bytes, offset: int, after: int, later: int) -> str:
        fix = (
            "Restore the file, or start with --salvage true to keep every readable record "
            f"and move {path.name} aside into {self.directory / 'damaged'}"
        )
        if after == 0 and later == 0:  # the last record: whole, so it was acknowledged
            return (
                f"ingest log {path}: the last record, at byte {offset} of {len(data)}, is "
                "whole (every byte its header announces is there) but fails its checksum: it "
                "is damage, not a torn tail (an append cut short), and its ingest was "
                f"acknowledged, so starting would drop it. {fix}"
            )
        return (
            f"ingest log {path}: unreadable record at byte {offset} of {len(data)}, followed "
            f"by {after} readable record(s) in this segment and {later} later segment(s): it "
            "is corruption, not a torn tail, and starting would drop acknowledged ingests "
            f"(the damaged record and everything after it). {fix}"
        )

    def _took(self, record: LogRecord) -> LogRecord:
        self._last_seq = record.seq
        if record.origin is not None:
            self._last_origin = record.origin
        return record

    def _readable_after(self, data: bytes, offset: int) -> list[tuple[int, tuple[LogRecord, int]]]:
        """Each readable record (magic, CRC, seq past the last good one) after ``offset``,
        with its offset."""
        found = []
        pos = data.find(_MAGIC_PREFIX, offset + 1)
        while pos >= 0:
            record = self._parse(data, pos)
            if record is not None:
                found.append((pos, record))
            pos = data.find(_MAGIC_PREFIX, pos + 1 if record is None else record[1])
        return found

    def _cut_torn_tail(self, path: Path, data: bytes, offset: int) -> None:
        """Keeps an interrupted append's bytes beside the segment, then truncates it."""
        torn = path.with_name(f"{path.name}.torn-{offset}")
        with open(torn, "wb") as f:
            f.write(data[offset:])
            os.fsync(f.fileno())
        with open(path, "r+b") as f:
            f.truncate(offset)
            os.fsync(f.fileno())
        fsync_dir(self.directory)
        log.warning(
            "ingest log %s: torn tail at byte %d (%d bytes of an unacknowledged append) "
            "cut off; the bytes are kept in %s", path, offset, len(data) - offset, torn.name,
        )  # fmt: skip

    def _salvaged(self, path: Path, data: bytes, offset: int) -> Iterator[LogRecord]:
        """--salvage: moves the segment aside, rewrites it with its readable records."""
        kept = self._readable_after(data, offset)
        moved = move_aside(path, self.directory / "damaged")
        with open(path, "wb") as f:
            f.write(data[:offset] + b"".join(data[pos : record[1]] for pos, record in kept))
            os.fsync(f.fileno())
        fsync_dir(self.directory)
        log.error(
            "ingest log %s: unreadable record at byte %d; --salvage kept %d later readable "
            "record(s) and moved the damaged segment to %s", path, offset, len(kept), moved,
        )  # fmt: skip
        for _, (record, _) in kept:
            yield self._took(record)

    def _parse(self, data: bytes, offset: int) -> tuple[LogRecord, int] | None:
        """The record at ``offset`` and the offset after it; None when unreadable."""
        header = _header_at(data, offset)
        if header is None or header[0] not in (_MAGIC, _MAGIC_ORIGIN):
            return None
        _, seq, n, crc, origin, start = header
        end = start + 4 * n
        if end > len(data) or seq <= self._last_seq:
            return None
        payload = data[start:end]
        if _crc(seq, payload, origin) != crc:
            return None
        tokens = np.frombuffer(payload, dtype="<i4").astype(np.int32)
        return LogRecord(seq, tokens, origin), end

    def recovered(self) -> list[LogRecord]:
        """Records found on open, in order (handed out once)."""
        records, self._records = self._records, []
        return records

    # -- appending --------------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """The newest record's sequence number (0: none ever)."""
        return self._last_seq

    @property
    def last_origin(self) -> StreamId | None:
        """The newest held or appended record's stream entry id (None: none)."""
        return self._last_origin

    def append(self, tokens: npt.NDArray[np.int32], origin: StreamId | None = None) -> int:
        """Appends one record and fsyncs it; returns its sequence number."""
        seq = self._last_seq + 1
        payload = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
        crc = _crc(seq, payload, origin)
        magic, head = (_MAGIC, b"") if origin is None else (_MAGIC_ORIGIN, _ORIGIN.pack(*origin))
        record = _HEADER.pack(magic, seq, len(payload) // 4, crc) + head + payload
        if self._file is None:
            self._open_segment(seq)
        assert self._file is not None
        written = os.write(self._file, record)
        if written != len(record):  # a short write on a full disk: undo and fail
            os.ftruncate(self._file, os.fstat(self._file).st_size - written)
            raise OSError(
                errno.ENOSPC, f"ingest log: short write ({written} of {len(record)} bytes)"
            )
        os.fsync(self._file)
        return self._took(LogRecord(seq, tokens, origin)).seq

    def _open_segment(self, first_seq: int) -> None:
        """Creates the segment for ``first_seq``. An empty one (a crash before its first
        record, or a torn first record cut) is reused; one holding bytes is refused."""
        path = self.directory / f"{first_seq:020d}{_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        if size:
            os.close(fd)
            raise WalCorruptError(
                f"ingest log {path}: the segment for record {first_seq} on already exists "
                f"and holds {size} bytes that no record of this log accounts for (another "
                "process writing the same directory?); move the file aside and restart"
            )
        self._file = fd
        fsync_dir(self.directory)

    def roll(self) -> None:
        """Starts a new segment at the next record."""
        if self._file is not None:
            os.close(self._file)
            self._file = None

    def discard_through(self, seq: int) -> None:
        """Deletes the segments a snapshot covers (all records <= ``seq``)."""
        segments = self._segments()
        for path, nxt in itertools.pairwise(segments):
            if _first_seq(nxt) - 1 <= seq:
                path.unlink()
        if segments and self._file is None and self._last_seq <= seq:
            segments[-1].unlink()  # closed newest segment, fully covered
        fsync_dir(self.directory)

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self._segments())

    def close(self) -> None:
        self.roll()
