"""The live datastore's snapshots: writing, listing, deleting, restoring.

A snapshot holds the sub-indices as of a log position (``wal_position``); once it is
written and read back, the log it covers is deleted, so the newest complete snapshot plus
the log after it is the whole datastore. Layout: docs/snapshot-format.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from drafter_service.datastore.sub_indices import Datastore
from drafter_service.live.index_set import IndexSet
from drafter_service.live.live_policy import LivePolicy
from drafter_service.live.pending_buffer import PendingBuffer
from drafter_service.live.pinned_corpora import (
    CORPORA_KEY,
    Corpus,
    corpora_listing,
    split_corpora,
)
from drafter_service.snapshot.store import (
    SnapshotError,
    SnapshotInfo,
    TokenizerIdentity,
    delete_snapshot,
    list_snapshots,
    load_snapshot,
    read_manifest,
    write_snapshot,
)

log = logging.getLogger(__name__)

PINNED_KEY = "pinned"
"""Snapshot metadata flag: never deleted by the ``keep_snapshots`` rotation."""

LOG_OFFSET_KEY = "log_offset"
"""Snapshot metadata: the stream entry id of the newest document it holds (absent: none);
a replica started from it consumes the stream after that."""


def manifest_metadata(corpora: Sequence[Corpus], extra: Mapping[str, object]) -> dict[str, object]:
    """A live snapshot's ``metadata``: ``extra``, then the corpus listing (never replaced)."""
    return {**extra, CORPORA_KEY: corpora_listing(corpora)}


class LiveSnapshots:
    """The snapshots under ``root`` of the datastore of ``index`` and ``buffer``."""

    def __init__(
        self,
        index: IndexSet,
        buffer: PendingBuffer,
        tokenizer: TokenizerIdentity,
        policy: Callable[[], LivePolicy],
        root: Path,
    ) -> None:
        self._index, self._buffer = index, buffer
        self._tokenizer, self._policy = tokenizer, policy
        self.root = root

    def write(self, name: str | None, extra: Mapping[str, object]) -> SnapshotInfo:
        """Writes the sub-indices (default name ``snapshot-<position>-<ms>``), deletes the
        log they cover, rotates unpinned snapshots past ``keep_snapshots``. The caller
        holds the structural-change lock."""
        index = self._index
        state = index.state  # one state: the manifest describes exactly this content
        covered = state.covered
        if state.covered_origin is not None:
            extra = {**extra, LOG_OFFSET_KEY: str(state.covered_origin)}
        name = name or _stamped("snapshot", covered)
        metadata = manifest_metadata(state.corpora, extra)
        info = self._write_covering(name, state.datastore, covered, metadata)
        self._buffer.discard_through(
            covered, alongside=lambda: index.note_snapshot(covered, info.created_unix)
        )
        rotating = [s for s in list_snapshots(self.root) if not s.metadata.get(PINNED_KEY)]
        for old in rotating[: -self._policy().keep_snapshots]:
            delete_snapshot(old.path)
        return info

    def delete(self, name: str) -> None:
        with self._index.changing:
            names = [s.path.name for s in list_snapshots(self.root)]
            if name not in names:
                raise KeyError(f"no snapshot {name!r}")
            if name == names[-1]:
                raise SnapshotError(
                    f"snapshot {name!r} is the newest: a restart begins from it, so it cannot "
                    "be deleted (write a newer snapshot first)"
                )
            delete_snapshot(self.root / name)

    def restore(self, name: str) -> SnapshotInfo:
        index = self._index
        with index.changing:
            if name not in {s.path.name for s in list_snapshots(self.root)}:
                raise KeyError(f"no snapshot {name!r}")
            loaded, source = load_snapshot(self.root / name, expect_tokenizer=self._tokenizer)
            corpora, learned = split_corpora(loaded, source)
            position = self._buffer.restore_point()
            extra = {"restored_from": name, "discarded_through": position}
            info = self._write_covering(
                _stamped("restored", position), loaded, position, manifest_metadata(corpora, extra)
            )
            # The swap, the waiting documents it discards and the log through them: at once.
            self._buffer.discard_through(
                position,
                alongside=lambda: index.install_restored(
                    corpora, learned, position, info.created_unix
                ),
            )
            index.publish(index.state.datastore)
            log.info("restored snapshot %s (log through %d discarded)", name, position)
            return info

    def _write_covering(
        self, name: str, datastore: Datastore, position: int, metadata: Mapping[str, object]
    ) -> SnapshotInfo:
        """Writes snapshot ``name`` covering ``position`` and reads its manifest back: only
        then may the log it covers be deleted."""
        info = write_snapshot(
            self.root / name, datastore, self._tokenizer, wal_position=position, metadata=metadata
        )
        read_manifest(info.path)
        return info


def _stamped(prefix: str, position: int) -> str:
    """A snapshot name that sorts by log position, then by time."""
    return f"{prefix}-{position:012d}-{time.time_ns() // 1_000_000}"
