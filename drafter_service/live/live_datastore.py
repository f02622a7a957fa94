"""A datastore that learns from finished generations (SSSD §3.1.3).

``ingest`` makes a token sequence durable in the write-ahead log and queues it.
Background rebuilds fold the queue into the sub-indices, each producing a new immutable
:class:`Datastore` that is swapped in atomically (``on_swap``, e.g.
``Drafter.set_datastore``): drafting never waits for a rebuild. Snapshots are written
periodically; on open, the newest snapshot is restored and the log after it is
replayed. Operators may also add *corpora*, static sub-indices kept before the learned
ones, and :meth:`LiveDatastore.restore` rolls the datastore back to a snapshot.

:class:`LiveDatastore` composes the parts, one module each:

- ``live_state``: what the datastore holds, and the lock order its parts share;
- ``ingestion``: the one way a document enters (the log append, then the buffer);
- ``ingest_log``: the write-ahead log itself;
- ``rebuild``: folding the buffer into sub-indices, and the background schedule;
- ``startup``: opening (the newest snapshot, then the log after it; damaged data refused);
- ``snapshotting``: snapshot, rotate, delete, restore;
- ``pinned_corpora``: corpora and how they are laid out in a datastore and a manifest;
- ``live_policy``: when maintenance runs and the memory bound;
- ``shared_log`` and ``stream_follower``: with a shared ingest stream (scale-out), an
  ingest is appended to the stream and every replica's follower takes it into its log;
- ``peer_bootstrap``: a new replica's first snapshot, downloaded from a peer.

Directory layout: ``snapshots/<name>/`` (see docs/snapshot-format.md) and ``wal/``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.sub_indices import Datastore
from drafter_service.live.ingestion import (
    accept_document,
    check_room,
    checked_document,
    generation_document,
)
from drafter_service.live.live_policy import LIVE_SETTINGS, DatastoreFull, LivePolicy
from drafter_service.live.live_state import LiveStats
from drafter_service.live.pinned_corpora import (
    CORPORA_KEY,
    Corpus,
    check_corpus_vocabulary,
    with_corpus,
    without_corpus,
)
from drafter_service.live.rebuild import fold_pending, run_maintenance, run_maintenance_once
from drafter_service.live.shared_log import RedisStream
from drafter_service.live.snapshotting import LOG_OFFSET_KEY, PINNED_KEY, LiveSnapshots
from drafter_service.live.startup import open_live_state
from drafter_service.live.stream_follower import StreamFollower
from drafter_service.live.stream_ids import StreamId
from drafter_service.live.thread_priority import check_nice
from drafter_service.snapshot.store import SnapshotInfo, TokenizerIdentity

__all__ = [
    "CORPORA_KEY",
    "LIVE_SETTINGS",
    "LOG_OFFSET_KEY",
    "PINNED_KEY",
    "Corpus",
    "DatastoreFull",
    "LiveDatastore",
    "LivePolicy",
    "LiveStats",
]


_READ_YOUR_WRITE_S = 2.0  # how long an ingest through the stream waits to be taken here


class LiveDatastore:
    """The live datastore under ``directory``. Thread-safe.

    ``shared_log``: the shared ingest stream this datastore appends its ingests to and
    takes every replica's ingests from (None: it learns alone, from its own log)."""

    def __init__(
        self,
        directory: str | Path,
        tokenizer: TokenizerIdentity,
        policy: LivePolicy | None = None,
        *,
        on_swap: Callable[[Datastore], None] | None = None,
        background: bool = True,
        salvage: bool = False,
        shared_log: RedisStream | None = None,
        background_nice: int = 0,
    ) -> None:
        check_nice(background_nice)
        self.directory = Path(directory)
        self.tokenizer = tokenizer
        self._state = open_live_state(
            self.directory, tokenizer, policy or LivePolicy(), on_swap, salvage
        )
        self._stream = shared_log
        self._follower: StreamFollower | None = None
        self._state.follows_stream = shared_log is not None
        self._snapshots = LiveSnapshots(self._state, self.directory / "snapshots")
        self._state.publish(self._state.datastore)
        if self._state.pending:
            self.rebuild()  # replayed log: serve it from the start
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=run_maintenance,
                args=(self._state, self.rebuild, self.snapshot, background_nice),
                name="live-datastore",
                daemon=True,
            )
            self._thread.start()
        if shared_log is not None:
            self._follower = StreamFollower(
                self._state, shared_log, self.directory.name, background_nice
            )
            self._follower.start()

    @property
    def shared_log(self) -> RedisStream | None:
        """The shared ingest stream this datastore follows (None: it learns alone)."""
        return self._stream

    @property
    def policy(self) -> LivePolicy:
        """The current policy (:meth:`update_policy` replaces it)."""
        return self._state.policy

    # -- ingest ----------------------------------------------------------------------------

    def ingest(self, tokens: Sequence[int] | npt.NDArray[np.integer]) -> int:
        """Stores one document; durable (fsynced) when this returns. Returns its log
        sequence number. Raises ValueError for bad ids, DatastoreFull past the bound.

        With a shared log the document is appended to the stream (durable as the log
        server is configured) and this replica's follower takes it like every other
        replica's; the call waits briefly for that (read your writes) and returns this
        log's newest sequence number. Raises ``shared_log.LogError`` when the log server
        does not take it (nothing is stored then)."""
        doc = checked_document(tokens, self._state.policy, self.tokenizer.vocab_size)
        if self._stream is not None:
            check_room(self._state, len(doc))
            self.wait_consumed(self._stream.append(doc), _READ_YOUR_WRITE_S)
            with self._state.lock:
                return self._state.log.last_seq
        seq, due = accept_document(self._state, doc)
        assert seq is not None  # only an entry of the stream can be a duplicate
        if due and self._thread is None:
            self.rebuild()
        return seq

    def wait_consumed(self, entry: StreamId, timeout_s: float) -> bool:
        """Waits until the shared stream's ``entry`` (or a later one) is in this
        datastore's log; False on timeout or once closed."""
        state = self._state
        with state.lock:
            return (
                state.consumed_changed.wait_for(
                    lambda: (
                        state.closed or (state.consumed is not None and state.consumed >= entry)
                    ),
                    timeout=timeout_s,
                )
                and not state.closed
            )

    def ingest_generation(
        self,
        prompt_ids: Sequence[int] | npt.NDArray[np.integer],
        output_ids: Sequence[int] | npt.NDArray[np.integer],
    ) -> int:
        """Stores a finished generation as the policy says (output with a little
        prompt context, or prompt + output)."""
        policy = self._state.policy
        return self.ingest(
            generation_document(prompt_ids, output_ids, policy, self.tokenizer.vocab_size)
        )

    # -- rebuild ---------------------------------------------------------------------------

    def rebuild(self) -> bool:
        """Folds every waiting document into the sub-indices now and swaps the new
        datastore in. Returns False when nothing was waiting."""
        return fold_pending(self._state)

    def run_maintenance_once(
        self, now_s: float | None = None, now_unix: float | None = None
    ) -> tuple[bool, bool]:
        """One turn of the background schedule, at once, as if it were ``now_s``
        (time.monotonic) and ``now_unix`` (time.time; both default to now): rebuilds and
        snapshots if that is due then. Returns (rebuild due, snapshot due). For tests,
        which step the schedule by hand instead of waiting for the background thread."""
        return run_maintenance_once(self._state, self.rebuild, self.snapshot, now_s, now_unix)

    def add_rebuild_listener(self, listener: Callable[[float], None]) -> None:
        """Calls ``listener(seconds)`` after every later successful rebuild, on the
        thread that ran it (e.g. for a duration histogram); it must be quick and not
        raise."""
        with self._state.lock:
            self._state.rebuild_listeners = (*self._state.rebuild_listeners, listener)

    # -- snapshots -------------------------------------------------------------------------

    def snapshot(self, name: str | None = None, *, pinned: bool = False) -> SnapshotInfo:
        """Writes the current sub-indices as a snapshot and discards the log they cover.

        ``name`` defaults to ``snapshot-<position>-<ms>``; a ``pinned`` snapshot is kept
        by the ``keep_snapshots`` rotation (only :meth:`delete_snapshot` removes it).
        Documents still waiting for a rebuild are not in it (call :meth:`rebuild` first
        to include them); they stay in the log."""
        return self._snapshots.take(name, pinned=pinned)

    def snapshots(self) -> list[SnapshotInfo]:
        """The complete snapshots, oldest first; the last one is where a restart begins."""
        return self._snapshots.complete()

    def delete_snapshot(self, name: str) -> None:
        """Deletes the snapshot ``name``. Refuses the newest one: a restart loads it and
        the log it covers is gone, so deleting it would lose data."""
        self._snapshots.delete(name)

    def restore(self, name: str) -> SnapshotInfo:
        """Replaces the datastore (corpora included) with the content of snapshot ``name``.

        A point-in-time rollback: every ingest acknowledged before this call that the
        snapshot does not hold (its log position ``P`` is the newest acknowledged one,
        ``wal_position`` of the snapshot or later) is discarded, waiting documents
        included. To make that durable, the restored content is written first as a new
        snapshot covering ``P`` (files hardlinked), so a restart loads it and replays
        only later ingests; then it is swapped in (drafting never waits) and the log
        through ``P`` is deleted. Ingests accepted while this runs (after ``P``) are kept
        and folded in by the next rebuild. Returns the new snapshot."""
        return self._snapshots.restore(name)

    # -- corpora ---------------------------------------------------------------------------

    @property
    def corpora(self) -> tuple[Corpus, ...]:
        with self._state.lock:
            return self._state.corpora

    def add_corpus(self, corpus: Corpus) -> SnapshotInfo:
        """Adds ``corpus`` (sub-indices of this tokenizer's vocabulary) after the existing
        corpora, swaps the datastore in, and writes a snapshot so the addition survives a
        restart. Raises ValueError for a name in use or a bad vocabulary, DatastoreFull
        past ``max_resident_bytes``."""
        check_corpus_vocabulary(corpus, self.tokenizer.vocab_size)
        state = self._state
        return self._change_corpora(
            lambda corpora: with_corpus(
                corpora, corpus, state.datastore.resident_bytes, state.policy.max_resident_bytes
            )
        )

    def remove_corpus(self, name: str) -> SnapshotInfo:
        """Removes corpus ``name`` (KeyError when absent) and writes a snapshot."""
        return self._change_corpora(lambda corpora: without_corpus(corpora, name))

    def _change_corpora(
        self, change: Callable[[tuple[Corpus, ...]], tuple[Corpus, ...]]
    ) -> SnapshotInfo:
        """Swaps in the corpora ``change`` makes of the current ones (called under both
        locks; it may refuse by raising), then writes a snapshot. Every swap happens
        under the rebuild lock, so swaps reach ``on_swap`` in the order they were made."""
        state = self._state
        with state.rebuild_lock:
            with state.lock:
                datastore = state.install(change(state.corpora), state.learned)
            state.publish(datastore)
            return self._snapshots.write(None, {})

    # -- live settings ---------------------------------------------------------------------

    def update_policy(self, **changes: int | float) -> LivePolicy:
        """Changes the maintenance schedule (only the fields in ``LIVE_SETTINGS``);
        validated as a whole, applied from the next background wake-up."""
        unknown = sorted(set(changes) - set(LIVE_SETTINGS))
        if unknown:
            raise ValueError(f"not changeable while serving: {', '.join(unknown)}")
        state = self._state
        with state.lock:
            state.policy = replace(state.policy, **changes)  # type: ignore[arg-type]
            state.wake.notify()
            return state.policy

    # -- state -----------------------------------------------------------------------------

    @property
    def datastore(self) -> Datastore:
        with self._state.lock:
            return self._state.datastore

    def stats(self) -> LiveStats:
        """A consistent view of the counters, taken under the lock."""
        return self._state.stats()

    def content_digest(self) -> str:
        """SHA-256 over the learned sub-indices' tokens, each sub-index delimited: two
        replicas that took the same shared-stream entries and have folded them all
        give the same digest. Hashes every learned token (about 10 ms per 6M)."""
        with self._state.lock:
            learned = self._state.learned
        digest = hashlib.sha256()
        for sub in learned:
            tokens = np.ascontiguousarray(sub.tokens(), dtype="<i4")
            digest.update(len(tokens).to_bytes(8, "little"))
            digest.update(tokens.tobytes())
        return digest.hexdigest()

    def close(self) -> None:
        """Stops the background thread and the stream follower. Waiting documents stay
        in the log."""
        if self._follower is not None:
            self._follower.stop()
        state = self._state
        with state.lock:
            state.closed = True
            state.wake.notify()
            state.consumed_changed.notify_all()
        if self._thread is not None:
            self._thread.join()
        with state.lock:
            state.log.close()
        if self._stream is not None:
            self._stream.close()

    def __enter__(self) -> LiveDatastore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
