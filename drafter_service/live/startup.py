"""Opening a live datastore: the newest complete snapshot, then the log after it.

:func:`open_live_state` clears what interrupted snapshot writes left, loads the newest
complete snapshot, opens the ingest log after the position that snapshot covers (its
later records are the documents waiting for a rebuild) and refuses to start when an
unreadable newer snapshot may hold ingests that neither the loaded snapshot nor the log
has (:func:`check_damaged_snapshots`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.live.ingest_log import IngestLog
from drafter_service.live.live_policy import LivePolicy
from drafter_service.live.live_state import LiveState
from drafter_service.live.pinned_corpora import Corpus, joined_datastore, split_corpora
from drafter_service.live.snapshotting import LOG_OFFSET_KEY
from drafter_service.live.stream_ids import StreamId
from drafter_service.snapshot.array_files import DamagedDataError, move_aside
from drafter_service.snapshot.store import (
    SnapshotInfo,
    TokenizerIdentity,
    load_snapshot,
    remove_stale_temporaries,
    scan_snapshots,
)

log = logging.getLogger(__name__)


def open_live_state(
    directory: Path,
    tokenizer: TokenizerIdentity,
    policy: LivePolicy,
    on_swap: Callable[[Datastore], None] | None,
    salvage: bool,
) -> LiveState:
    """The state of the live datastore under ``directory`` as its files hold it: the
    newest snapshot's content, with the log records after it waiting. ``salvage``: keep
    what is readable of a damaged log or snapshot instead of refusing to start."""
    snapshots = directory / "snapshots"
    snapshots.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(snapshots)
    corpora: tuple[Corpus, ...] = ()
    learned: tuple[SubIndex, ...] = ()
    covered, last_snapshot, offset = 0, None, None
    complete, damaged = scan_snapshots(snapshots)
    if complete:
        loaded, info = load_snapshot(complete[-1].path, expect_tokenizer=tokenizer)
        corpora, learned = split_corpora(loaded, info)
        covered, last_snapshot = info.wal_position, info.created_unix
        offset = snapshot_offset(info)
    datastore = joined_datastore(corpora, learned, tokenizer.vocab_size)
    ingest_log = IngestLog(directory / "wal", covered_seq=covered, salvage=salvage)
    newest = complete[-1] if complete else None
    check_damaged_snapshots(damaged, newest, ingest_log, directory, salvage)
    known = [o for o in (ingest_log.last_origin, offset) if o is not None]
    return LiveState(
        tokenizer=tokenizer,
        policy=policy,
        log=ingest_log,
        corpora=corpora,
        learned=learned,
        covered=covered,
        last_snapshot_unix=last_snapshot,
        on_swap=on_swap,
        datastore=datastore,
        pending=ingest_log.recovered(),
        consumed=max(known, default=None),
        covered_origin=offset,
    )


def snapshot_offset(info: SnapshotInfo) -> StreamId | None:
    """The shared-stream entry id a snapshot's content reaches (None: none recorded)."""
    try:
        return StreamId.parse_optional(info.metadata.get(LOG_OFFSET_KEY))
    except ValueError as exc:
        raise DamagedDataError(f"snapshot {info.path}: metadata {LOG_OFFSET_KEY}: {exc}") from None


def check_damaged_snapshots(
    damaged: list[tuple[Path, str]],
    newest: SnapshotInfo | None,
    ingest_log: IngestLog,
    directory: Path,
    salvage: bool,
) -> None:
    """Refuses to start from an older snapshot when a damaged newer one (``damaged``:
    unreadable snapshot directories and why) holds ingests the log no longer has;
    ``salvage`` moves damaged snapshots aside (into ``directory/damaged``) instead."""
    if not damaged:
        return
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
            "silently serve less. Repair or restore it, or start with --salvage to move it "
            f"aside into {directory / 'damaged'} and serve what remains"
        )
    for path, why in damaged:
        if salvage:
            moved = move_aside(path, directory / "damaged")
            log.error("unreadable snapshot %s (%s) moved aside to %s", path, why, moved)
        else:
            log.warning("unreadable snapshot %s (%s): the ingest log covers everything "
                        "after the snapshot loaded, so nothing is lost", path, why)  # fmt: skip
