"""What the live datastore reports of itself (``LiveDatastore.stats``): read by the
metrics and the admin API."""

from __future__ import annotations

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
    # The stream follower's counters (``ReplicatedDatastore``); 0 without a shared stream.
    stream_skipped: int = 0
    stream_errors: int = 0
    stream_lost: int = 0
    stream_delay_s: float = 0.0
