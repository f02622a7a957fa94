"""A datastore that learns from finished generations (SSSD §3.1.3).

``ingest`` makes a token sequence durable in the write-ahead log and queues it.
Background rebuilds fold the queue into the sub-indices, each producing a new immutable
:class:`Datastore` that is swapped in atomically (``on_swap``, e.g.
``Drafter.set_datastore``): drafting never waits for a rebuild. With ``unfolded`` (the
drafter's recent tier) every stored document is also handed to it at once, and released
from it once a swap has folded it in, so it is drafted from before its rebuild.
Snapshots are written periodically; on open, the newest snapshot is restored and the log after it is
replayed. Operators may also add *corpora*, static sub-indices kept before the learned
ones, and :meth:`LiveDatastore.restore` rolls the datastore back to a snapshot.

:class:`LiveDatastore` composes parts that each own their state and its lock (the lock
order they share is in the package docstring):

- ``pending_buffer``: :class:`PendingBuffer`, the ingest log and its documents waiting
  for a rebuild (the one way a document enters: the log append, then the buffer), the
  ingest counters and the condition the background thread waits on;
- ``index_set``: :class:`IndexSet`, the corpora and learned sub-indices, the current
  datastore and what it covers, rebuild statistics and listeners, ``on_swap``, and the
  structural-change lock (one rebuild, snapshot, restore or corpus change at a time);
- ``stream_cursor``: :class:`StreamCursor`, with a shared ingest stream the newest entry
  taken, the condition ingests wait on to read their own write, the follower's counters;
- ``live_stats``: :class:`LiveStats` made of the parts' views, and the last error.

and the modules that work on them: ``ingest_log`` (the write-ahead log itself),
``ingestion`` (what may enter; a full volume), ``rebuild`` (folding the buffer into
sub-indices, and the background schedule), ``startup`` (opening: the newest snapshot,
then the log after it; damaged data refused), ``snapshotting`` (snapshot, rotate,
delete, restore), ``pinned_corpora`` (corpora and how they are laid out in a datastore
and a manifest), ``live_policy`` (when maintenance runs and the memory bound).

Replication is not here: ``drafter_service.replication`` follows a shared ingest stream
(scale-out) through the methods under "for a shared-stream follower" below, and
bootstraps a new replica from a peer.

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
from drafter_service.live.index_set import Unfolded
from drafter_service.live.ingestion import checked_document, generation_document
from drafter_service.live.live_policy import LIVE_SETTINGS, DatastoreFull, LivePolicy
from drafter_service.live.live_stats import LastError, LiveStats, live_stats
from drafter_service.live.pinned_corpora import (
    CORPORA_KEY,
    Corpus,
    check_corpus_vocabulary,
    with_corpus,
    without_corpus,
)
from drafter_service.live.rebuild import MaintenanceSchedule, fold_pending
from drafter_service.live.snapshotting import LOG_OFFSET_KEY, PINNED_KEY, LiveSnapshots
from drafter_service.live.startup import open_live_parts
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
    "Unfolded",
]


class LiveDatastore:
    """The live datastore under ``directory``. Thread-safe."""

    def __init__(
        self,
        directory: str | Path,
        tokenizer: TokenizerIdentity,
        policy: LivePolicy | None = None,
        *,
        on_swap: Callable[[Datastore], None] | None = None,
        background: bool = True,
        salvage: bool = False,
        background_nice: int = 0,
        unfolded: Unfolded | None = None,
    ) -> None:
        check_nice(background_nice)
        self.directory = Path(directory)
        self.tokenizer = tokenizer
        parts = open_live_parts(self.directory, tokenizer, on_swap, salvage, unfolded)
        self._buffer, self._index, self._cursor = parts.buffer, parts.index, parts.cursor
        self._errors = LastError()
        self._policy = policy or LivePolicy()  # replaced whole, so a read needs no lock
        self._policy_lock = threading.Lock()  # serialises update_policy (a leaf lock)
        self._snapshots = LiveSnapshots(
            self._index, self._buffer, tokenizer, lambda: self._policy, self.directory / "snapshots"
        )
        self._schedule = MaintenanceSchedule(
            self._index, self._buffer, self._errors, lambda: self._policy, self.rebuild,
            self.snapshot,
        )  # fmt: skip
        self._index.publish(self._index.datastore)
        if self._buffer.pending()[0]:
            self.rebuild()  # replayed log: serve it from the start
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=self._schedule.run,
                args=(background_nice,),
                name="live-datastore",
                daemon=True,
            )
            self._thread.start()

    @property
    def policy(self) -> LivePolicy:
        """The current policy (:meth:`update_policy` replaces it)."""
        return self._policy

    # -- ingest ----------------------------------------------------------------------------

    def ingest(self, tokens: Sequence[int] | npt.NDArray[np.integer]) -> int:
        """Stores one document; durable (fsynced) when this returns. Returns its log
        sequence number. Raises ValueError for bad ids, DatastoreFull past the bound."""
        doc = checked_document(tokens, self._policy, self.tokenizer.vocab_size)
        seq, due = self._buffer.accept(doc, self._policy, self._index, self._cursor)
        assert seq is not None  # only an entry of the stream can be a duplicate
        self._hold(seq, doc)
        if due and self._thread is None:
            self.rebuild()
        return seq

    def ingest_generation(
        self,
        prompt_ids: Sequence[int] | npt.NDArray[np.integer],
        output_ids: Sequence[int] | npt.NDArray[np.integer],
    ) -> int:
        """Stores a finished generation as the policy says (output with a little
        prompt context, or prompt + output)."""
        policy = self._policy
        return self.ingest(
            generation_document(prompt_ids, output_ids, policy, self.tokenizer.vocab_size)
        )

    # -- for a shared-stream follower (drafter_service.replication) ------------------------
    # It takes the stream into the log through these; the stream itself is not known here.

    def accept_entry(self, doc: npt.NDArray[np.int32], origin: StreamId) -> int | None:
        """Stores ``doc`` (checked: ``ingestion.checked_document``), the shared stream's
        entry ``origin``, in one fsynced log record that carries the id; an entry at or
        before :attr:`consumed_offset` is a duplicate and is not stored again (None).
        Returns its log sequence number. Raises as :meth:`ingest` does, RuntimeError
        once closed, ``ingestion.VolumeFull`` or another OSError when the log cannot be
        written (nothing is stored then)."""
        seq = self._buffer.accept(doc, self._policy, self._index, self._cursor, origin)[0]
        if seq is not None:
            self._hold(seq, doc)
        return seq

    def _hold(self, seq: int, doc: npt.NDArray[np.int32]) -> None:
        # Drafted from at once, until a rebuild folds it in (a rebuild that already did
        # has released its position: the tier then ignores it).
        if self._index.unfolded is not None:
            self._index.unfolded.hold(seq, doc)

    @property
    def consumed_offset(self) -> StreamId | None:
        """The newest shared-stream entry taken (into the log, or skipped); None: none."""
        return self._cursor.consumed

    def wait_consumed(self, entry: StreamId, timeout_s: float) -> bool:
        """Waits until the shared stream's ``entry`` (or a later one) is in this
        datastore's log; False on timeout or once closed."""
        return self._cursor.wait_for(entry, timeout_s)

    def check_room(self, n_tokens: int) -> None:
        """Raises DatastoreFull when ``n_tokens`` more could not stay resident now."""
        self._buffer.check_room(n_tokens, self._policy, self._index)

    def make_room(self) -> None:
        """Wakes the background thread: a rebuild drops the oldest sub-indices."""
        self._buffer.wake()

    @property
    def wal_position(self) -> int:
        """The newest acknowledged ingest's log sequence number."""
        return self._buffer.last_seq

    def note_stream_skip(self, entry: StreamId) -> int:
        """Moves past ``entry``, which can never be stored (not in the log: a restart
        reads it again and skips it again); returns how many were skipped so far."""
        return self._cursor.skip(entry)

    def note_stream_error(self, message: str) -> None:
        """Counts a failed read of the stream or local write of an entry."""
        self._cursor.count_error()
        self._errors.note(message)

    def note_stream_loss(self, message: str) -> None:
        """Counts entries found trimmed from the stream before they were taken."""
        self._cursor.count_loss()
        self._errors.note(message)

    def note_stream_delay(self, seconds: float) -> None:
        """Append to taken, for the newest entry taken."""
        self._cursor.note_delay(seconds)

    # -- rebuild ---------------------------------------------------------------------------

    def rebuild(self) -> bool:
        """Folds every waiting document into the sub-indices now and swaps the new
        datastore in. Returns False when nothing was waiting."""
        return fold_pending(self._index, self._buffer, self._errors, self._policy)

    def run_maintenance_once(
        self, now_s: float | None = None, now_unix: float | None = None
    ) -> tuple[bool, bool]:
        """One turn of the background schedule, at once, as if it were ``now_s``
        (time.monotonic) and ``now_unix`` (time.time; both default to now): rebuilds and
        snapshots if that is due then. Returns (rebuild due, snapshot due). For tests,
        which step the schedule by hand instead of waiting for the background thread."""
        return self._schedule.run_once(now_s, now_unix)

    def add_rebuild_listener(self, listener: Callable[[float], None]) -> None:
        """Calls ``listener(seconds)`` after every later successful rebuild, on the
        thread that ran it (e.g. for a duration histogram); it must be quick and not
        raise."""
        self._index.add_listener(listener)

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
        return self._index.corpora

    def add_corpus(self, corpus: Corpus) -> SnapshotInfo:
        """Adds ``corpus`` (sub-indices of this tokenizer's vocabulary) after the existing
        corpora, swaps the datastore in, and writes a snapshot so the addition survives a
        restart. Raises ValueError for a name in use or a bad vocabulary, DatastoreFull
        past ``max_resident_bytes``."""
        check_corpus_vocabulary(corpus, self.tokenizer.vocab_size)
        return self._change_corpora(
            lambda corpora, datastore: with_corpus(
                corpora, corpus, datastore.resident_bytes, self._policy.max_resident_bytes
            )
        )

    def remove_corpus(self, name: str) -> SnapshotInfo:
        """Removes corpus ``name`` (KeyError when absent) and writes a snapshot."""
        return self._change_corpora(lambda corpora, _: without_corpus(corpora, name))

    def _change_corpora(
        self, change: Callable[[tuple[Corpus, ...], Datastore], tuple[Corpus, ...]]
    ) -> SnapshotInfo:
        """Swaps in the corpora ``change`` makes of the current ones and datastore (called
        under the index set's lock; it may refuse by raising), then writes a snapshot.
        Every swap happens under the structural-change lock, so swaps reach ``on_swap``
        in the order they were made."""
        with self._index.changing():
            self._index.publish(self._index.install_corpora(change))
            return self._snapshots.write(None, {})

    # -- live settings ---------------------------------------------------------------------

    def update_policy(self, **changes: int | float) -> LivePolicy:
        """Changes the maintenance schedule (only the fields in ``LIVE_SETTINGS``);
        validated as a whole, applied from the next background wake-up."""
        unknown = sorted(set(changes) - set(LIVE_SETTINGS))
        if unknown:
            raise ValueError(f"not changeable while serving: {', '.join(unknown)}")
        with self._policy_lock:
            policy = self._policy = replace(self._policy, **changes)  # type: ignore[arg-type]
        self._buffer.wake()
        return policy

    # -- state -----------------------------------------------------------------------------

    @property
    def datastore(self) -> Datastore:
        return self._index.datastore

    def stats(self) -> LiveStats:
        """A view of the counters, each part's read under its lock (``live_stats``)."""
        index, cursor = self._index.stats(), self._cursor.stats()
        return live_stats(index, cursor, self._buffer.stats(), self._errors.message)

    def content_digest(self) -> str:
        """SHA-256 over the learned sub-indices' tokens, each sub-index delimited: two
        replicas that took the same shared-stream entries and have folded them all
        give the same digest. Hashes every learned token (about 10 ms per 6M)."""
        digest = hashlib.sha256()
        for sub in self._index.learned:
            tokens = np.ascontiguousarray(sub.tokens(), dtype="<i4")
            digest.update(len(tokens).to_bytes(8, "little"))
            digest.update(tokens.tobytes())
        return digest.hexdigest()

    def close(self) -> None:
        """Stops the background thread. Waiting documents stay in the log."""
        self._buffer.close()
        self._cursor.close()
        if self._thread is not None:
            self._thread.join()
        self._buffer.close_log()

    def __enter__(self) -> LiveDatastore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
