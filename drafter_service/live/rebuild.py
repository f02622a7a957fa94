"""Folding the waiting documents into the learned sub-indices, and the background
schedule that decides when.

:func:`fold_pending` takes the whole buffer, builds the new sub-indices with no lock
held but the rebuild lock (ingests and drafting carry on), and swaps the result in:
each rebuild produces a new immutable :class:`Datastore`. :func:`fold_documents` is the
rotation: the newest sub-index is rebuilt with its old text plus the new documents
until it is full, then a new one is started; past ``max_sub_indices`` or the memory
bound the oldest is dropped. :func:`run_maintenance` is the background thread's loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.sub_indices import SEPARATOR, SubIndex
from drafter_service.live.live_policy import LivePolicy
from drafter_service.live.live_state import LiveState

log = logging.getLogger(__name__)


def fold_pending(state: LiveState) -> bool:
    """Folds every waiting document into the sub-indices now and swaps the new
    datastore in. Returns False when nothing was waiting."""
    with state.rebuild_lock:
        with state.lock:
            if not state.pending:
                return False
            batch, state.pending, state.pending_tokens = state.pending, [], 0
            base = state.learned
            static = sum(c.resident_bytes for c in state.corpora)
            through = batch[-1][0]
            state.log.roll()  # later records go to a new segment
        start = time.perf_counter()
        try:
            learned = fold_documents(
                base, [doc for _, doc in batch], static, state.policy, state.tokenizer.vocab_size
            )
        except BaseException as exc:
            with state.lock:  # keep the documents for the next attempt
                state.pending[:0] = batch
                state.pending_tokens += sum(len(d) for _, d in batch)
                state.last_error = f"rebuild failed: {exc!r}"
            raise
        elapsed = time.perf_counter() - start
        with state.lock:
            # Corpora change only under the rebuild lock, which this holds.
            datastore = state.install(state.corpora, learned)
            state.covered = through
            state.rebuilds += 1
            state.rebuild_seconds += elapsed
            state.last_rebuild_seconds = elapsed
            state.last_rebuild_monotonic = time.monotonic()
            listeners = state.rebuild_listeners
        state.publish(datastore)
        for listener in listeners:
            listener(elapsed)
        return True


def fold_documents(
    base: tuple[SubIndex, ...],
    docs: list[npt.NDArray[np.int32]],
    static_bytes: int,
    policy: LivePolicy,
    vocab_size: int,
) -> tuple[SubIndex, ...]:
    """The learned sub-indices ``base`` with ``docs`` added; the corpora (``static_bytes``
    of them) are never rotated out but count towards the memory bound."""
    subs = list(base)
    for chunk in join_documents(docs, policy.max_sub_index_tokens):
        if subs and subs[-1].num_tokens + 1 + len(chunk) <= policy.max_sub_index_tokens:
            subs[-1] = subs[-1].extended(chunk)  # the newest grows
        else:
            subs.append(SubIndex.from_text(chunk, vocab_size))
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


def join_documents(docs: list[npt.NDArray[np.int32]], limit: int) -> list[npt.NDArray[np.int32]]:
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


def run_maintenance(
    state: LiveState, rebuild: Callable[[], object], snapshot: Callable[[], object]
) -> None:
    """The background thread: wakes at least once a second (or when an ingest fills the
    buffer, the policy changes or the datastore closes) and calls ``rebuild`` when
    enough waits or the interval has passed with anything waiting, then ``snapshot``
    when the sub-indices hold log records the newest snapshot does not and the snapshot
    interval has passed. Returns once the state is closed."""
    while True:
        with state.lock:
            policy = state.policy  # may change while serving (update_policy)
            state.wake.wait(timeout=min(policy.rebuild_interval_s, 1.0))
            if state.closed:
                return
            now = time.monotonic()
            rebuild_due = state.pending and (
                state.pending_tokens >= policy.rebuild_min_tokens
                or now - state.last_rebuild_monotonic >= policy.rebuild_interval_s
            )
            last = state.last_snapshot_unix
            snapshot_due = (
                policy.snapshot_interval_s > 0
                and state.covered > state.snapshot_covered
                and (last is None or time.time() - last >= policy.snapshot_interval_s)
            )
        try:
            if rebuild_due:
                rebuild()
            if snapshot_due:
                snapshot()
        except Exception as exc:  # keep serving; retried at the next wake-up
            log.exception("live datastore maintenance failed")
            with state.lock:
                state.last_error = repr(exc)
