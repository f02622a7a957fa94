"""What the live datastore drafts from: its sub-indices and what they cover.

:class:`IndexSet` owns the corpora, the learned sub-indices, the current immutable
:class:`Datastore` of them, the log position and stream entry they cover, the newest
snapshot's coverage, rebuild statistics and listeners, ``on_swap`` and ``unfolded``. Its
structural-change lock (:attr:`IndexSet.changing`) admits one rebuild, snapshot, restore
or corpus change at a time and is held around every swap, so swaps reach ``on_swap`` in
order; its other lock guards the fields for bookkeeping only, so drafting never waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.live.live_policy import DatastoreFull, LivePolicy
from drafter_service.live.pinned_corpora import Corpus, joined_datastore
from drafter_service.live.stream_ids import StreamId


class Unfolded(Protocol):
    """What drafts from stored documents until a rebuild folds them in: the drafter's
    recent tier (``Drafter.hold`` and ``release_through``)."""

    def hold(self, position: int, tokens: npt.NDArray[np.int32]) -> bool:
        """Drafts from the document stored at log ``position`` until it is released."""
        ...

    def release_through(self, position: int) -> None:
        """The swapped-in datastore holds every document through ``position``."""
        ...


@dataclass(frozen=True, slots=True)
class IndexProgress:
    """What the maintenance schedule weighs: the sub-indices' coverage and timings."""

    learned: tuple[SubIndex, ...]
    covered: int  # newest log record folded into the sub-indices
    snapshot_covered: int  # newest log record the newest snapshot holds
    last_snapshot_unix: float | None
    last_rebuild_monotonic: float
    rebuild_tokens_per_s: float  # measured by the last rebuild; 0: none yet


