"""The acknowledged documents not yet folded into the sub-indices, and the log that
holds them.

:class:`PendingBuffer` owns the ingest log (not thread-safe itself) and its records
waiting for a rebuild, under one lock: :meth:`PendingBuffer.accept` checks the memory
bound, appends to the log (fsynced: acknowledged from here on) and only then buffers the
document, so the buffer is in log order and the log holds all of it. It also owns the
ingest counters, the background thread's condition and where the live datastore stands
in a shared ingest stream (scale-out): the newest entry taken (logged, or skipped as never
storable), which ``drafter_service.replication`` reports through the live datastore.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from drafter_service.live.index_set import IndexSet
from drafter_service.live.ingest_log import IngestLog, LogRecord
from drafter_service.live.ingestion import raise_if_volume_full
from drafter_service.live.live_policy import LivePolicy
from drafter_service.live.stream_ids import StreamId


class PendingBuffer:
    """The ingest log and its records waiting for a rebuild; thread-safe (second in the
    package's lock order)."""

    def __init__(self, log: IngestLog, consumed: StreamId | None) -> None:
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the background thread waits on it
        self._taken = threading.Condition(self._lock)  # ingests waiting for the stream
        self._log = log
        self._records = log.recovered()  # in the log, not yet in a sub-index; log order
        self._tokens = sum(len(record.tokens) for record in self._records)
        self._ingested_sequences = 0  # acknowledged since this open (replay excluded)
        self._ingested_tokens = 0
        self._consumed = consumed  # newest shared-stream entry taken; where consuming resumes
        self._closed = False

    def accept(
        self,
        doc: npt.NDArray[np.int32],
        policy: LivePolicy,
        index: IndexSet,
        origin: StreamId | None = None,
    ) -> tuple[int | None, bool]:
        """Appends checked ``doc`` to the log, then the buffer; returns its sequence number
        (None: stream entry ``origin`` was taken already, so each is stored once)
        and whether a rebuild is now due (the background thread was woken). Raises
        DatastoreFull past the bound, RuntimeError once closed, OSError (``VolumeFull``)
        from the log, storing nothing. The index set is asked under this lock."""
        with self._lock:
            if self._closed:
                raise RuntimeError("live datastore is closed")
            if origin is not None and self._consumed is not None and origin <= self._consumed:
                return None, False
            index.check_room(self._tokens, len(doc), policy)
            try:
                seq = self._log.append(doc, origin)
            except OSError as exc:
                raise_if_volume_full(self._log.directory, exc)
                raise
            self._records.append(LogRecord(seq, doc, origin))
            if origin is not None:
                self._advance(origin)
            self._tokens += len(doc)
            self._ingested_sequences += 1
            self._ingested_tokens += len(doc)
            due = self._tokens >= policy.rebuild_min_tokens
            if due:
                self._work.notify()
        return seq, due

    # -- rebuilds (the caller holds the structural-change lock) ----------------------------

    def take(self) -> list[LogRecord]:
        """Empties the buffer for a rebuild (later records start a new segment)."""
        with self._lock:
            batch, self._records, self._tokens = self._records, [], 0
            if batch:
                self._log.roll()
            return batch

    def put_back(self, batch: list[LogRecord]) -> None:
        """Puts a failed rebuild's batch back in front."""
        with self._lock:
            self._records[:0] = batch
            self._tokens += sum(len(r.tokens) for r in batch)

    def restore_point(self) -> int:
        """The newest acknowledged record; later ones start a new segment, so every
        segment through it can be deleted."""
        with self._lock:
            self._log.roll()
            return self._log.last_seq

    def discard_through(self, position: int, alongside: Callable[[], None]) -> None:
        """A snapshot holds the log through ``position``: those records leave the buffer
        (a restore discards them) and their segments are deleted, atomically with
        ``alongside`` (the index set's matching change, run under this lock)."""
        with self._lock:
            alongside()
            if self._records and self._records[0].seq <= position:
                self._records = [r for r in self._records if r.seq > position]
                self._tokens = sum(len(r.tokens) for r in self._records)
            self._log.discard_through(position)

    # -- the shared stream ------------------------------------------------------------------

    def skip(self, entry: StreamId) -> None:
        """Moves past stream ``entry``, never stored."""
        with self._lock:
            self._advance(entry)

    def _advance(self, entry: StreamId) -> None:
        """The stream was taken through ``entry``: wakes the ingests waiting for it."""
        if self._consumed is None or entry > self._consumed:
            self._consumed = entry
            self._taken.notify_all()

    def wait_consumed(self, entry: StreamId, timeout_s: float) -> bool:
        """Waits until ``entry`` (or later) is taken; False on timeout or once closed."""

        def done() -> bool:
            return self._closed or (self._consumed is not None and self._consumed >= entry)

        with self._lock:
            return self._taken.wait_for(done, timeout=timeout_s) and not self._closed

    # -- the background thread -------------------------------------------------------------

    def wait_for_work(self, timeout_s: Callable[[], float]) -> bool:
        """Waits ``timeout_s()`` (read under the lock) or until woken; False once closed."""
        with self._lock:
            self._work.wait(timeout=timeout_s())
            return not self._closed

    def wake(self) -> None:
        """Wakes the background thread (a policy change, a follower waiting for room)."""
        with self._lock:
            self._work.notify()

    def close(self) -> None:
        """Refuses later documents; the background thread and stream waiters return."""
        with self._lock:
            self._closed = True
            self._work.notify()
            self._taken.notify_all()

    def close_log(self) -> None:
        with self._lock:
            self._log.close()

    # -- reads -----------------------------------------------------------------------------

    @property
    def consumed(self) -> StreamId | None:
        with self._lock:
            return self._consumed

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._log.last_seq

    def pending(self) -> tuple[int, int]:
        """(documents, tokens) waiting for a rebuild."""
        with self._lock:
            return len(self._records), self._tokens

    def stats(self) -> dict[str, Any]:
        """Its ``LiveStats`` fields, read together."""
        with self._lock:
            return {
                "pending_tokens": self._tokens,
                "wal_position": self._log.last_seq,
                "wal_bytes": self._log.size_bytes,
                "ingested_sequences": self._ingested_sequences,
                "ingested_tokens": self._ingested_tokens,
                "consumed_offset": self._consumed,
            }
