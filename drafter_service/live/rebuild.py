"""Folding the waiting documents into the learned sub-indices, and the background
schedule that decides when.

:func:`fold_pending` takes the whole buffer, builds the new sub-indices with no lock
held but the rebuild lock (ingests and drafting carry on), and swaps the result in:
each rebuild produces a new immutable :class:`Datastore`. :func:`fold_documents` is the
rotation: the newest sub-index is rebuilt with its old text plus the new documents
until it is full, then a new one is started; past ``max_sub_indices`` or the memory
bound the oldest is dropped. :func:`run_maintenance` is the background thread's loop,
:func:`run_maintenance_once` one turn of it, for tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.sub_indices import SEPARATOR, SubIndex
from drafter_service.live.live_policy import MIN_REBUILD_GAP_S, REBUILD_TOKENS_PER_S, LivePolicy
from drafter_service.live.live_state import LiveState
from drafter_service.live.thread_priority import lower_thread_priority
from drafter_service.log_limits import RateLimitedLog

log = logging.getLogger(__name__)
_maintenance_log = RateLimitedLog(log, level=logging.ERROR)  # a failure repeats every wake-up


def fold_pending(state: LiveState) -> bool:
    """Folds every waiting document into the sub-indices now and swaps the new
    datastore in. Returns False when nothing was waiting."""
    with state.rebuild_lock:
        with state.lock:
            if not state.pending:
                return False
            base = state.learned
            work = rebuild_work(base, state.pending_tokens)
            batch, state.pending, state.pending_tokens = state.pending, [], 0
            static = sum(c.resident_bytes for c in state.corpora)
            through = batch[-1].seq
            origins = [record.origin for record in batch if record.origin is not None]
            state.log.roll()  # later records go to a new segment
        start = time.perf_counter()
        try:
            learned = fold_documents(
                base, [r.tokens for r in batch], static, state.policy, state.tokenizer.vocab_size
            )
        except BaseException as exc:
            with state.lock:  # keep the documents for the next attempt
                state.pending[:0] = batch
                state.pending_tokens += sum(len(r.tokens) for r in batch)
                state.last_error = f"rebuild failed: {exc!r}"
            raise
        elapsed = time.perf_counter() - start
        with state.lock:
            # Corpora change only under the rebuild lock, which this holds.
            datastore = state.install(state.corpora, learned)
            state.covered = through
            if origins:
                state.covered_origin = origins[-1]
            state.rebuilds += 1
            state.rebuild_seconds += elapsed
            state.last_rebuild_seconds = elapsed
            state.last_rebuild_monotonic = time.monotonic()
            if elapsed > 0:
                state.rebuild_tokens_per_s = work / elapsed
            listeners = state.rebuild_listeners
        state.publish(datastore)
        for listener in listeners:
            listener(elapsed)
        return True


def rebuild_work(learned: tuple[SubIndex, ...], pending_tokens: int) -> int:
    """Tokens the next rebuild re-sorts, at most: the newest sub-index's text, which
    the waiting documents extend, and theirs."""
    return pending_tokens + (learned[-1].num_tokens if learned else 0)


def early_rebuild_due(state: LiveState, policy: LivePolicy, since_s: float) -> bool:
    """Whether ``rebuild_max_share`` brings the next rebuild forward, ``since_s`` after the
    last: its expected duration is at most that share of the time since (the caller
    holds the state lock)."""
    share = policy.rebuild_max_share
    if share <= 0 or since_s < MIN_REBUILD_GAP_S:
        return False
    rate = state.rebuild_tokens_per_s or REBUILD_TOKENS_PER_S
    return rebuild_work(state.learned, state.pending_tokens) / rate <= share * since_s


def fold_documents(
    base: tuple[SubIndex, ...],
    docs: list[npt.NDArray[np.int32]],
    static_bytes: int,
    policy: LivePolicy,
    vocab_size: int,
) -> tuple[SubIndex, ...]:
    """The learned sub-indices ``base`` with ``docs`` added; the corpora (``static_bytes``
    of them) are never rotated out but count towards the memory bound.

    The result depends only on ``base`` and the documents, never on how they were
    batched: each document goes into the newest sub-index when it fits there and starts
    a new one otherwise, exactly as if the documents were folded one at a time. Replicas
    that take the same stream of documents in rebuilds of different sizes therefore hold
    identical sub-indices."""
    subs = list(base)
    for extends, group in place_documents(
        subs[-1].num_tokens if subs else None, docs, policy.max_sub_index_tokens
    ):
        chunk = join_group(group)
        if extends:
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


def place_documents(
    newest: int | None, docs: list[npt.NDArray[np.int32]], limit: int
) -> list[tuple[bool, list[npt.NDArray[np.int32]]]]:
    """Groups ``docs`` by the sub-index each lands in, one document at a time: into the
    newest (``newest``: its positions; None when there is none) while it stays within
    ``limit`` positions with a separator before each document, else into a new one.
    Returns (extends the existing newest sub-index, its documents) per group, in order;
    no document is ever split."""
    groups: list[tuple[bool, list[npt.NDArray[np.int32]]]] = []
    size = newest
    for doc in docs:
        if size is not None and size + 1 + len(doc) <= limit:
            size += 1 + len(doc)
            if not groups:
                groups.append((True, []))
            groups[-1][1].append(doc)
        else:
            size = len(doc)
            groups.append((False, [doc]))
    return groups


def join_group(docs: list[npt.NDArray[np.int32]]) -> npt.NDArray[np.int32]:
    """``docs`` joined with a separator between each two."""
    sep = np.array([SEPARATOR], dtype=np.int32)
    parts: list[npt.NDArray[np.int32]] = []
    for doc in docs:
        if parts:
            parts.append(sep)
        parts.append(doc)
    return np.concatenate(parts)


def run_maintenance(
    state: LiveState,
    rebuild: Callable[[], object],
    snapshot: Callable[[], object],
    background_nice: int = 0,
) -> None:
    """The background thread: wakes at least once a second (or when an ingest fills the
    buffer, the policy changes or the datastore closes) and does what
    :func:`maintenance_due` says is due. Returns once the state is closed. It first
    lowers its own priority to ``background_nice`` (thread_priority)."""
    lower_thread_priority(background_nice)
    while True:
        with state.lock:
            policy = state.policy  # may change while serving (update_policy)
            state.wake.wait(timeout=min(policy.rebuild_interval_s, 1.0))
            if state.closed:
                return
            due = maintenance_due(state, policy, time.monotonic(), time.time())
        run_due(state, rebuild, snapshot, *due)


def run_maintenance_once(
    state: LiveState,
    rebuild: Callable[[], object],
    snapshot: Callable[[], object],
    now_s: float | None = None,
    now_unix: float | None = None,
) -> tuple[bool, bool]:
    """One wake-up of :func:`run_maintenance`, without the wait, as if it were ``now_s``
    (time.monotonic) and ``now_unix`` (time.time; both default to now): tests step the
    schedule with it. Returns (rebuild due, snapshot due)."""
    with state.lock:
        due = maintenance_due(
            state,
            state.policy,
            time.monotonic() if now_s is None else now_s,
            time.time() if now_unix is None else now_unix,
        )
    run_due(state, rebuild, snapshot, *due)
    return due


def maintenance_due(
    state: LiveState, policy: LivePolicy, now_s: float, now_unix: float
) -> tuple[bool, bool]:
    """(rebuild due, snapshot due) at ``now_s`` (time.monotonic) and ``now_unix``
    (time.time); the caller holds the state lock. A rebuild is due when anything waits
    and enough does, or the interval has passed, or a rebuild is cheap enough for
    ``rebuild_max_share`` (:func:`early_rebuild_due`); a snapshot when the sub-indices
    hold log records the newest snapshot does not and the snapshot interval has passed."""
    since = now_s - state.last_rebuild_monotonic
    rebuild_due = bool(state.pending) and (
        state.pending_tokens >= policy.rebuild_min_tokens
        or since >= policy.rebuild_interval_s
        or early_rebuild_due(state, policy, since)
    )
    last = state.last_snapshot_unix
    snapshot_due = (
        policy.snapshot_interval_s > 0
        and state.covered > state.snapshot_covered
        and (last is None or now_unix - last >= policy.snapshot_interval_s)
    )
    return rebuild_due, snapshot_due


def run_due(
    state: LiveState,
    rebuild: Callable[[], object],
    snapshot: Callable[[], object],
    rebuild_due: bool,
    snapshot_due: bool,
) -> None:
    """Calls ``rebuild`` then ``snapshot`` as due; a failure is logged and recorded in
    ``last_error`` (retried at the next wake-up), never raised."""
    try:
        if rebuild_due:
            rebuild()
        if snapshot_due:
            snapshot()
    except Exception as exc:  # keep serving; retried at the next wake-up
        _maintenance_log.error("live datastore maintenance failed: %s", exc, error=exc)
        with state.lock:
            state.last_error = repr(exc)
