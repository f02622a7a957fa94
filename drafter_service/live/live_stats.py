"""What the live datastore reports: :class:`LiveStats`, composed of its parts' views,
and :class:`LastError`, the newest failure of its background work."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from drafter_service.live.index_set import IndexStats
from drafter_service.live.pending_buffer import BufferStats
from drafter_service.live.stream_cursor import CursorStats
from drafter_service.live.stream_ids import StreamId


@dataclass(frozen=True, slots=True)
class LiveStats:
    """A view of the live datastore for metrics and admin (see :func:`live_stats` for
    how consistent it is)."""

    num_tokens: int  # text positions in the sub-indices (separators included)
    pending_tokens: int  # ingested, durable, not yet in a sub-index
    sub_indices: int
    resident_bytes: int
    rebuilds: int
    rebuild_seconds_total: float
    last_rebuild_seconds: float
    wal_position: int  # newest acknowledged ingest
    covered_position: int  # newest ingest folded into the sub-indices
    wal_bytes: int
    last_snapshot_unix: float | None
    last_error: str | None
    ingested_sequences: int  # acknowledged since this open (the replayed log excluded)
    ingested_tokens: int
    shared_log: bool  # a shared ingest stream feeds this datastore
    consumed_offset: StreamId | None  # newest shared-stream entry in the log
    covered_offset: StreamId | None  # newest shared-stream entry in the sub-indices
    stream_skipped: int
    stream_errors: int
    stream_lost: int
    stream_delay_s: float


def live_stats(
    index: IndexStats, cursor: CursorStats, buffer: BufferStats, last_error: str | None
) -> LiveStats:
    """The parts' views as one, read in this order (the index set, the stream cursor,
    the pending buffer, the last error), each under its own lock.

    Each part's fields are one consistent view. Across parts the view is as of slightly
    different moments, in that order, and since coverage only follows what was logged
    and taken before, it never shows ``covered_position`` past ``wal_position`` nor
    ``covered_offset`` past ``consumed_offset``, and never counts a document both in
    ``num_tokens`` and in ``pending_tokens``. A rebuild, restore or ingest that
    completes while it reads may show on a later part and not an earlier one (e.g. a
    document in ``wal_position`` and ``pending_tokens`` that came after the
    ``consumed_offset`` read). As before, a document a rebuild is folding is in neither
    ``pending_tokens`` nor ``num_tokens``."""
    return LiveStats(
        num_tokens=index.num_tokens,
        pending_tokens=buffer.pending_tokens,
        sub_indices=index.sub_indices,
        resident_bytes=index.resident_bytes,
        rebuilds=index.rebuilds,
        rebuild_seconds_total=index.rebuild_seconds_total,
        last_rebuild_seconds=index.last_rebuild_seconds,
        wal_position=buffer.wal_position,
        covered_position=index.covered_position,
        wal_bytes=buffer.wal_bytes,
        last_snapshot_unix=index.last_snapshot_unix,
        last_error=last_error,
        ingested_sequences=buffer.ingested_sequences,
        ingested_tokens=buffer.ingested_tokens,
        shared_log=False,
        consumed_offset=cursor.consumed_offset,
        covered_offset=index.covered_offset,
        stream_skipped=cursor.stream_skipped,
        stream_errors=cursor.stream_errors,
        stream_lost=cursor.stream_lost,
        stream_delay_s=cursor.stream_delay_s,
    )


class LastError:
    """The newest failure of a rebuild, snapshot or stream read (None: none); its lock
    is a leaf (nothing else is taken while it is held)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._message: str | None = None

    def note(self, message: str) -> None:
        with self._lock:
            self._message = message

    @property
    def message(self) -> str | None:
        with self._lock:
            return self._message
