"""What the live datastore drafts from: its sub-indices and what they cover.

:class:`IndexSet` holds an :class:`IndexState` (the corpora, the learned sub-indices, the
current immutable :class:`Datastore` of them, the log position and stream entry they
cover, the newest snapshot's coverage, rebuild statistics), replaced whole at each change,
so a read takes no lock and sees one consistent state; beside it the rebuild listeners,
``on_swap`` and ``unfolded``. Its structural-change lock (:attr:`IndexSet.changing`)
admits one rebuild, snapshot, restore or corpus change at a time and is held around every
change and swap, so states are replaced one after another and swaps reach ``on_swap`` in
order; drafting never waits for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

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
class IndexState:
    """The sub-indices and what they cover (what the maintenance schedule weighs, and
    what a snapshot's manifest describes), as of one change."""

    corpora: tuple[Corpus, ...]
    learned: tuple[SubIndex, ...]
    datastore: Datastore  # the corpora's sub-indices (its base), then the learned ones
    covered: int  # newest log record folded into the sub-indices
    covered_origin: StreamId | None  # newest shared-stream entry in them (a snapshot records it)
    snapshot_covered: int  # newest log record the newest snapshot holds
    last_snapshot_unix: float | None
    last_rebuild_monotonic: float = field(default_factory=time.monotonic)
    rebuild_tokens_per_s: float = 0.0  # measured by the last rebuild; 0: none yet
    rebuilds: int = 0
    rebuild_seconds_total: float = 0.0
    last_rebuild_seconds: float = 0.0

    @classmethod
    def loaded(
        cls,
        corpora: tuple[Corpus, ...],
        learned: tuple[SubIndex, ...],
        vocab_size: int,
        covered: int,
        covered_origin: StreamId | None,
        snapshot_unix: float | None,
    ) -> IndexState:
        """The state a start begins from: a snapshot's content (none: empty), covering the
        log through ``covered`` (0: none), before any rebuild."""
        datastore = joined_datastore(corpora, learned, vocab_size)
        return cls(corpora, learned, datastore, covered, covered_origin, covered, snapshot_unix)

    def with_indices(
        self, corpora: tuple[Corpus, ...], learned: tuple[SubIndex, ...]
    ) -> IndexState:
        """This state with ``corpora`` and ``learned`` (and their datastore) current."""
        datastore = joined_datastore(corpora, learned, self.datastore.vocab_size)
        return replace(self, corpora=corpora, learned=learned, datastore=datastore)


class IndexSet:
    """The corpora and learned sub-indices of one live datastore; thread-safe."""

    def __init__(
        self,
        state: IndexState,
        on_swap: Callable[[Datastore], None] | None,
        unfolded: Unfolded | None = None,
    ) -> None:
        self.vocab_size = state.datastore.vocab_size
        self.unfolded = unfolded
        # The structural-change lock (first in the package's lock order).
        self.changing = threading.Lock()
        self._on_swap = on_swap
        self.state = state  # replaced whole, under the structural-change lock: reads need none
        self._listeners: tuple[Callable[[float], None], ...] = ()

    # -- reads -----------------------------------------------------------------------------

    def check_room(self, waiting_tokens: int, n_tokens: int, policy: LivePolicy) -> None:
        """Raises DatastoreFull when ``n_tokens`` more (``waiting_tokens`` waiting
        already) could not stay resident."""
        bound = policy.max_resident_bytes
        if bound is None:
            return
        state = self.state
        subs = state.learned
        # What stays resident after the next rebuild drops every older sub-index: the one
        # the waiting documents land in.
        waiting = waiting_tokens + n_tokens
        if subs and subs[-1].num_tokens + 1 + waiting <= policy.max_sub_index_tokens:
            waiting += subs[-1].num_tokens + 1  # they extend the newest
        needed = 8 * waiting + 4 * (self.vocab_size + 1)  # text + SA + token table
        needed += sum(c.resident_bytes for c in state.corpora)  # never dropped
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
    ) -> None:
        """Makes a rebuild's ``learned`` (the log through ``through``, newest stream entry
        ``origin``) current, publishes it, then calls the listeners."""
        state = self.state
        self.state = replace(
            state.with_indices(state.corpora, learned),
            covered=through,
            covered_origin=state.covered_origin if origin is None else origin,
            rebuilds=state.rebuilds + 1,
            rebuild_seconds_total=state.rebuild_seconds_total + elapsed_s,
            last_rebuild_seconds=elapsed_s,
            last_rebuild_monotonic=time.monotonic(),
            rebuild_tokens_per_s=(
                work_tokens / elapsed_s if elapsed_s > 0 else state.rebuild_tokens_per_s
            ),
        )
        self.publish()
        for listener in self._listeners:
            listener(elapsed_s)

    def install_corpora(self, corpora: tuple[Corpus, ...]) -> None:
        """Makes ``corpora`` current and publishes it."""
        self.state = self.state.with_indices(corpora, self.state.learned)
        self.publish()

    def install_restored(
        self,
        corpora: tuple[Corpus, ...],
        learned: tuple[SubIndex, ...],
        position: int,
        snapshot_unix: float,
    ) -> None:
        """Makes a restored snapshot current, covering (with its new snapshot) ``position``."""
        self.state = replace(
            self.state.with_indices(corpora, learned),
            covered=position,
            snapshot_covered=position,
            last_snapshot_unix=snapshot_unix,
        )

    def note_snapshot(self, covered: int, snapshot_unix: float) -> None:
        """Records that a snapshot now holds the log through ``covered``."""
        self.state = replace(self.state, snapshot_covered=covered, last_snapshot_unix=snapshot_unix)

    def publish(self) -> None:
        """Hands the current datastore to ``on_swap``, then tells ``unfolded`` what it covers."""
        if self._on_swap is not None:
            self._on_swap(self.state.datastore)
        if self.unfolded is not None:
            self.unfolded.release_through(self.state.covered)

    def add_listener(self, listener: Callable[[float], None]) -> None:
        """Calls ``listener(seconds)`` after every later successful rebuild (waits for a
        structural change under way)."""
        with self.changing:
            self._listeners = (*self._listeners, listener)
