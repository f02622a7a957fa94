"""Opening the service's datastores (the live default one and read-only named snapshots):
the tokenizer they are checked against, the seed snapshot, peers and the shared log."""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path

from drafter_service.drafting.drafter import Drafter
from drafter_service.drafting.node_score import resolve_node_score
from drafter_service.engine.catalog import Catalog, DatastoreSlot
from drafter_service.live.live_datastore import CORPORA_KEY, LiveDatastore
from drafter_service.replication.peer_bootstrap import bootstrap_from_peers, supersede_behind_stream
from drafter_service.replication.replicated_datastore import ReplicatedDatastore
from drafter_service.service.admin_token import load_token
from drafter_service.service.setting_values import DEFAULT_DATASTORE, DEFAULT_VOCAB_SIZE
from drafter_service.service.settings import ServeConfig
from drafter_service.snapshot.array_files import fsync_dir, write_file
from drafter_service.snapshot.store import (
    SnapshotInfo,
    TokenizerIdentity,
    list_snapshots,
    load_snapshot,
    read_manifest,
    write_snapshot,
)

log = logging.getLogger(__name__)


# The data directory's tokenizer identity (its snapshots record it too, but a directory
# may hold only an ingest log so far).
TOKENIZER_RECORD = "tokenizer-identity.json"


def read_tokenizer_record(data_dir: Path) -> TokenizerIdentity | None:
    path = data_dir / TOKENIZER_RECORD
    try:
        return TokenizerIdentity.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    except ValueError as exc:  # not UTF-8, bad JSON, SnapshotError
        raise ValueError(f"{path} is not a tokenizer record: {exc}") from None


def write_tokenizer_record(data_dir: Path, tokenizer: TokenizerIdentity) -> None:
    """Records ``tokenizer`` in ``data_dir`` (atomically; a no-op when already there)."""
    path = data_dir / TOKENIZER_RECORD
    text = json.dumps(tokenizer.to_json(), sort_keys=True) + "\n"
    try:
        if path.read_text(encoding="utf-8") == text:
            return
    except FileNotFoundError:
        pass
    temporary = path.with_name(f".{TOKENIZER_RECORD}.{os.getpid()}.tmp")
    temporary.unlink(missing_ok=True)
    write_file(temporary, [text.encode("utf-8")])
    os.replace(temporary, path)
    fsync_dir(data_dir)


def _has_ingest_log(data_dir: Path) -> bool:
    """Whether ``data_dir`` holds logged ingests (from before the record existed)."""
    try:
        return any(p.stat().st_size > 0 for p in (data_dir / "wal").glob("*.log"))
    except OSError:
        return False


def resolve_tokenizer(config: ServeConfig) -> TokenizerIdentity:
    """From --tokenizer, the seed snapshot, the data directory (its newest snapshot, else
    its record), --vocab-size, else ``DEFAULT_VOCAB_SIZE`` (logged); a data directory
    without a snapshot whose record disagrees is refused."""
    data_snapshots = list_snapshots(config.data_dir / "snapshots")
    recorded = None if data_snapshots else read_tokenizer_record(config.data_dir)
    resolved = _resolve(config, data_snapshots, recorded)
    if recorded is not None and not recorded.matches(resolved):
        raise ValueError(
            f"tokenizer {resolved.describe()} differs from {recorded.describe()} recorded "
            f"in {config.data_dir / TOKENIZER_RECORD} (use another --data-dir)"
        )
    return resolved


def _resolve(
    config: ServeConfig, data_snapshots: list[SnapshotInfo], recorded: TokenizerIdentity | None
) -> TokenizerIdentity:
    if config.tokenizer is not None:
        return TokenizerIdentity.from_file(
            config.tokenizer, config.tokenizer_name, config.vocab_size
        )
    known: TokenizerIdentity | None = None
    source = "the snapshot tokenizer"
    if config.snapshot is not None:
        known = read_manifest(config.snapshot).tokenizer
    elif data_snapshots:
        known = data_snapshots[-1].tokenizer
    elif recorded is not None:
        known = recorded
        source = f"the tokenizer recorded in {config.data_dir / TOKENIZER_RECORD}"
    if known is not None:
        if config.vocab_size is not None and config.vocab_size != known.vocab_size:
            fix = (
                "drop --vocab-size, or give another --snapshot"
                if config.snapshot is not None
                else f"the datastore in --data-dir {config.data_dir} keeps its vocabulary: "
                "drop --vocab-size, or give another --data-dir for a new datastore"
            )
            raise ValueError(
                f"vocab_size {config.vocab_size} differs from {source} {known.describe()} ({fix})"
            )
        return known
    if config.vocab_size is not None:
        return TokenizerIdentity(config.tokenizer_name or "unknown", config.vocab_size, "")
    if _has_ingest_log(config.data_dir):
        raise ValueError(
            f"the vocabulary size is unknown: {config.data_dir} holds logged ingests but "
            "records no vocabulary; pass --vocab-size (DRAFTER_VOCAB_SIZE) or --tokenizer"
        )
    log.warning(
        "no vocabulary given: using the default, %d token ids (the Llama-3 vocabulary); "
        "choose another with --vocab-size N (DRAFTER_VOCAB_SIZE) or --tokenizer "
        "tokenizer.json",
        DEFAULT_VOCAB_SIZE,
    )
    return TokenizerIdentity(config.tokenizer_name or "unknown", DEFAULT_VOCAB_SIZE, "")


