"""Where the live datastore stands in a shared ingest stream (scale-out).

:class:`StreamCursor` owns the newest entry taken (logged, or skipped as never storable)
and the condition ingests waiting to read their own write wait on.
``drafter_service.replication`` reads the stream and reports here through the live
datastore; without a shared stream it stays empty.
"""

from __future__ import annotations

import threading

from drafter_service.live.stream_ids import StreamId


class StreamCursor:
    """The shared stream's consumed position; thread-safe (lock order: the package docstring)."""

    def __init__(self, consumed: StreamId | None) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # ingests waiting for the stream
        self._consumed = consumed  # newest entry taken; where consuming resumes
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
            if self._consumed is None or entry > self._consumed:
                self._consumed = entry
                self._changed.notify_all()

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
