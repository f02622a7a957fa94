"""Consuming the shared ingest stream into the live datastore.

:class:`StreamFollower` runs one thread per datastore that reads the stream after its
``consumed_offset`` and hands each document with its entry id to ``accept_entry``, one
fsynced log record: after a crash the log says where to resume and earlier entries are
skipped, so each is stored once. Replicas take the same entries in the same order and
``fold_documents`` does not depend on batching, so they hold the same sub-indices.

It never gives up: an unreachable log server is retried with backoff, a full datastore
waits for a rebuild to make room. An entry that can never be stored (another format, a
bad checksum, bad ids) is skipped on every replica alike; entries trimmed by retention
before they were taken are reported lost (``--bootstrap-peers`` avoids that). Repeating
errors and skips are counted every time (the ``stream_*`` fields of ``LiveStats``) and
logged rate-limited.
"""

from __future__ import annotations

import logging
import threading
import time

from drafter_service.live.ingestion import VolumeFull, checked_document
from drafter_service.live.live_datastore import DatastoreFull, LiveDatastore
from drafter_service.live.stream_ids import StreamId
from drafter_service.live.thread_priority import lower_thread_priority
from drafter_service.log_limits import RateLimitedLog
from drafter_service.replication.shared_log import (
    BadEntry,
    LogError,
    RedisStream,
    decode_tokens,
    describe,
)

log = logging.getLogger(__name__)

_BATCH = 256  # entries per read
_BLOCK_MS = 1000  # a read waits this long for new entries (then checks for stop)
_MAX_BACKOFF_S = 5.0


class StreamFollower:
    """Takes the entries of ``stream`` into the live datastore ``live``, on a thread of its
    own from construction until :meth:`stop`."""

    def __init__(self, live: LiveDatastore, stream: RedisStream, name: str) -> None:
        self._live = live
        self._stream = stream
        self._stop = threading.Event()
        self._checked_loss = False
        # Written only on the follower thread, so ReplicatedDatastore.stats reads them unlocked.
        self.skipped = 0  # entries that can never be stored
        self.errors = 0  # failed reads of the log server or local log writes
        self.lost = 0  # times entries were found trimmed before they were taken
        self.delay_s = 0.0  # append to taken, for the newest entry taken
        self._error_log = RateLimitedLog(log)
        self._skip_log = RateLimitedLog(log)
        self._thread = threading.Thread(
            target=self._run, name=f"stream-follower-{name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stops the thread (a blocked read returns within about a second)."""
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        lower_thread_priority(self._live.background_nice)
        backoff = 0.1
        after = self._live.consumed_offset
        while not self._stop.is_set():
            try:
                if not self._checked_loss:
                    self._check_loss(after)
                entries = self._stream.read_after(after, block_ms=_BLOCK_MS, count=_BATCH)
            except LogError as exc:
                self._count_error(f"shared log {self._stream.key}: {describe(exc)}")
                self._checked_loss = False  # the stream may have been trimmed meanwhile
                self._stop.wait(backoff)
                backoff = min(2 * backoff, _MAX_BACKOFF_S)
                continue
            backoff = 0.1
            for entry_id, payload in entries:
                if not self._take(entry_id, payload):
                    return
                after = entry_id

    def _check_loss(self, after: StreamId | None) -> None:
        lost = self._stream.lost_after(after)
        self._checked_loss = True
        if lost is None:
            return
        message = (
            f"shared log {self._stream.key}: entries after {after or 'the start'} and before "
            f"{lost} were trimmed by retention before this replica took them; it misses "
            "them. Start it from a peer's snapshot (--bootstrap-peers) or raise "
            "--shared-log-retention"
        )
        log.error("%s", message)
        self.lost += 1
        self._live.note_stream_error(message)

    def _take(self, entry_id: StreamId, payload: bytes | BadEntry) -> bool:
        """Stores one entry; False once the datastore is closed or the follower stops."""
        live = self._live
        try:
            if isinstance(payload, BadEntry):
                raise payload
            doc = checked_document(decode_tokens(payload), live.policy, live.tokenizer.vocab_size)
        except ValueError as exc:
            self.skipped += 1
            live.note_stream_skip(entry_id)
            self._skip_log.error("shared log %s: entry %s skipped on every replica (%d so far): "
                                 "%s", self._stream.key, entry_id, self.skipped, exc)  # fmt: skip
            return True
        waited = False
        while True:
            try:
                live.accept_entry(doc, entry_id)
            except VolumeFull as exc:  # the local log's disk: retry, never skip
                self._count_error(f"shared log {self._stream.key}: entry {entry_id}: {exc}")
            except DatastoreFull as exc:
                if not waited:
                    log.warning("shared log %s: entry %s waits for room: %s",
                                self._stream.key, entry_id, exc)  # fmt: skip
                    waited = True
                live.make_room()  # a rebuild drops the oldest sub-indices
            except OSError as exc:  # the local log: retry, never skip
                self._count_error(f"shared log {self._stream.key}: entry {entry_id}: {exc!r}")
            except RuntimeError:  # closed
                return False
            else:
                self.delay_s = max(0.0, time.time() - entry_id.ms / 1000)
                return True
            if self._stop.wait(1.0):
                return False

    def _count_error(self, message: str) -> None:
        self._error_log.warning("%s", message)
        self.errors += 1
        self._live.note_stream_error(message)
