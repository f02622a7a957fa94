"""Opening a live datastore: the newest complete snapshot, then the log after it.

:func:`open_live_parts` clears interrupted snapshot writes, loads the newest intact
snapshot and opens the ingest log after it (its later records wait for a rebuild). It
refuses to start when a damaged newer snapshot may hold ingests neither has or the log
does not continue where the snapshot ends (:func:`check_log_coverage`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from drafter_service.datastore.sub_indices import Datastore
from drafter_service.live.index_set import IndexSet, IndexState, Unfolded
from drafter_service.live.ingest_log import IngestLog
from drafter_service.live.pending_buffer import PendingBuffer
from drafter_service.live.pinned_corpora import split_corpora
from drafter_service.live.stream_ids import StreamId
from drafter_service.snapshot.array_files import DamagedDataError, move_aside
from drafter_service.snapshot.store import (
    SnapshotError,
    SnapshotInfo,
    TokenizerIdentity,
    check_tokenizer,
    load_snapshot,
    remove_stale_temporaries,
    scan_snapshots,
)

log = logging.getLogger(__name__)

LOG_OFFSET_KEY = "log_offset"
"""Snapshot metadata: the stream entry id of the newest document it holds (absent: none);
a replica started from it consumes the stream after that."""


def open_live_parts(
    directory: Path,
    tokenizer: TokenizerIdentity,
    on_swap: Callable[[Datastore], None] | None,
    salvage: bool,
    unfolded: Unfolded | None = None,
) -> tuple[PendingBuffer, IndexSet]:
    """The parts of the live datastore under ``directory`` (lock order: the package
    docstring): the log after the newest snapshot, waiting, and the snapshot's index set.
    ``salvage``: keep what is readable of damaged data instead of refusing."""
    snapshots = directory / "snapshots"
    snapshots.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(snapshots)
    complete, damaged = scan_snapshots(snapshots)
    info, state = _load_newest_readable(complete, tokenizer, damaged)
    ingest_log = IngestLog(directory / "wal", covered_seq=state.covered, salvage=salvage)
    try:
        check_log_coverage(damaged, info, ingest_log, directory, salvage)
    except BaseException:
        ingest_log.close()
        raise
    known = [o for o in (ingest_log.last_origin, state.covered_origin) if o is not None]
    return PendingBuffer(ingest_log, max(known, default=None)), IndexSet(state, on_swap, unfolded)


def _load_newest_readable(
    complete: list[SnapshotInfo], tokenizer: TokenizerIdentity, damaged: list[tuple[Path, str]]
) -> tuple[SnapshotInfo | None, IndexState]:
    """The newest intact snapshot of ``complete`` (None: none) and the index state it
    holds (an empty datastore without one); each newer damaged one (file missing,
    truncated or failing its checksum, manifest not describing its files, bad metadata)
    is added to ``damaged`` with why. Another tokenizer is a setting error: refused."""
    vocab_size = tokenizer.vocab_size
    for candidate in reversed(complete):
        check_tokenizer(candidate, tokenizer)
        try:
            loaded, info = load_snapshot(candidate.path, expect_tokenizer=tokenizer)
            corpora, learned = split_corpora(loaded, info)
            offset = snapshot_offset(info)
        except (SnapshotError, DamagedDataError) as exc:
            damaged.append((candidate.path, str(exc)))
            continue
        return info, IndexState.loaded(
            corpora, learned, vocab_size, info.wal_position, offset, info.created_unix
        )
    return None, IndexState.loaded((), (), vocab_size, 0, None, None)


def snapshot_offset(info: SnapshotInfo) -> StreamId | None:
    """The shared-stream entry id a snapshot reaches (None: none recorded)."""
    try:
        return StreamId.parse_optional(info.metadata.get(LOG_OFFSET_KEY))
    except ValueError as exc:
        raise DamagedDataError(f"snapshot {info.path}: metadata {LOG_OFFSET_KEY}: {exc}") from None


def check_log_coverage(
    damaged: list[tuple[Path, str]],
    newest: SnapshotInfo | None,
    ingest_log: IngestLog,
    directory: Path,
    salvage: bool,
) -> None:
    """Refuses to start from ``newest`` (None: no snapshot) when ingests acknowledged after
    it may be lost: a damaged newer snapshot (``damaged``: paths and why) may hold some the
    log no longer has, or the log begins past the record after the snapshot's coverage
    (the records between are a gap). ``salvage`` moves the damaged ones aside and serves
    what remains."""
    covered = newest.wal_position if newest is not None else 0
    first = ingest_log.first_seq
    # Nothing is lost when the log still holds every record after what we load.
    lost = first is None or first > covered + 1
    # An unreadable snapshot older than the one loaded holds nothing newer.
    newer = [
        (path, why) for path, why in damaged
        if newest is None or path.stat().st_mtime >= newest.created_unix - 1
    ]  # fmt: skip
    listing = "; ".join(f"{path} ({why})" for path, why in damaged)
    if lost and newer and not salvage:
        loaded = f"snapshot {newest.path.name} covers" if newest else "no snapshot covers"
        holds = f"starts at record {first}" if first is not None else "holds no records"
        raise DamagedDataError(
            f"unreadable snapshot(s): {listing}. The newest readable {loaded} the ingest "
            f"log through record {covered} and the log {holds}, so ingests acknowledged "
            f"after record {covered} may exist only in the damaged snapshot: starting would "
            "silently serve less. Repair or restore it, or start with --salvage true to move it "
            f"aside into {directory / 'damaged'} and serve what remains"
        )
    for path, why in damaged:
        if salvage:
            moved = move_aside(path, directory / "damaged")
            log.error("unreadable snapshot %s (%s) moved aside to %s", path, why, moved)
        else:
            log.warning("unreadable snapshot %s (%s): the ingest log covers everything "
                        "after the snapshot loaded, so nothing is lost", path, why)  # fmt: skip
    if first is None or not lost:  # the log continues where the snapshot ends
        return
    loaded = (
        f"the snapshot loaded, {newest.path}, covers the ingest log through record {covered}"
        if newest is not None
        else "no readable snapshot covers any of the ingest log"
    )
    gap = (
        f"{loaded}, but the log ({ingest_log.directory}) starts at record {first}: records "
        f"{covered + 1} to {first - 1} are in neither (a newer snapshot missing, or a "
        "manifest whose wal_position is not what its snapshot holds), so starting would "
        "serve less than was acknowledged"
    )
    if not salvage:
        raise DamagedDataError(
            f"{gap}. Restore the missing snapshot, or start with --salvage true to serve "
            "what remains"
        )
    log.error("%s; --salvage: serving what remains", gap)
