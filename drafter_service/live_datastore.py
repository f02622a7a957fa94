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

Directory layout: ``snapshots/<name>/`` (see docs/snapshot-format.md) and ``wal/``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from drafter_service.datastore import SEPARATOR, Datastore, SubIndex
from drafter_service.snapshot import (
    SnapshotInfo,
    TokenizerIdentity,
    delete_snapshot,
    list_snapshots,
    load_snapshot,
    remove_stale_temporaries,
    write_snapshot,
)
from drafter_service.tokens import as_token_array
from drafter_service.wal import IngestLog

log = logging.getLogger(__name__)


class DatastoreFull(RuntimeError):
    """An ingest was refused because it would exceed the memory bound."""


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
    ) -> None:
        self.directory = Path(directory)
        self.tokenizer = tokenizer
        self.policy = policy or LivePolicy()
        self._on_swap = on_swap
        self._snapshots = self.directory / "snapshots"
        self._snapshots.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self._snapshots)

        datastore, covered, last_snapshot = Datastore.empty(tokenizer.vocab_size), 0, None
        complete = list_snapshots(self._snapshots)
        if complete:
            datastore, info = load_snapshot(complete[-1].path, expect_tokenizer=tokenizer)
            covered, last_snapshot = info.wal_position, info.created_unix
        self._log = IngestLog(self.directory / "wal", covered_seq=covered)

        self._lock = threading.Lock()  # guards the fields below and the log
        self._rebuild_lock = threading.Lock()  # one rebuild or snapshot at a time
        self._wake = threading.Condition(self._lock)
        self._datastore = datastore
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
        self._closed = False
        if self._on_swap is not None:
            self._on_swap(datastore)
        if self._pending:
            self.rebuild()  # replayed log: serve it from the start
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="live-datastore", daemon=True)
            self._thread.start()

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
        subs = self._datastore.sub_indices
        if subs and subs[-1].num_tokens + 1 + waiting <= self.policy.max_sub_index_tokens:
            waiting += subs[-1].num_tokens + 1  # they extend the newest
        needed = 8 * waiting + 4 * (self.tokenizer.vocab_size + 1)  # text + SA + token table
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
                base = self._datastore
                through = batch[-1][0]
                self._log.roll()  # later records go to a new segment
            start = time.perf_counter()
            try:
                datastore = self._fold(base, [doc for _, doc in batch])
            except BaseException as exc:
                with self._lock:  # keep the documents for the next attempt
                    self._pending[:0] = batch
                    self._pending_tokens += sum(len(d) for _, d in batch)
                    self._last_error = f"rebuild failed: {exc!r}"
                raise
            elapsed = time.perf_counter() - start
            with self._lock:
                self._datastore = datastore
                self._covered = through
                self._rebuilds += 1
                self._rebuild_seconds += elapsed
                self._last_rebuild_seconds = elapsed
                self._last_rebuild_unix = time.monotonic()
            if self._on_swap is not None:
                self._on_swap(datastore)
            return True

    def _fold(self, base: Datastore, docs: list[npt.NDArray[np.int32]]) -> Datastore:
        policy = self.policy
        subs = list(base.sub_indices)
        for chunk in _chunks(docs, policy.max_sub_index_tokens):
            if subs and subs[-1].num_tokens + 1 + len(chunk) <= policy.max_sub_index_tokens:
                subs[-1] = subs[-1].extended(chunk)  # the newest grows
            else:
                subs.append(SubIndex.from_text(chunk, self.tokenizer.vocab_size))
        while len(subs) > policy.max_sub_indices:
            subs.pop(0)
        bound = policy.max_resident_bytes
        while bound is not None and len(subs) > 1 and sum(s.resident_bytes for s in subs) > bound:
            subs.pop(0)
        return Datastore(subs, self.tokenizer.vocab_size)

    # -- snapshots -------------------------------------------------------------------------

    def snapshot(self) -> SnapshotInfo:
        """Writes the current sub-indices as a snapshot and discards the log they cover."""
        with self._rebuild_lock:
            with self._lock:
                datastore, covered = self._datastore, self._covered
            name = f"snapshot-{covered:012d}-{time.time_ns() // 1_000_000}"
            info = write_snapshot(
                self._snapshots / name, datastore, self.tokenizer, wal_position=covered
            )
            with self._lock:
                self._log.discard_through(covered)
                self._snapshot_covered = covered
                self._last_snapshot_unix = info.created_unix
            for old in list_snapshots(self._snapshots)[: -self.policy.keep_snapshots]:
                delete_snapshot(old.path)
            return info

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
        policy = self.policy
        while True:
            with self._lock:
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

