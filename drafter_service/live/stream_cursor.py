"""Where the live datastore stands in a shared ingest stream (scale-out).

:class:`StreamCursor` owns the newest entry taken (logged, or skipped as never storable),
the condition ingests waiting to read their own write wait on, and the follower's
counters. ``drafter_service.replication`` reads the stream and reports here through the
live datastore; without a shared stream it stays empty.
"""

from __future__ import annotations

import threading
from typing import Any

from drafter_service.live.stream_ids import StreamId


class StreamCursor:
    """The shared stream's consumed position and counters; thread-safe (lock order: the
    package docstring)."""

    def __init__(self, consumed: StreamId | None) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # ingests waiting for the stream
        self._consumed = consumed  # newest entry taken; where consuming resumes
        self._skipped = 0  # entries that can never be stored
        self._errors = 0  # failed reads of the log server or local log writes
        self._lost = 0  # times entries were found trimmed before they were taken
        self._delay_s = 0.0  # append to taken, for the newest entry taken
        self._closed = False

    @property
    def consumed(self) -> StreamId | None:
        with self._lock:
            return self._consumed

    def holds(self, entry: StreamId) -> bool:
        """Whether ``entry`` is at or before the newest entry taken (a duplicate)."""
        with self._lock:
            return self._consumed is not None and entry <= self._consumed

    def advance(self, entry: StreamId) -> None:
        """The stream was taken through ``entry``: wakes the ingests waiting for it."""
        with self._lock:
            self._advance(entry)

    def skip(self, entry: StreamId) -> int:
        """Counts ``entry`` as skipped and moves past it; returns the count so far."""
        with self._lock:
            self._skipped += 1
            self._advance(entry)
            return self._skipped

    def _advance(self, entry: StreamId) -> None:
        if self._consumed is None or entry > self._consumed:
            self._consumed = entry
            self._changed.notify_all()

    def count_error(self) -> None:
        with self._lock:
            self._errors += 1

    def count_loss(self) -> None:
        with self._lock:
            self._lost += 1

    def note_delay(self, seconds: float) -> None:
        with self._lock:
            self._delay_s = seconds

    def wait_for(self, entry: StreamId, timeout_s: float) -> bool:
        """Waits until ``entry`` (or later) is taken; False on timeout or once closed."""

        def done() -> bool:
            return self._closed or (self._consumed is not None and self._consumed >= entry)

        with self._lock:
            return self._changed.wait_for(done, timeout=timeout_s) and not self._closed

    def close(self) -> None:
        """Wakes every waiter (they return False)."""
        with self._lock:
            self._closed = True
            self._changed.notify_all()

    def stats(self) -> dict[str, Any]:
        """Its ``LiveStats`` fields, read together."""
        with self._lock:
            return {
                "consumed_offset": self._consumed,
                "stream_skipped": self._skipped,
                "stream_errors": self._errors,
                "stream_lost": self._lost,
                "stream_delay_s": self._delay_s,
            }
