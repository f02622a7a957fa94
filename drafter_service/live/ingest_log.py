"""Append-only ingest log (write-ahead log) of the live datastore.

Every ingested token sequence is appended and fsynced before ``append``
returns, so an acknowledged ingest survives ``kill -9`` and power loss. The
log is a directory of segments named by the sequence number of their first
record; a new segment starts whenever the datastore has folded everything so
far into its sub-indices (``roll``), and a segment is deleted once a snapshot
covers all of its records (``discard_through``).

Record layouts (little-endian)::

    magic u32 = 0x314C4157 ("WAL1") | seq u64 | n_tokens u32 | crc32 u32 | n_tokens x int32
    magic u32 = 0x324C4157 ("WAL2") | seq u64 | n_tokens u32 | crc32 u32
                                    | origin ms u64 | origin seq u64 | n_tokens x int32

A ``WAL2`` record is a document taken from the shared ingest stream and carries its
stream entry id (its ``origin``), so the newest record says where consuming resumes;
documents ingested with no shared log are written as ``WAL1``, byte for byte as before.
The CRC covers seq, n_tokens, the origin (``WAL2``) and the payload. A crash can only
tear the tail of the newest segment: the last record, cut short (fewer bytes than its
header says) or left unwritten (zeros), with no readable record after it. Recovery moves
those bytes aside (``<segment>.torn-<offset>``, never deleted: they are evidence) and
truncates the segment there; they were never acknowledged. A last record whose every
byte is there but that fails its CRC completed its append, so it was acknowledged: like
a bad record anywhere else, or one that readable records follow, it is corruption:
opening refuses (:class:`WalCorruptError`), naming the file, the offset and the records
that would be lost, unless ``salvage`` is set, in which case the damaged segment is moved
aside into ``damaged/`` and a copy holding every readable record replaces it.
"""

from __future__ import annotations

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
    """One record: its sequence number, its tokens and, for a document taken from the
    shared ingest stream, that stream's entry id."""

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
    """Whether the unreadable bytes from ``offset`` to the end can be an append a crash
    cut short: zeros (never written), fewer bytes than a header, or a header announcing
    more bytes than follow it, unless those bytes are a whole record under a damaged
    length field (they match its CRC). A whole record failing its checksum, or a whole
    header with no record's magic, is damage: that append completed, so it was
    acknowledged."""
    if not data[offset:].strip(b"\0"):
        return True
    header = _header_at(data, offset)
    if header is None:
        return True
    magic, seq, n, crc, origin, start = header
    if magic not in (_MAGIC, _MAGIC_ORIGIN):
        return False
    if start + 4 * n <= len(data):
        return False
    rest = data[start:]
    return len(rest) % 4 != 0 or _crc(seq, rest, origin) != crc


def _header_at(
    data: bytes, offset: int
) -> tuple[int, int, int, int, StreamId | None, int] | None:
    """The record header at ``offset``: (magic, seq, n, crc, origin, payload start), the
    origin read only under _MAGIC_ORIGIN; None when the bytes end before it does."""
    if offset + _HEADER.size > len(data):
        return None
    magic, seq, n, crc = _HEADER.unpack_from(data, offset)
    start = offset + _HEADER.size
    if magic != _MAGIC_ORIGIN:
        return magic, seq, n, crc, None, start
    if start + _ORIGIN.size > len(data):
        return None
    return magic, seq, n, crc, StreamId(*_ORIGIN.unpack_from(data, start)), start + _ORIGIN.size


def _segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{_SUFFIX}"