class IndexSet:
    """The corpora and learned sub-indices of one live datastore; thread-safe."""

    def __init__(
        self,
        vocab_size: int,
        corpora: tuple[Corpus, ...],
        learned: tuple[SubIndex, ...],
        covered: int,
        covered_origin: StreamId | None,
        last_snapshot_unix: float | None,
        on_swap: Callable[[Datastore], None] | None,
        unfolded: Unfolded | None = None,
    ) -> None:
        self.vocab_size = vocab_size
        self.unfolded = unfolded
        # The structural-change lock (first in the package's lock order).
        self.changing = threading.Lock()
        self._lock = threading.Lock()
        self._on_swap = on_swap
        self._install(corpora, learned)
        self._covered = covered
        # The newest shared-stream entry in the sub-indices (what a snapshot records).
        self._covered_origin = covered_origin
        self._snapshot_covered = covered
        self._last_snapshot_unix = last_snapshot_unix
        self._rebuilds = 0
        self._rebuild_seconds = 0.0
        self._last_rebuild_seconds = 0.0
        self._last_rebuild_monotonic = time.monotonic()
        self._rebuild_tokens_per_s = 0.0
        self._listeners: tuple[Callable[[float], None], ...] = ()

    # -- reads -----------------------------------------------------------------------------

    @property
    def datastore(self) -> Datastore:
        with self._lock:
            return self._datastore

    @property
    def corpora(self) -> tuple[Corpus, ...]:
        with self._lock:
            return self._corpora

    @property
    def learned(self) -> tuple[SubIndex, ...]:
        with self._lock:
            return self._learned

    def snapshot_content(self) -> tuple[Datastore, int, tuple[Corpus, ...], StreamId | None]:
        """(datastore, covered position, corpora, newest stream entry), read together so
        a manifest written from them describes exactly that content."""
        with self._lock:
            return self._datastore, self._covered, self._corpora, self._covered_origin

    def progress(self) -> IndexProgress:
        with self._lock:
            return IndexProgress(
                self._learned,
                self._covered,
                self._snapshot_covered,
                self._last_snapshot_unix,
                self._last_rebuild_monotonic,
                self._rebuild_tokens_per_s,
            )

    def stats(self) -> dict[str, Any]:
        """Its ``LiveStats`` fields, read together."""
        with self._lock:
            ds = self._datastore
            return {
                "num_tokens": ds.num_tokens,
                "sub_indices": len(ds.sub_indices),
                "resident_bytes": ds.resident_bytes,
                "rebuilds": self._rebuilds,
                "rebuild_seconds_total": self._rebuild_seconds,
                "last_rebuild_seconds": self._last_rebuild_seconds,
                "covered_position": self._covered,
                "covered_offset": self._covered_origin,
                "last_snapshot_unix": self._last_snapshot_unix,
            }

    def check_room(self, waiting_tokens: int, n_tokens: int, policy: LivePolicy) -> None:
        """Raises DatastoreFull when ``n_tokens`` more (``waiting_tokens`` waiting
        already) could not stay resident."""
        bound = policy.max_resident_bytes
        if bound is None:
            return
        with self._lock:
            subs, corpora = self._learned, self._corpora
        # What stays resident after the next rebuild drops every older sub-index: the one
        # the waiting documents land in.
        waiting = waiting_tokens + n_tokens
        if subs and subs[-1].num_tokens + 1 + waiting <= policy.max_sub_index_tokens:
            waiting += subs[-1].num_tokens + 1  # they extend the newest
        needed = 8 * waiting + 4 * (self.vocab_size + 1)  # text + SA + token table
        needed += sum(c.resident_bytes for c in corpora)  # never dropped
        if needed > bound:
            raise DatastoreFull(
                f"ingest of {n_tokens} tokens refused: it needs {needed} bytes, over the "
                f"max_resident_bytes bound of {bound}"
            )

    # -- changes (the caller holds the structural-change lock) -----------------------------

    def install_rebuild(
        self,
        learned: tuple[SubIndex, ...],
        through: int,
        origin: StreamId | None,
        elapsed_s: float,
        work_tokens: int,
    ) -> tuple[Datastore, tuple[Callable[[float], None], ...]]:
        """Makes a rebuild's ``learned`` (the log through ``through``, newest stream entry
        ``origin``) current; returns the datastore to :meth:`publish` and the listeners."""
        with self._lock:
            datastore = self._install(self._corpora, learned)
            self._covered = through
            if origin is not None:
                self._covered_origin = origin
            self._rebuilds += 1
            self._rebuild_seconds += elapsed_s
            self._last_rebuild_seconds = elapsed_s
            self._last_rebuild_monotonic = time.monotonic()
            if elapsed_s > 0:
                self._rebuild_tokens_per_s = work_tokens / elapsed_s
            return datastore, self._listeners

    def install_corpora(self, corpora: tuple[Corpus, ...]) -> Datastore:
        """Makes ``corpora`` current; returns the datastore to :meth:`publish`."""
        with self._lock:
            return self._install(corpora, self._learned)

    def install_restored(
        self,
        corpora: tuple[Corpus, ...],
        learned: tuple[SubIndex, ...],
        position: int,
        snapshot_unix: float,
    ) -> None:
        """Makes a restored snapshot current, covering (with its new snapshot) ``position``."""
        with self._lock:
            self._install(corpora, learned)
            self._covered = self._snapshot_covered = position
            self._last_snapshot_unix = snapshot_unix

    def note_snapshot(self, covered: int, snapshot_unix: float) -> None:
        """Records that a snapshot now holds the log through ``covered``."""
        with self._lock:
            self._snapshot_covered = covered
            self._last_snapshot_unix = snapshot_unix

    def _install(self, corpora: tuple[Corpus, ...], learned: tuple[SubIndex, ...]) -> Datastore:
        datastore = joined_datastore(corpora, learned, self.vocab_size)
        self._datastore, self._corpora, self._learned = datastore, corpora, learned
        return datastore

    def publish(self, datastore: Datastore) -> None:
        """Hands ``datastore`` to ``on_swap``, then tells ``unfolded`` what it covers
        (without the lock)."""
        if self._on_swap is not None:
            self._on_swap(datastore)
        if self.unfolded is not None:
            with self._lock:
                covered = self._covered
            self.unfolded.release_through(covered)

    def add_listener(self, listener: Callable[[float], None]) -> None:
        """Calls ``listener(seconds)`` after every later successful rebuild."""
        with self._lock:
            self._listeners = (*self._listeners, listener)