SEED_CORPUS = "seed"  # the pinned corpus a seed snapshot from the builder becomes


def seed_snapshot(snapshot: Path, data_dir: Path, tokenizer: TokenizerIdentity) -> None:
    """Copies ``snapshot`` into ``data_dir``/snapshots (atomically) unless that holds one
    already. A snapshot naming no corpora (the builder's) becomes the pinned corpus
    ``seed``: never rotated out, drafted from as a source of its own (so what is learned
    cannot outvote it), removable like any corpus."""
    target_root = data_dir / "snapshots"
    if list_snapshots(target_root):
        log.info("%s already has a snapshot: --snapshot %s is not used", data_dir, snapshot)
        return
    datastore, info = load_snapshot(snapshot, expect_tokenizer=tokenizer)
    metadata = dict(info.metadata)
    metadata["seeded_from"] = str(Path(snapshot).resolve())
    if CORPORA_KEY not in metadata:
        origin = {"seeded_from": metadata["seeded_from"]}
        metadata[CORPORA_KEY] = [
            {"name": SEED_CORPUS, "sub_indices": len(datastore.sub_indices), "metadata": origin}
        ]
    write_snapshot(
        target_root / info.path.resolve().name,
        datastore,
        info.tokenizer,
        wal_position=0,
        metadata=metadata,
    )
    log.info("seeded %s from snapshot %s (%d positions)", data_dir, snapshot, datastore.num_tokens)


def open_catalog(config: ServeConfig) -> Catalog:
    """Opens every datastore (blocking); ValueError (SnapshotError) for a bad setting or
    snapshot."""
    tokenizer = resolve_tokenizer(config)
    settings = config.draft_settings()
    slots: dict[str, DatastoreSlot] = {}

    def new_slot(name: str, snapshot: SnapshotInfo | None) -> DatastoreSlot:
        # Each datastore drafts with the node score its snapshot carries (or the default).
        where = str(snapshot.path) if snapshot is not None else name
        score = resolve_node_score(
            config.node_score, snapshot.metadata if snapshot is not None else None, where
        )
        draft_config = replace(settings, node_score=score)
        drafter = Drafter(tokenizer.vocab_size, draft_config, num_threads=config.draft_threads)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"draft-{name}")
        return DatastoreSlot(name, drafter, None, executor)

    shared = config.shared_log_config()
    # One connection to the datastore's stream: checked at start, then the datastore's
    # (it closes it; until it exists, this does).
    stream = shared.stream(DEFAULT_DATASTORE) if shared is not None else None
    live: LiveDatastore | None = None
    try:
        if config.bootstrap_peers:  # a peer's newest state first, else the builder's seed
            token = load_token(config.admin_token_file, os.environ)
            if stream is not None:  # away longer than the log's retention: start over
                supersede_behind_stream(config.data_dir, stream, config.salvage)
            bootstrap_from_peers(
                config.data_dir, DEFAULT_DATASTORE, config.bootstrap_peers, tokenizer, token
            )
        if config.snapshot is not None:
            seed_snapshot(config.snapshot, config.data_dir, tokenizer)
        seed = read_manifest(config.snapshot) if config.snapshot is not None else None
        slot = slots[DEFAULT_DATASTORE] = new_slot(DEFAULT_DATASTORE, seed)
        policy, nice = config.live_policy(), config.background_nice
        # With the recent tier, stored generations are drafted from before their rebuild.
        unfolded = slot.drafter if slot.drafter.config.recent_samples > 0 else None
        # A ReplicatedDatastore takes every replica's ingests from the stream, and closes it.
        kind = LiveDatastore if stream is None else partial(ReplicatedDatastore, shared_log=stream)
        live = kind(
            config.data_dir, tokenizer, policy, on_swap=slot.drafter.set_datastore,
            salvage=config.salvage, background_nice=nice, unfolded=unfolded,
        )  # fmt: skip
        slots[DEFAULT_DATASTORE] = replace(slot, live=live)
        write_tokenizer_record(config.data_dir, tokenizer)
        for name, directory in config.datastores:
            datastore, info = load_snapshot(directory, expect_tokenizer=tokenizer)
            slots[name] = new_slot(name, info)
            slots[name].drafter.set_datastore(datastore)
            log.info("datastore %r: %s (%d positions)", name, directory, datastore.num_tokens)
    except BaseException:
        Catalog(tokenizer, slots).close()
        if live is None and stream is not None:
            stream.close()
        raise
    return Catalog(tokenizer, slots)