class IngestLog:
    """The log in ``directory``. Not thread-safe: the live datastore serialises calls."""

    def __init__(
        self, directory: str | Path, *, covered_seq: int = 0, salvage: bool = False
    ) -> None:
        """Opens (or creates) the log. ``covered_seq`` is the position the newest
        snapshot covers: numbering continues after it even if every segment was
        discarded, and only later records are returned by :meth:`recovered`.
        ``salvage``: keep every readable record of a corrupt segment instead of
        refusing to open (the segment itself is moved aside, never deleted)."""
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
        return int(segments[0].name[: -len(_SUFFIX)]) if segments else None

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
        """Why opening refuses: the damaged record at ``offset`` of ``path``."""
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
        """Notes ``record`` as the newest one read."""
        self._last_seq = record.seq
        if record.origin is not None:
            self._last_origin = record.origin
        return record

    def _readable_after(self, data: bytes, offset: int) -> list[tuple[int, tuple[LogRecord, int]]]:
        """The readable records after an unreadable one at ``offset``, each with its
        offset: a header with a magic and a matching CRC (its seq past the last good one)."""
        found = []
        pos = data.find(_MAGIC_PREFIX, offset + 1)
        while pos >= 0:
            record = self._parse(data, pos)
            if record is not None:
                found.append((pos, record))
                pos = record[1]
            else:
                pos += 1
            pos = data.find(_MAGIC_PREFIX, pos)
        return found

    def _cut_torn_tail(self, path: Path, data: bytes, offset: int) -> None:
        """An append a crash interrupted (never acknowledged): its bytes are kept beside
        the segment, then the segment is truncated at the last whole record."""
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
        """--salvage: every readable record from ``offset`` on; the segment is moved aside
        and rewritten with its readable records only."""
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
        """Records found on open, in order (consumed once by the live datastore)."""
        records, self._records = self._records, []
        return records

    # -- appending --------------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """Sequence number of the newest record (0 when the log has never held one)."""
        return self._last_seq

    @property
    def last_origin(self) -> StreamId | None:
        """Stream entry id of the newest record taken from the shared stream, among the
        records this log still holds or has appended since it was opened."""
        return self._last_origin

    def append(self, tokens: npt.NDArray[np.int32], origin: StreamId | None = None) -> int:
        """Appends one record (``origin``: its shared-stream entry id) and fsyncs it;
        returns its sequence number."""
        seq = self._last_seq + 1
        payload = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
        crc = _crc(seq, payload, origin)
        n = len(payload) // 4
        if origin is None:
            record = _HEADER.pack(_MAGIC, seq, n, crc) + payload
        else:
            record = _HEADER.pack(_MAGIC_ORIGIN, seq, n, crc) + _ORIGIN.pack(*origin) + payload
        if self._file is None:
            self._open_segment(seq)
        assert self._file is not None
        written = os.write(self._file, record)
        if written != len(record):  # a short write on a full disk: undo and fail
            os.ftruncate(self._file, os.fstat(self._file).st_size - written)
            raise OSError(f"ingest log: short write ({written} of {len(record)} bytes)")
        os.fsync(self._file)
        self._last_seq = seq
        if origin is not None:
            self._last_origin = origin
        return seq

    def _open_segment(self, first_seq: int) -> None:
        """Creates the segment starting at ``first_seq``. It may exist, empty, if a crash
        came after its creation and before its first record was written (or recovery cut
        a torn first record): that file is the same segment and is reused. One holding
        bytes would mix two numberings, so it is refused."""
        path = self.directory / _segment_name(first_seq)
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

    def discard_through(self, seq: int) -> int:
        """Deletes segments whose records all have sequence numbers <= ``seq``
        (they are covered by a snapshot); returns how many were deleted."""
        segments = self._segments()
        deleted = 0
        for path, nxt in itertools.pairwise(segments):
            if int(nxt.name[: -len(_SUFFIX)]) - 1 <= seq:
                path.unlink()
                deleted += 1
        if segments and self._file is None and self._last_seq <= seq:
            segments[-1].unlink()  # closed newest segment, fully covered
            deleted += 1
        if deleted:
            fsync_dir(self.directory)
        return deleted

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self._segments())

    def close(self) -> None:
        self.roll()
