"""What a live datastore holds, shared by its parts (ingestion, rebuild, snapshotting),
and the two locks that guard it.

Lock order: ``rebuild_lock`` before ``lock``, never the reverse.

- ``lock`` guards every field of :class:`LiveState` and the ingest log. It is held for
  bookkeeping and for the log's fsynced append, never while sub-indices are built or a
  snapshot is written, so ingests and readers never wait for those.
- ``rebuild_lock`` admits one rebuild, snapshot, restore or corpus change at a time.
  Every datastore swap happens under it, so swaps reach ``on_swap`` (called with
  ``lock`` released) in the order they were made.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.live.ingest_log import IngestLog, LogRecord
from drafter_service.live.live_policy import LivePolicy
from drafter_service.live.pinned_corpora import Corpus, joined_datastore
from drafter_service.live.stream_ids import StreamId
from drafter_service.snapshot.store import TokenizerIdentity

PendingDocument = LogRecord
"""An acknowledged document waiting for a rebuild: its log sequence number, tokens and
shared-stream entry id."""


@dataclass(frozen=True, slots=True)
class LiveStats:
    """A consistent view of the live datastore for metrics and admin."""

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


@dataclass(slots=True, eq=False)
class LiveState:
    """The mutable state of one live datastore; every field is guarded by ``lock``."""

    tokenizer: TokenizerIdentity
    policy: LivePolicy  # replaced whole by update_policy, so a read needs no lock
    log: IngestLog
    corpora: tuple[Corpus, ...]
    learned: tuple[SubIndex, ...]
    covered: int  # newest log record folded into the sub-indices
    last_snapshot_unix: float | None
    on_swap: Callable[[Datastore], None] | None
    datastore: Datastore  # corpora's sub-indices, then the learned ones
    pending: list[PendingDocument]  # in the log, not yet in a sub-index; log order
    # Shared ingest stream: the newest entry in the log (where consuming resumes) and the
    # newest folded into the sub-indices (what a snapshot records); None: none yet.
    consumed: StreamId | None = None
    covered_origin: StreamId | None = None
    follows_stream: bool = False  # a shared ingest stream feeds this datastore
    stream_skipped: int = 0  # entries that can never be stored
    stream_errors: int = 0  # failed reads of the log server or local log writes
    stream_lost: int = 0  # times entries were found trimmed before they were taken
    stream_delay_s: float = 0.0  # append to taken, for the newest entry taken
    snapshot_covered: int = field(init=False)  # newest log record the newest snapshot holds
    pending_tokens: int = field(init=False)
    rebuilds: int = 0
    rebuild_seconds: float = 0.0
    last_rebuild_seconds: float = 0.0
    last_rebuild_monotonic: float = field(default_factory=time.monotonic)
    rebuild_tokens_per_s: float = 0.0  # measured by the last rebuild; 0: none yet
    last_error: str | None = None
    ingested_sequences: int = 0
    ingested_tokens: int = 0
    rebuild_listeners: tuple[Callable[[float], None], ...] = ()
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    rebuild_lock: threading.Lock = field(default_factory=threading.Lock)
    wake: threading.Condition = field(init=False)  # the background thread waits on it
    consumed_changed: threading.Condition = field(init=False)  # ingests waiting for the stream

    def __post_init__(self) -> None:
        self.snapshot_covered = self.covered
        self.pending_tokens = sum(len(record.tokens) for record in self.pending)
        self.wake = threading.Condition(self.lock)
        self.consumed_changed = threading.Condition(self.lock)

    def install(self, corpora: tuple[Corpus, ...], learned: tuple[SubIndex, ...]) -> Datastore:
        """Builds the datastore of ``corpora`` then ``learned`` and makes it current; the
        caller holds both locks and passes the result to :meth:`publish`."""
        datastore = joined_datastore(corpora, learned, self.tokenizer.vocab_size)
        self.datastore, self.corpora, self.learned = datastore, corpora, learned
        return datastore

    def publish(self, datastore: Datastore) -> None:
        """Hands a swapped-in datastore to ``on_swap`` (called without ``lock``)."""
        if self.on_swap is not None:
            self.on_swap(datastore)

    def stats(self) -> LiveStats:
        with self.lock:
            ds = self.datastore
            return LiveStats(
                num_tokens=ds.num_tokens,
                pending_tokens=self.pending_tokens,
                sub_indices=len(ds.sub_indices),
                resident_bytes=ds.resident_bytes,
                rebuilds=self.rebuilds,
                rebuild_seconds_total=self.rebuild_seconds,
                last_rebuild_seconds=self.last_rebuild_seconds,
                wal_position=self.log.last_seq,
                covered_position=self.covered,
                wal_bytes=self.log.size_bytes,
                last_snapshot_unix=self.last_snapshot_unix,
                last_error=self.last_error,
                ingested_sequences=self.ingested_sequences,
                ingested_tokens=self.ingested_tokens,
                shared_log=self.follows_stream,
                consumed_offset=self.consumed,
                covered_offset=self.covered_origin,
                stream_skipped=self.stream_skipped,
                stream_errors=self.stream_errors,
                stream_lost=self.stream_lost,
                stream_delay_s=self.stream_delay_s,
            )
