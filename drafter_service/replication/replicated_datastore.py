"""A live datastore that learns from a shared ingest stream (scale-out).

:class:`ReplicatedDatastore` appends accepted documents to the stream, not the local log;
its follower thread takes them into the log like every other replica's, and the ingest
waits briefly for that (read your writes). A restore is refused: the stream would not
share one replica's rollback (docs/scale-out.md).

The follower reads the stream after the datastore's ``consumed_offset`` and writes each
document with its entry id to the datastore's log, one fsynced record: after a crash the
log says where to resume and earlier entries are skipped, so each is stored once. Replicas
take the same entries in the same order and ``fold_documents`` does not depend on
batching, so they hold the same sub-indices.

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
from dataclasses import replace
from pathlib import Path
from typing import Unpack

from drafter_service.datastore.tokens import TokenIds
from drafter_service.live.ingestion import VolumeFull, checked_document
from drafter_service.live.live_datastore import (
    DatastoreFull,
    LiveDatastore,
    LiveOptions,
    LivePolicy,
    LiveStats,
)
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
from drafter_service.snapshot.store import SnapshotError, SnapshotInfo, TokenizerIdentity

log = logging.getLogger(__name__)

_READ_YOUR_WRITE_S = 2.0  # how long an ingest through the stream waits to be taken here
_BATCH = 256  # entries per read
_BLOCK_MS = 1000  # a read waits this long for new entries (then checks for stop)
_MAX_BACKOFF_S = 5.0


class ReplicatedDatastore(LiveDatastore):
    """The live datastore under ``directory`` fed by (and closing) ``shared_log``: a
    follower thread of its own takes the stream's entries in, from construction until
    :meth:`close`."""

    def __init__(
        self,
        directory: str | Path,
        tokenizer: TokenizerIdentity,
        policy: LivePolicy | None = None,
        *,
        shared_log: RedisStream,
        **options: Unpack[LiveOptions],
    ) -> None:
        super().__init__(directory, tokenizer, policy, **options)
        self.shared_log = shared_log  # the shared ingest stream this datastore follows
        self._stop_following = threading.Event()
        self._checked_loss = False
        # Written only on the follower thread, so stats reads them unlocked.
        self._skipped = 0  # entries that can never be stored
        self._errors = 0  # failed reads of the log server or local log writes
        self._lost = 0  # times entries were found trimmed before they were taken
        self._delay_s = 0.0  # append to taken, for the newest entry taken
        self._error_log = RateLimitedLog(log)
        self._skip_log = RateLimitedLog(log)
        self._follower = threading.Thread(
            target=self._follow, name=f"stream-follower-{self.directory.name}", daemon=True
        )
        self._follower.start()

    def ingest(self, tokens: TokenIds) -> int:
        """Appends one document to the stream and waits briefly for this replica to take
        it; returns the log's newest sequence number. Raises as :meth:`LiveDatastore.ingest`,
        or ``LogError`` when the log server does not take it (nothing is stored)."""
        doc = checked_document(tokens, self.policy, self.tokenizer.vocab_size)
        # DatastoreFull when it could not stay resident now (a hint: only storing a
        # document holds the buffer's lock while it checks).
        self._index.check_room(self._buffer.pending()[1], len(doc), self.policy)
        self._buffer.wait_consumed(self.shared_log.append(doc), _READ_YOUR_WRITE_S)
        return self._buffer.last_seq

    def restore(self, name: str) -> SnapshotInfo:
        raise SnapshotError(
            "restore is refused while the datastore follows a shared ingest stream: "
            "a rollback on one replica would make it differ from the others, and the "
            "stream would not roll back. Restore without --shared-log on every replica"
        )

    def stats(self) -> LiveStats:
        return replace(
            super().stats(), shared_log=True, stream_skipped=self._skipped,
            stream_errors=self._errors, stream_lost=self._lost, stream_delay_s=self._delay_s,
        )  # fmt: skip

    def close(self) -> None:
        """Stops the stream follower (a blocked read returns within about a second), then
        the datastore, then closes the stream."""
        self._stop_following.set()
        self._follower.join(5.0)
        super().close()
        self.shared_log.close()

    # -- the follower thread ---------------------------------------------------------------

    def _follow(self) -> None:
        lower_thread_priority(self.background_nice)
        backoff = 0.1
        after = self._buffer.consumed  # the newest entry taken (logged or skipped)
        while not self._stop_following.is_set():
            try:
                if not self._checked_loss:
                    self._check_loss(after)
                entries = self.shared_log.read_after(after, block_ms=_BLOCK_MS, count=_BATCH)
            except LogError as exc:
                self._count_error(f"shared log {self.shared_log.key}: {describe(exc)}")
                self._checked_loss = False  # the stream may have been trimmed meanwhile
                self._stop_following.wait(backoff)
                backoff = min(2 * backoff, _MAX_BACKOFF_S)
                continue
            backoff = 0.1
            for entry_id, payload in entries:
                if not self._take(entry_id, payload):
                    return
                after = entry_id

    def _check_loss(self, after: StreamId | None) -> None:
        lost = self.shared_log.lost_after(after)
        self._checked_loss = True
        if lost is None:
            return
        message = (
            f"shared log {self.shared_log.key}: entries after {after or 'the start'} and "
            f"before {lost} were trimmed by retention before this replica took them; it "
            "misses them. Start it from a peer's snapshot (--bootstrap-peers) or raise "
            "--shared-log-retention"
        )
        log.error("%s", message)
        self._lost += 1
        self._last_error = message

    def _take(self, entry_id: StreamId, payload: bytes | BadEntry) -> bool:
        """Stores one entry; False once the datastore is closed or the follower stops."""
        key = self.shared_log.key
        try:
            if isinstance(payload, BadEntry):
                raise payload
            doc = checked_document(decode_tokens(payload), self.policy, self.tokenizer.vocab_size)
        except ValueError as exc:
            self._skipped += 1
            self._buffer.skip(entry_id)  # unlogged: a restart skips it again
            self._skip_log.error("shared log %s: entry %s skipped on every replica (%d so far): "
                                 "%s", key, entry_id, self._skipped, exc)  # fmt: skip
            return True
        waited = False
        while True:
            try:
                # One fsynced log record with the id; None: a duplicate, taken already.
                seq = self._buffer.accept(doc, self.policy, self._index, entry_id)[0]
                if seq is not None:
                    self._hold(seq, doc)
            except VolumeFull as exc:  # the local log's disk: retry, never skip
                self._count_error(f"shared log {key}: entry {entry_id}: {exc}")
            except DatastoreFull as exc:
                if not waited:
                    log.warning("shared log %s: entry %s waits for room: %s", key, entry_id, exc)
                    waited = True
                self._buffer.wake()  # its rebuild drops the oldest sub-indices
            except OSError as exc:  # the local log: retry, never skip
                self._count_error(f"shared log {key}: entry {entry_id}: {exc!r}")
            except RuntimeError:  # closed
                return False
            else:
                self._delay_s = max(0.0, time.time() - entry_id.ms / 1000)
                return True
            if self._stop_following.wait(1.0):
                return False

    def _count_error(self, message: str) -> None:
        self._error_log.warning("%s", message)
        self._errors += 1
        self._last_error = message
