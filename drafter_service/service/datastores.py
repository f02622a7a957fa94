"""The service's datastores: the live default one and read-only named snapshots, each
with its own Drafter (request state) and the one worker thread its calls run on."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from drafter_service.drafter import Drafter
from drafter_service.live_datastore import LiveDatastore
from drafter_service.service.config import DEFAULT_DATASTORE, ServeConfig
from drafter_service.snapshot import (
    TokenizerIdentity,
    list_snapshots,
    load_snapshot,
    read_manifest,
    write_snapshot,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DatastoreStats:
    num_tokens: int  # text positions (tokens plus document separators)
    sub_indices: int
    resident_bytes: int


@dataclass(frozen=True, slots=True)
class DatastoreSlot:
    """One datastore and the drafter that holds the state of the requests using it."""

    name: str
    drafter: Drafter
    live: LiveDatastore | None  # None: read-only
    executor: ThreadPoolExecutor  # one worker: this drafter's calls run in call order

    def stats(self) -> DatastoreStats:
        if self.live is not None:
            s = self.live.stats()
            return DatastoreStats(s.num_tokens, s.sub_indices, s.resident_bytes)
        ds = self.drafter.datastore
        return DatastoreStats(ds.num_tokens, len(ds.sub_indices), ds.resident_bytes)


@dataclass(frozen=True, slots=True)
class Catalog:
    """Every datastore of the service, by name; ``DEFAULT_DATASTORE`` is the live one."""

    tokenizer: TokenizerIdentity
    slots: dict[str, DatastoreSlot]

    def close(self) -> None:
        """Waits for queued drafting work, then closes the live datastore (its waiting
        documents stay in the ingest log)."""
        for slot in self.slots.values():
            slot.executor.shutdown(wait=True)
        for slot in self.slots.values():
            if slot.live is not None:
                slot.live.close()


def resolve_tokenizer(config: ServeConfig) -> TokenizerIdentity:
    """From --tokenizer, else the seed snapshot's, else the data directory's newest
    snapshot's, else (``tokenizer_name`` or "unknown", --vocab-size, no fingerprint)."""
    if config.tokenizer is not None:
        return TokenizerIdentity.from_file(
            config.tokenizer, config.tokenizer_name, config.vocab_size
        )
    known: TokenizerIdentity | None = None
    if config.snapshot is not None:
        known = read_manifest(config.snapshot).tokenizer
    elif existing := list_snapshots(config.data_dir / "snapshots"):
        known = existing[-1].tokenizer
    if known is not None:
        if config.vocab_size is not None and config.vocab_size != known.vocab_size:
            raise ValueError(
                f"vocab_size {config.vocab_size} differs from the snapshot tokenizer "
                f"{known.describe()}"
            )
        return known
    if config.vocab_size is None:
        raise ValueError(
            "the vocabulary size is unknown: pass --vocab-size (DRAFTER_VOCAB_SIZE), "
            "--tokenizer or --snapshot"
        )
    return TokenizerIdentity(config.tokenizer_name or "unknown", config.vocab_size, "")


def seed_snapshot(snapshot: Path, data_dir: Path, tokenizer: TokenizerIdentity) -> bool:
    """Copies ``snapshot`` into ``data_dir``/snapshots when that holds none yet (sub-index
    files are hardlinked where possible, the copy written atomically). Returns whether
    it seeded; a live directory that already has a snapshot keeps its own."""
    target_root = data_dir / "snapshots"
    if list_snapshots(target_root):
        log.info("%s already has a snapshot: --snapshot %s is not used", data_dir, snapshot)
        return False
    datastore, info = load_snapshot(snapshot, expect_tokenizer=tokenizer)
    metadata = dict(info.metadata)
    metadata["seeded_from"] = str(Path(snapshot).resolve())
    write_snapshot(
        target_root / info.path.resolve().name,
        datastore,
        info.tokenizer,
        wal_position=0,
        metadata=metadata,
    )
    log.info("seeded %s from snapshot %s (%d positions)", data_dir, snapshot, datastore.num_tokens)
    return True


def open_catalog(config: ServeConfig) -> Catalog:
    """Opens every datastore (blocking: snapshot loads, log replay). Raises ValueError
    (SnapshotError included) for a bad setting or snapshot."""
    tokenizer = resolve_tokenizer(config)
    draft_config = config.draft_settings()
    slots: dict[str, DatastoreSlot] = {}

    def new_slot(name: str) -> tuple[Drafter, ThreadPoolExecutor]:
        drafter = Drafter(tokenizer.vocab_size, draft_config, num_threads=config.draft_threads)
        return drafter, ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"draft-{name}")

    try:
        if config.snapshot is not None:
            seed_snapshot(config.snapshot, config.data_dir, tokenizer)
        drafter, executor = new_slot(DEFAULT_DATASTORE)
        slots[DEFAULT_DATASTORE] = DatastoreSlot(DEFAULT_DATASTORE, drafter, None, executor)
        live = LiveDatastore(
            config.data_dir, tokenizer, config.live_policy(), on_swap=drafter.set_datastore
        )
        slots[DEFAULT_DATASTORE] = DatastoreSlot(DEFAULT_DATASTORE, drafter, live, executor)
        for name, directory in config.datastores:
            datastore, _ = load_snapshot(directory, expect_tokenizer=tokenizer)
            drafter, executor = new_slot(name)
            drafter.set_datastore(datastore)
            slots[name] = DatastoreSlot(name, drafter, None, executor)
            log.info("datastore %r: %s (%d positions)", name, directory, datastore.num_tokens)
    except BaseException:
        Catalog(tokenizer, slots).close()
        raise
    return Catalog(tokenizer, slots)
