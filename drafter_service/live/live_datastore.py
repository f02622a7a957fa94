"""A datastore that learns from finished generations (SSSD §3.1.3).

``ingest`` appends a token sequence to the write-ahead log (durable when it
returns) and queues it. Rebuilds fold the queue into the sub-indices in the
background: the newest sub-index is rebuilt with its old text plus the new
documents until it is full, then a new one is started; past the cap (count or
memory) the oldest is dropped once the replacement is ready. Each rebuild
produces a new immutable :class:`Datastore` that is swapped in atomically
(``on_swap``, e.g. ``Drafter.set_datastore``): drafting never waits for a
rebuild. Snapshots are written periodically; on open, the newest snapshot is
restored and the log after it is replayed.

Operators may also add *corpora*: static sub-indices built offline (e.g. by the
admin API from a file) that sit before the learned sub-indices, are never rebuilt,
rotated or dropped, and are written into every later snapshot (the manifest's
``metadata.corpora`` says which leading sub-indices belong to which corpus).
:meth:`LiveDatastore.restore` rolls the datastore back to a snapshot's content.

Directory layout: ``snapshots/<name>/`` (see docs/snapshot-format.md) and ``wal/``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.sub_indices import SEPARATOR, Datastore, SubIndex
from drafter_service.datastore.tokens import as_token_array
from drafter_service.live.ingest_log import IngestLog
from drafter_service.snapshot.array_files import DamagedDataError, move_aside
from drafter_service.snapshot.store import (
    SnapshotError,
    SnapshotInfo,
    TokenizerIdentity,
    delete_snapshot,
    list_snapshots,
    load_snapshot,
    read_manifest,
    remove_stale_temporaries,
    scan_snapshots,
    write_snapshot,
)

log = logging.getLogger(__name__)


CORPORA_KEY = "corpora"
"""Snapshot metadata key listing the corpora (name, sub-index count, metadata), in
datastore order; their sub-indices come first, the learned ones after them."""
PINNED_KEY = "pinned"
"""Snapshot metadata flag: never deleted by the ``keep_snapshots`` rotation."""
LIVE_SETTINGS = (
    "rebuild_min_tokens",
    "rebuild_interval_s",
    "snapshot_interval_s",
    "keep_snapshots",
)
"""The policy fields :meth:`LiveDatastore.update_policy` may change while serving: they
only say *when* maintenance runs, never what a datastore holds."""


class DatastoreFull(RuntimeError):
    """An ingest was refused because it would exceed the memory bound."""


@dataclass(frozen=True, slots=True)
class Corpus:
    """Static sub-indices added by an operator; kept across rebuilds and snapshots."""

    name: str
    sub_indices: tuple[SubIndex, ...]
    metadata: Mapping[str, object] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.sub_indices)

    @property
    def resident_bytes(self) -> int:
        return sum(s.resident_bytes for s in self.sub_indices)


@dataclass(frozen=True, slots=True)
class LivePolicy:
    """When to rebuild, rotate and snapshot, and what a finished generation stores."""

    max_sub_indices: int = 8
    """Sub-indices kept; past this the oldest is dropped."""
    max_sub_index_tokens: int = 512_000_000
    """Text positions per sub-index; a full one is left as is and a new one started."""
    rebuild_min_tokens: int = 1_000_000
    """Rebuild once this many tokens are waiting..."""
    rebuild_interval_s: float = 60.0
    """...or once this long has passed since the last rebuild with anything waiting."""
    snapshot_interval_s: float = 900.0
    """Write a snapshot this often when the datastore changed (0 = only on request)."""
    keep_snapshots: int = 2
    """Complete snapshots kept on disk (newest first)."""
    max_resident_bytes: int | None = None
    """Bound on accounted datastore bytes (8 per token); oldest sub-indices are
    dropped to stay under it, and an ingest that cannot fit is refused."""
    store: Literal["output", "prompt+output"] = "output"
    """What :meth:`LiveDatastore.ingest_generation` stores."""
    prompt_context_tokens: int = 3
    """With ``store="output"``, this many trailing prompt tokens precede the output
    so that the start of an answer can be matched."""

    def __post_init__(self) -> None:
        checks = {
            "max_sub_indices": self.max_sub_indices >= 1,
            "max_sub_index_tokens": 1 <= self.max_sub_index_tokens < 2**31 - 2,
            "rebuild_min_tokens": self.rebuild_min_tokens >= 1,
            "rebuild_interval_s": self.rebuild_interval_s > 0,
            "snapshot_interval_s": self.snapshot_interval_s >= 0,
            "keep_snapshots": self.keep_snapshots >= 1,
            "max_resident_bytes": self.max_resident_bytes is None or self.max_resident_bytes > 0,
            "store": self.store in ("output", "prompt+output"),
            "prompt_context_tokens": self.prompt_context_tokens >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"LivePolicy.{name} = {getattr(self, name)!r} is out of range")


@dataclass(frozen=True, slots=True)
class LiveStats:
    """A consistent view of the live datastore for metrics and admin."""

    num_tokens: int  # text positions in the sub-indices (separators included)
    pending_tokens: int  # ingested, durable, not yet in a sub-index
    sub_indices: int
    resident_bytes: int
    rebuilds: int
    rebuild_seconds_total: float
    last_rebuild_seconds: float
    wal_position: int  # newest acknowledged ingest
    covered_position: int  # newest ingest folded into the sub-indices
    wal_bytes: int
    last_snapshot_unix: float | None
    last_error: str | None
    ingested_sequences: int  # acknowledged since this open (the replayed log excluded)
    ingested_tokens: int


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
    ) -> None:
        self.directory = Path(directory)
        self.tokenizer = tokenizer
        self.policy = policy or LivePolicy()
        self._on_swap = on_swap
        self._snapshots = self.directory / "snapshots"
        self._snapshots.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self._snapshots)

        corpora: tuple[Corpus, ...] = ()
        learned: tuple[SubIndex, ...] = ()
        covered, last_snapshot = 0, None
        complete, damaged = scan_snapshots(self._snapshots)
        if complete:
            loaded, info = load_snapshot(complete[-1].path, expect_tokenizer=tokenizer)
            corpora, learned = _split_corpora(loaded, info)
            covered, last_snapshot = info.wal_position, info.created_unix
        datastore = Datastore(_join(corpora, learned), tokenizer.vocab_size)
        self._log = IngestLog(self.directory / "wal", covered_seq=covered, salvage=salvage)
        self._check_damaged_snapshots(damaged, complete[-1] if complete else None, salvage)

        self._lock = threading.Lock()  # guards the fields below and the log
        self._rebuild_lock = threading.Lock()  # one rebuild or snapshot at a time
        self._wake = threading.Condition(self._lock)
        self._datastore = datastore  # corpora's sub-indices, then the learned ones
        self._corpora = corpora
        self._learned = learned
        self._covered = covered
        self._snapshot_covered = covered
        self._pending: list[tuple[int, npt.NDArray[np.int32]]] = self._log.recovered()
        self._pending_tokens = sum(len(t) for _, t in self._pending)
        self._rebuilds = 0
        self._rebuild_seconds = 0.0
        self._last_rebuild_seconds = 0.0
        self._last_rebuild_unix = time.monotonic()
        self._last_snapshot_unix = last_snapshot
        self._last_error: str | None = None
        self._ingested_sequences = 0
        self._ingested_tokens = 0
        self._rebuild_listeners: tuple[Callable[[float], None], ...] = ()
        self._closed = False
        if self._on_swap is not None:
            self._on_swap(datastore)
        if self._pending:
            self.rebuild()  # replayed log: serve it from the start
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="live-datastore", daemon=True)
            self._thread.start()

    def _check_damaged_snapshots(
        self, damaged: list[tuple[Path, str]], newest: SnapshotInfo | None, salvage: bool
    ) -> None:
        """Refuses to start from an older snapshot when a damaged newer one (``damaged``:
        unreadable snapshot directories and why) holds ingests the log no longer has;
        ``salvage`` moves damaged snapshots aside instead."""
        if not damaged:
            return
        covered = newest.wal_position if newest is not None else 0
        first = self._log.first_seq
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
                f"aside into {self.directory / 'damaged'} and serve what remains"
            )
        for path, why in damaged:
            if salvage:
                moved = move_aside(path, self.directory / "damaged")
                log.error("unreadable snapshot %s (%s) moved aside to %s", path, why, moved)
            else:
                log.warning("unreadable snapshot %s (%s): the ingest log covers everything "
                            "after the snapshot loaded, so nothing is lost", path, why)  # fmt: skip

    # -- ingest ----------------------------------------------------------------------------

    def ingest(self, tokens: Sequence[int] | npt.NDArray[np.integer]) -> int:
        """Stores one document; durable (fsynced) when this returns. Returns its log
        sequence number. Raises ValueError for bad ids, DatastoreFull past the bound."""
        doc = as_token_array(tokens, self.tokenizer.vocab_size, what="tokens")
        if len(doc) == 0:
            raise ValueError("tokens: an ingested document must not be empty")
        if len(doc) > self.policy.max_sub_index_tokens:
            raise ValueError(
                f"tokens: document of {len(doc)} tokens exceeds max_sub_index_tokens "
                f"({self.policy.max_sub_index_tokens})"
            )
        with self._lock:
            if self._closed:
                raise RuntimeError("live datastore is closed")
            self._check_room(len(doc))
            seq = self._log.append(doc)
            self._pending.append((seq, doc))
            self._pending_tokens += len(doc)
            self._ingested_sequences += 1
            self._ingested_tokens += len(doc)
            due = self._pending_tokens >= self.policy.rebuild_min_tokens
            if due:
                self._wake.notify()
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
        prompt = as_token_array(prompt_ids, self.tokenizer.vocab_size, what="prompt_ids")
        output = as_token_array(output_ids, self.tokenizer.vocab_size, what="output_ids")
        if self.policy.store == "output":
            k = self.policy.prompt_context_tokens
            prompt = prompt[max(0, len(prompt) - k) :] if k else prompt[:0]
        return self.ingest(np.concatenate([prompt, output]))

    def _check_room(self, n_tokens: int) -> None:
        bound = self.policy.max_resident_bytes
        if bound is None:
            return
        # What must stay resident after the next rebuild, when every older
        # sub-index has been dropped: the sub-index the waiting documents land in.
        waiting = self._pending_tokens + n_tokens
        subs = self._learned
        if subs and subs[-1].num_tokens + 1 + waiting <= self.policy.max_sub_index_tokens:
            waiting += subs[-1].num_tokens + 1  # they extend the newest
        needed = 8 * waiting + 4 * (self.tokenizer.vocab_size + 1)  # text + SA + token table
        needed += sum(c.resident_bytes for c in self._corpora)  # never dropped
        if needed > bound:
            raise DatastoreFull(
                f"ingest of {n_tokens} tokens refused: it needs {needed} bytes, over the "
                f"max_resident_bytes bound of {bound}"
            )

    # -- rebuild ---------------------------------------------------------------------------

    def rebuild(self) -> bool:
        """Folds every waiting document into the sub-indices now and swaps the new
        datastore in. Returns False when nothing was waiting."""
        with self._rebuild_lock:
            with self._lock:
                if not self._pending:
                    return False
                batch, self._pending, self._pending_tokens = self._pending, [], 0
                base = self._learned
                static = sum(c.resident_bytes for c in self._corpora)
                through = batch[-1][0]
                self._log.roll()  # later records go to a new segment
            start = time.perf_counter()
            try:
                learned = self._fold(base, [doc for _, doc in batch], static)
            except BaseException as exc:
                with self._lock:  # keep the documents for the next attempt
                    self._pending[:0] = batch
                    self._pending_tokens += sum(len(d) for _, d in batch)
                    self._last_error = f"rebuild failed: {exc!r}"
                raise
            elapsed = time.perf_counter() - start
            with self._lock:
                # Corpora change only under the rebuild lock, which this holds.
                datastore = Datastore(_join(self._corpora, learned), self.tokenizer.vocab_size)
                self._datastore = datastore
                self._learned = learned
                self._covered = through
                self._rebuilds += 1
                self._rebuild_seconds += elapsed
                self._last_rebuild_seconds = elapsed
                self._last_rebuild_unix = time.monotonic()
                listeners = self._rebuild_listeners
            if self._on_swap is not None:
                self._on_swap(datastore)
            for listener in listeners:
                listener(elapsed)
            return True

    def add_rebuild_listener(self, listener: Callable[[float], None]) -> None:
        """Calls ``listener(seconds)`` after every later successful rebuild, on the
        thread that ran it (e.g. for a duration histogram); it must be quick and not
        raise."""
        with self._lock:
            self._rebuild_listeners = (*self._rebuild_listeners, listener)

    def _fold(
        self, base: tuple[SubIndex, ...], docs: list[npt.NDArray[np.int32]], static_bytes: int
    ) -> tuple[SubIndex, ...]:
        """The learned sub-indices with ``docs`` added; the corpora (``static_bytes``
        of them) are never rotated out but count towards the memory bound."""
        policy = self.policy
        subs = list(base)
        for chunk in _chunks(docs, policy.max_sub_index_tokens):
            if subs and subs[-1].num_tokens + 1 + len(chunk) <= policy.max_sub_index_tokens:
                subs[-1] = subs[-1].extended(chunk)  # the newest grows
            else:
                subs.append(SubIndex.from_text(chunk, self.tokenizer.vocab_size))
        while len(subs) > policy.max_sub_indices:
            subs.pop(0)
        bound = policy.max_resident_bytes
        while (
            bound is not None
            and len(subs) > 1
            and static_bytes + sum(s.resident_bytes for s in subs) > bound
        ):
            subs.pop(0)
        return tuple(subs)

    # -- snapshots -------------------------------------------------------------------------

    def snapshot(self, name: str | None = None, *, pinned: bool = False) -> SnapshotInfo:
        """Writes the current sub-indices as a snapshot and discards the log they cover.

        ``name`` defaults to ``snapshot-<position>-<ms>``; a ``pinned`` snapshot is kept
        by the ``keep_snapshots`` rotation (only :meth:`delete_snapshot` removes it).
        Documents still waiting for a rebuild are not in it (call :meth:`rebuild` first
        to include them); they stay in the log."""
        with self._rebuild_lock:
            return self._snapshot_locked(name, {PINNED_KEY: True} if pinned else {})

    def _snapshot_locked(self, name: str | None, extra: Mapping[str, object]) -> SnapshotInfo:
        with self._lock:
            datastore, covered, corpora = self._datastore, self._covered, self._corpora
        name = name or f"snapshot-{covered:012d}-{time.time_ns() // 1_000_000}"
        metadata = {**extra, CORPORA_KEY: [_corpus_json(c) for c in corpora]}
        info = write_snapshot(
            self._snapshots / name,
            datastore,
            self.tokenizer,
            wal_position=covered,
            metadata=metadata,
        )
        read_manifest(info.path)  # readable back from disk before the log it covers goes
        with self._lock:
            self._log.discard_through(covered)
            self._snapshot_covered = covered
            self._last_snapshot_unix = info.created_unix
        rotating = [s for s in list_snapshots(self._snapshots) if not s.metadata.get(PINNED_KEY)]
        for old in rotating[: -self.policy.keep_snapshots]:
            delete_snapshot(old.path)
        return info

    def snapshots(self) -> list[SnapshotInfo]:
        """The complete snapshots, oldest first; the last one is where a restart begins."""
        return list_snapshots(self._snapshots)

    def delete_snapshot(self, name: str) -> None:
        """Deletes the snapshot ``name``. Refuses the newest one: a restart loads it and
        the log it covers is gone, so deleting it would lose data."""
        with self._rebuild_lock:
            complete = list_snapshots(self._snapshots)
            names = [s.path.name for s in complete]
            if name not in names:
                raise KeyError(f"no snapshot {name!r}")
            if name == names[-1]:
                raise SnapshotError(
                    f"snapshot {name!r} is the newest: a restart begins from it, so it cannot "
                    "be deleted (write a newer snapshot first)"
                )
            delete_snapshot(self._snapshots / name)

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
        with self._rebuild_lock:
            path = self._snapshots / name
            if name not in {s.path.name for s in list_snapshots(self._snapshots)}:
                raise KeyError(f"no snapshot {name!r}")
            loaded, source = load_snapshot(path, expect_tokenizer=self.tokenizer)
            corpora, learned = _split_corpora(loaded, source)
            with self._lock:
                position = self._log.last_seq
                self._log.roll()  # the segments through `position` can all be deleted
            restored_name = f"restored-{position:012d}-{time.time_ns() // 1_000_000}"
            info = write_snapshot(
                self._snapshots / restored_name,
                loaded,
                self.tokenizer,
                wal_position=position,
                metadata={
                    CORPORA_KEY: [_corpus_json(c) for c in corpora],
                    "restored_from": name,
                    "discarded_through": position,
                },
            )
            read_manifest(info.path)  # readable back from disk before the log goes
            with self._lock:
                self._datastore, self._corpora, self._learned = loaded, corpora, learned
                self._pending = [(seq, doc) for seq, doc in self._pending if seq > position]
                self._pending_tokens = sum(len(doc) for _, doc in self._pending)
                self._covered = self._snapshot_covered = position
                self._last_snapshot_unix = info.created_unix
                self._log.discard_through(position)
            if self._on_swap is not None:
                self._on_swap(loaded)
            log.info("restored snapshot %s (log through %d discarded)", name, position)
            return info

    # -- corpora ---------------------------------------------------------------------------

    @property
    def corpora(self) -> tuple[Corpus, ...]:
        with self._lock:
            return self._corpora

    def add_corpus(self, corpus: Corpus) -> SnapshotInfo:
        """Adds ``corpus`` (sub-indices of this tokenizer's vocabulary) after the existing
        corpora, swaps the datastore in, and writes a snapshot so the addition survives a
        restart. Raises ValueError for a name in use or a bad vocabulary, DatastoreFull
        past ``max_resident_bytes``."""
        for sub in corpus.sub_indices:
            if sub.vocab_size != self.tokenizer.vocab_size:
                raise ValueError(
                    f"corpus {corpus.name!r}: vocab_size {sub.vocab_size} differs from the "
                    f"datastore's {self.tokenizer.vocab_size}"
                )
        with self._rebuild_lock:
            with self._lock:
                if any(c.name == corpus.name for c in self._corpora):
                    raise ValueError(f"corpus {corpus.name!r} already exists")
                bound = self.policy.max_resident_bytes
                total = self._datastore.resident_bytes + corpus.resident_bytes
                if bound is not None and total > bound:
                    raise DatastoreFull(
                        f"corpus {corpus.name!r} needs {corpus.resident_bytes} bytes: the "
                        f"datastore would hold {total}, over max_resident_bytes ({bound})"
                    )
                datastore = self._swap_corpora((*self._corpora, corpus))
            if self._on_swap is not None:
                self._on_swap(datastore)
            return self._snapshot_locked(None, {})

    def remove_corpus(self, name: str) -> SnapshotInfo:
        """Removes corpus ``name`` (KeyError when absent) and writes a snapshot."""
        with self._rebuild_lock:
            with self._lock:
                kept = tuple(c for c in self._corpora if c.name != name)
                if len(kept) == len(self._corpora):
                    raise KeyError(f"no corpus {name!r}")
                datastore = self._swap_corpora(kept)
            if self._on_swap is not None:
                self._on_swap(datastore)
            return self._snapshot_locked(None, {})

    def _swap_corpora(self, corpora: tuple[Corpus, ...]) -> Datastore:
        """Installs ``corpora`` (the caller holds both locks; every swap happens under the
        rebuild lock, so swaps reach ``on_swap`` in the order they were made)."""
        datastore = Datastore(_join(corpora, self._learned), self.tokenizer.vocab_size)
        self._datastore, self._corpora = datastore, corpora
        return datastore

    # -- live settings ---------------------------------------------------------------------

    def update_policy(self, **changes: int | float) -> LivePolicy:
        """Changes the maintenance schedule (only the fields in ``LIVE_SETTINGS``);
        validated as a whole, applied from the next background wake-up."""
        unknown = sorted(set(changes) - set(LIVE_SETTINGS))
        if unknown:
            raise ValueError(f"not changeable while serving: {', '.join(unknown)}")
        with self._lock:
            self.policy = replace(self.policy, **changes)  # type: ignore[arg-type]
            self._wake.notify()
            return self.policy

    # -- state -----------------------------------------------------------------------------

    @property
    def datastore(self) -> Datastore:
        with self._lock:
            return self._datastore

    def stats(self) -> LiveStats:
        with self._lock:
            ds = self._datastore
            return LiveStats(
                num_tokens=ds.num_tokens,
                pending_tokens=self._pending_tokens,
                sub_indices=len(ds.sub_indices),
                resident_bytes=ds.resident_bytes,
                rebuilds=self._rebuilds,
                rebuild_seconds_total=self._rebuild_seconds,
                last_rebuild_seconds=self._last_rebuild_seconds,
                wal_position=self._log.last_seq,
                covered_position=self._covered,
                wal_bytes=self._log.size_bytes,
                last_snapshot_unix=self._last_snapshot_unix,
                last_error=self._last_error,
                ingested_sequences=self._ingested_sequences,
                ingested_tokens=self._ingested_tokens,
            )

    def close(self) -> None:
        """Stops the background thread. Waiting documents stay in the log."""
        with self._lock:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._log.close()

    def __enter__(self) -> LiveDatastore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            with self._lock:
                policy = self.policy  # may change while serving (update_policy)
                self._wake.wait(timeout=min(policy.rebuild_interval_s, 1.0))
                if self._closed:
                    return
                now = time.monotonic()
                rebuild_due = self._pending and (
                    self._pending_tokens >= policy.rebuild_min_tokens
                    or now - self._last_rebuild_unix >= policy.rebuild_interval_s
                )
                last = self._last_snapshot_unix
                snapshot_due = (
                    policy.snapshot_interval_s > 0
                    and self._covered > self._snapshot_covered
                    and (last is None or time.time() - last >= policy.snapshot_interval_s)
                )
            try:
                if rebuild_due:
                    self.rebuild()
                if snapshot_due:
                    self.snapshot()
            except Exception as exc:  # keep serving; retried at the next wake-up
                log.exception("live datastore maintenance failed")
                with self._lock:
                    self._last_error = repr(exc)


def _join(corpora: Sequence[Corpus], learned: Sequence[SubIndex]) -> list[SubIndex]:
    return [s for c in corpora for s in c.sub_indices] + list(learned)


def _corpus_json(corpus: Corpus) -> dict[str, object]:
    return {
        "name": corpus.name,
        "sub_indices": len(corpus.sub_indices),
        "metadata": dict(corpus.metadata),
    }


def _split_corpora(
    datastore: Datastore, info: SnapshotInfo
) -> tuple[tuple[Corpus, ...], tuple[SubIndex, ...]]:
    """The corpora named in a snapshot's metadata and the learned sub-indices after them.
    A snapshot without that metadata (e.g. from the builder) holds learned data only."""
    subs = datastore.sub_indices
    listed = info.metadata.get(CORPORA_KEY, [])
    corpora: list[Corpus] = []
    start = 0
    ok = isinstance(listed, list)
    for item in listed if isinstance(listed, list) else []:
        count = item.get("sub_indices") if isinstance(item, dict) else None
        name = item.get("name") if isinstance(item, dict) else None
        meta = item.get("metadata", {}) if isinstance(item, dict) else None
        if (
            not isinstance(name, str)
            or not isinstance(count, int)
            or isinstance(count, bool)
            or not isinstance(meta, dict)
            or count < 0
            or start + count > len(subs)
        ):
            ok = False
            break
        corpora.append(Corpus(name, subs[start : start + count], meta))
        start += count
    if not ok:
        raise SnapshotError(f"{info.path}: manifest metadata.{CORPORA_KEY} is malformed")
    return tuple(corpora), subs[start:]


def _chunks(docs: list[npt.NDArray[np.int32]], limit: int) -> list[npt.NDArray[np.int32]]:
    """Joins documents with separators into texts of at most ``limit`` positions,
    never splitting a document."""
    chunks: list[npt.NDArray[np.int32]] = []
    current: list[npt.NDArray[np.int32]] = []
    size = 0
    sep = np.array([SEPARATOR], dtype=np.int32)
    for doc in docs:
        extra = len(doc) + (1 if current else 0)
        if current and size + extra > limit:
            chunks.append(np.concatenate(current))
            current, size, extra = [], 0, len(doc)
        if current:
            current.append(sep)
        current.append(doc)
        size += extra
    if current:
        chunks.append(np.concatenate(current))
    return chunks
