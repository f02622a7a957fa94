"""What the live datastore reports: :class:`LiveStats`, composed of its parts' views,
and :class:`LastError`, the newest failure of its background work."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from drafter_service.live.stream_ids import StreamId


@dataclass(frozen=True, slots=True)
class LiveStats:
    """A view of the live datastore for metrics and admin (consistency: ``LiveDatastore.stats``)."""

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


class LastError:
    """The newest failure of a rebuild, snapshot or stream read (None: none); a leaf lock."""

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
