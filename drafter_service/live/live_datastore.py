"""A datastore that learns from finished generations (SSSD §3.1.3).

``ingest`` makes a document durable in the write-ahead log and queues it; background
rebuilds fold the queue into the sub-indices, each swapping in a new immutable
:class:`Datastore` (``on_swap``, e.g. ``Drafter.set_datastore``), so drafting never waits
for a rebuild. ``unfolded`` (the drafter's recent tier) drafts from each stored document
until a swap folds it in. On open the newest snapshot is restored and the log after it
replayed. A snapshot holds the sub-indices as of a log position (``wal_position``); once
it is written and read back, the log it covers is deleted, so the newest complete
snapshot plus the log after it is the whole datastore. Operators may add *corpora*,
static sub-indices kept before the learned ones.

The parts, each owning its state (lock order: the package docstring): ``PendingBuffer``
(the log, the documents waiting for a rebuild, the ingest counters, the shared stream's
position; its lock) and ``IndexSet`` (corpora, sub-indices, the current datastore and what
it covers, replaced whole as one ``IndexState``; the structural-change lock).
``drafter_service.replication``'s subclass follows a shared stream through these parts.
Layout: ``snapshots/<name>/`` (docs/snapshot-format.md) and ``wal/``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TypedDict, Unpack

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.sub_indices import Datastore
from drafter_service.datastore.tokens import TokenIds
from drafter_service.live.index_set import Unfolded
from drafter_service.live.ingestion import checked_document, generation_document
from drafter_service.live.live_policy import LIVE_SETTINGS, DatastoreFull, LivePolicy
from drafter_service.live.live_stats import LiveStats
from drafter_service.live.pinned_corpora import (
    CORPORA_KEY,
    Corpus,
    corpora_listing,
    split_corpora,
    with_corpus,
    without_corpus,
)
from drafter_service.live.rebuild import fold_pending, maintenance_due
from drafter_service.live.startup import LOG_OFFSET_KEY, open_live_parts
from drafter_service.live.thread_priority import check_nice, lower_thread_priority
from drafter_service.log_limits import RateLimitedLog
from drafter_service.snapshot.store import (
    SnapshotError,
    SnapshotInfo,
    TokenizerIdentity,
    list_snapshots,
    load_snapshot,
    read_manifest,
    write_snapshot,
)
from drafter_service.snapshot.store import delete_snapshot as delete_snapshot_files

log = logging.getLogger(__name__)
# A maintenance failure repeats at every wake-up until it is fixed: logged rate-limited.
_maintenance_log = RateLimitedLog(log)

PINNED_KEY = "pinned"
"""Snapshot metadata flag: never deleted by the ``keep_snapshots`` rotation."""

__all__ = [
    "CORPORA_KEY",
    "LOG_OFFSET_KEY",
    "PINNED_KEY",
    "Corpus",
    "DatastoreFull",
    "LiveDatastore",
    "LivePolicy",
    "LiveStats",
]


class LiveOptions(TypedDict, total=False):
    """The keyword options of :class:`LiveDatastore` (a subclass passes them on as they are)."""

    on_swap: Callable[[Datastore], None] | None  # given each swapped-in datastore (None)
    background: bool  # rebuild and snapshot on a thread of its own (True), else when asked
    salvage: bool  # keep what is readable of damaged data instead of refusing (False)
    background_nice: int  # the background threads' nice value (0: unchanged)
    unfolded: Unfolded | None  # drafts from each stored document until it is folded in (None)


class LiveDatastore:
    """The live datastore under ``directory``. Thread-safe."""

    def __init__(
        self,
        directory: str | Path,
        tokenizer: TokenizerIdentity,
        policy: LivePolicy | None = None,
        **options: Unpack[LiveOptions],
    ) -> None:
        self.background_nice = check_nice(options.get("background_nice", 0))
        self.directory = Path(directory)
        self.tokenizer = tokenizer
        on_swap, unfolded = options.get("on_swap"), options.get("unfolded")
        salvage = options.get("salvage", False)
        self._buffer, self._index = open_live_parts(
            self.directory, tokenizer, on_swap, salvage, unfolded
        )
        # Each replaced whole, so a read needs no lock.
        self._last_error: str | None = None  # the newest failed rebuild, snapshot, stream read
        self._policy = policy or LivePolicy()
        self._policy_lock = threading.Lock()  # serialises update_policy (a leaf lock)
        self._snapshot_root = self.directory / "snapshots"
        self._index.publish()
        if self._buffer.pending()[0]:
            self.rebuild()  # replayed log: serve it from the start
        self._thread: threading.Thread | None = None
        if options.get("background", True):
            self._thread = threading.Thread(
                target=self._run_background, name="live-datastore", daemon=True
            )
            self._thread.start()

    @property
    def policy(self) -> LivePolicy:
        """The current policy (:meth:`update_policy` replaces it)."""
        return self._policy

    # -- ingest ----------------------------------------------------------------------------

    def ingest(self, tokens: TokenIds) -> int:
        """Stores one document, fsynced when this returns; returns its log sequence number.
        Raises ValueError for bad ids, DatastoreFull past the bound."""
        doc = checked_document(tokens, self._policy, self.tokenizer.vocab_size)
        seq, due = self._buffer.accept(doc, self._policy, self._index)
        assert seq is not None  # only an entry of the stream can be a duplicate
        self._hold(seq, doc)
        if due and self._thread is None:
            self.rebuild()
        return seq

    def ingest_generation(self, prompt_ids: TokenIds, output_ids: TokenIds) -> int:
        """Stores a finished generation as the policy's ``store`` says."""
        vocab_size = self.tokenizer.vocab_size
        return self.ingest(generation_document(prompt_ids, output_ids, self._policy, vocab_size))

    def _hold(self, seq: int, doc: npt.NDArray[np.int32]) -> None:
        # Drafted from until a rebuild folds it in (if one already did, the tier ignores it).
        if self._index.unfolded is not None:
            self._index.unfolded.hold(seq, doc)

    # -- rebuild ---------------------------------------------------------------------------

    def rebuild(self) -> bool:
        """Folds the waiting documents in now; False when none were waiting."""
        try:
            return fold_pending(self._index, self._buffer, self._policy)
        except BaseException as exc:
            self._last_error = f"rebuild failed: {exc!r}"
            raise

    def run_maintenance_once(
        self, now_s: float | None = None, now_unix: float | None = None
    ) -> tuple[bool, bool]:
        """One turn of the background schedule as if at ``now_s`` (monotonic) and
        ``now_unix`` (default: now); returns (rebuild due, snapshot due). Tests step it."""
        records, tokens = self._buffer.pending()
        due = maintenance_due(
            self._index.state,
            records,
            tokens,
            self._policy,
            time.monotonic() if now_s is None else now_s,
            time.time() if now_unix is None else now_unix,
        )
        try:
            if due[0]:
                self.rebuild()
            if due[1]:
                self.snapshot()
        except Exception as exc:  # keep serving; retried at the next wake-up
            _maintenance_log.error("live datastore maintenance failed: %s", exc, error=exc)
            self._last_error = repr(exc)
        return due

    def _run_background(self) -> None:
        """The background thread, at ``background_nice``: wakes at least once a second (or
        on a full buffer, a policy change, close) and does what is due, until closed."""
        lower_thread_priority(self.background_nice)
        # The policy is read under the buffer's lock, which update_policy's wake-up takes,
        # so no change is missed.
        while self._buffer.wait_for_work(lambda: min(self._policy.rebuild_interval_s, 1.0)):
            self.run_maintenance_once()

    def add_rebuild_listener(self, listener: Callable[[float], None]) -> None:
        """Calls ``listener(seconds)`` after each later rebuild, on its thread (quick, no
        raising)."""
        self._index.add_listener(listener)

    # -- snapshots -------------------------------------------------------------------------

    def snapshot(self, name: str | None = None, *, pinned: bool = False) -> SnapshotInfo:
        """Writes the sub-indices as a snapshot and discards the log they cover; waiting
        documents stay in the log. ``pinned``: never rotated out by ``keep_snapshots``."""
        with self._index.changing:
            return self._write_snapshot(name, {PINNED_KEY: True} if pinned else {})

    def _write_snapshot(self, name: str | None, extra: Mapping[str, object]) -> SnapshotInfo:
        """Writes the sub-indices (default name ``snapshot-<position>-<ms>``), deletes the
        log they cover, rotates unpinned snapshots past ``keep_snapshots``. The caller
        holds the structural-change lock."""
        index = self._index
        state = index.state  # one state: the manifest describes exactly this content
        covered = state.covered
        if state.covered_origin is not None:
            extra = {**extra, LOG_OFFSET_KEY: str(state.covered_origin)}
        name = name or _stamped("snapshot", covered)
        info = self._write_covering(name, state.datastore, state.corpora, covered, extra)
        self._buffer.discard_through(
            covered, alongside=lambda: index.note_snapshot(covered, info.created_unix)
        )
        rotating = [s for s in self.snapshots() if not s.metadata.get(PINNED_KEY)]
        for old in rotating[: -self._policy.keep_snapshots]:
            delete_snapshot_files(old.path)
        return info

    def _write_covering(
        self,
        name: str,
        datastore: Datastore,
        corpora: tuple[Corpus, ...],
        position: int,
        extra: Mapping[str, object],
    ) -> SnapshotInfo:
        """Writes snapshot ``name`` of ``datastore`` (``corpora`` first) covering
        ``position``, its metadata ``extra`` then the corpus listing (never replaced), and
        reads its manifest back: only then may the log it covers be deleted."""
        meta = {**extra, CORPORA_KEY: corpora_listing(corpora)}
        path = self._snapshot_root / name
        info = write_snapshot(path, datastore, self.tokenizer, wal_position=position, metadata=meta)
        read_manifest(info.path)
        return info

    def snapshots(self) -> list[SnapshotInfo]:
        """The complete snapshots, oldest first (a restart begins from the last)."""
        return list_snapshots(self._snapshot_root)

    def delete_snapshot(self, name: str) -> None:
        """Deletes snapshot ``name``; refuses the newest (its log is gone: data loss)."""
        with self._index.changing:
            names = [s.path.name for s in self.snapshots()]
            if name not in names:
                raise KeyError(f"no snapshot {name!r}")
            if name == names[-1]:
                raise SnapshotError(
                    f"snapshot {name!r} is the newest: a restart begins from it, so it cannot "
                    "be deleted (write a newer snapshot first)"
                )
            delete_snapshot_files(self._snapshot_root / name)

    def restore(self, name: str) -> SnapshotInfo:
        """Rolls the datastore (corpora included) back to snapshot ``name``: ingests
        acknowledged before this call that it lacks are discarded. Durably: the content is
        first written (hardlinked) as a new snapshot covering the newest acknowledged
        position ``P``, then swapped in, then the log through ``P`` deleted; later ingests
        are kept. Returns the new snapshot."""
        index = self._index
        with index.changing:
            if name not in {s.path.name for s in self.snapshots()}:
                raise KeyError(f"no snapshot {name!r}")
            root = self._snapshot_root
            loaded, source = load_snapshot(root / name, expect_tokenizer=self.tokenizer)
            corpora, learned = split_corpora(loaded, source)
            position = self._buffer.restore_point()
            extra = {"restored_from": name, "discarded_through": position}
            info = self._write_covering(
                _stamped("restored", position), loaded, corpora, position, extra
            )
            # The swap, the waiting documents it discards and the log through them: at once.
            self._buffer.discard_through(
                position,
                alongside=lambda: index.install_restored(
                    corpora, learned, position, info.created_unix
                ),
            )
            index.publish()
            log.info("restored snapshot %s (log through %d discarded)", name, position)
            return info

    # -- corpora ---------------------------------------------------------------------------

    @property
    def corpora(self) -> tuple[Corpus, ...]:
        return self._index.state.corpora

    def add_corpus(self, corpus: Corpus) -> SnapshotInfo:
        """Adds ``corpus`` after the others and writes a snapshot. Raises ValueError for
        a name in use or another vocabulary, DatastoreFull past ``max_resident_bytes``."""
        with self._index.changing:
            state, bound = self._index.state, self._policy.max_resident_bytes
            return self._swap_corpora(with_corpus(state.corpora, corpus, state.datastore, bound))

    def remove_corpus(self, name: str) -> SnapshotInfo:
        """Removes corpus ``name`` (KeyError when absent) and writes a snapshot."""
        with self._index.changing:
            return self._swap_corpora(without_corpus(self._index.state.corpora, name))

    def _swap_corpora(self, corpora: tuple[Corpus, ...]) -> SnapshotInfo:
        """Swaps in ``corpora``, then snapshots. The caller holds the structural-change lock
        from reading the corpora it changed, so swaps reach ``on_swap`` in order."""
        self._index.install_corpora(corpora)
        return self._write_snapshot(None, {})

    # -- live settings ---------------------------------------------------------------------

    def update_policy(self, **changes: int | float) -> LivePolicy:
        """Changes ``LIVE_SETTINGS`` fields, validated together, from the next wake-up."""
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
        return self._index.state.datastore

    def stats(self) -> LiveStats:
        """The parts' views as one, read in this order (index set, buffer), each of one
        state (the buffer's under its lock), so each part is consistent and the buffer's is
        slightly newer. Coverage only follows what was logged before, so
        ``covered_position`` never passes ``wal_position`` (nor ``covered_offset``
        ``consumed_offset``) and no document counts in both ``num_tokens`` and
        ``pending_tokens``; one a rebuild is folding is in neither."""
        state = self._index.state
        datastore = state.datastore
        return LiveStats(
            num_tokens=datastore.num_tokens,
            sub_indices=len(datastore.sub_indices),
            resident_bytes=datastore.resident_bytes,
            rebuilds=state.rebuilds,
            rebuild_seconds_total=state.rebuild_seconds_total,
            last_rebuild_seconds=state.last_rebuild_seconds,
            covered_position=state.covered,
            covered_offset=state.covered_origin,
            last_snapshot_unix=state.last_snapshot_unix,
            **self._buffer.stats(),
            last_error=self._last_error,
            shared_log=False,
        )

    def content_digest(self) -> str:
        """SHA-256 over each learned sub-index's tokens: equal on replicas that folded the
        same stream entries (about 10 ms per 6M tokens)."""
        digest = hashlib.sha256()
        for sub in self._index.state.learned:
            tokens = np.ascontiguousarray(sub.tokens(), dtype="<i4")
            digest.update(len(tokens).to_bytes(8, "little"))
            digest.update(tokens.tobytes())
        return digest.hexdigest()

    def close(self) -> None:
        """Stops the background thread. Waiting documents stay in the log."""
        self._buffer.close()
        if self._thread is not None:
            self._thread.join()
        self._buffer.close_log()

    def __enter__(self) -> LiveDatastore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stamped(prefix: str, position: int) -> str:
    """A snapshot name that sorts by log position, then by time."""
    return f"{prefix}-{position:012d}-{time.time_ns() // 1_000_000}"
