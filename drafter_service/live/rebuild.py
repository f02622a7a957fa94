"""Folding the waiting documents into the learned sub-indices, and when.

:func:`fold_pending` builds the new sub-indices holding only the structural-change lock
(ingests and drafting carry on) and swaps the resulting immutable :class:`Datastore` in.
:func:`fold_documents` rotates: the newest sub-index grows until full, then a new one
starts; past ``max_sub_indices`` or the memory bound the oldest is dropped.
:func:`maintenance_due` is the background thread's schedule.
"""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.sub_indices import SubIndex, join_documents
from drafter_service.live.index_set import IndexSet, IndexState
from drafter_service.live.live_policy import MIN_REBUILD_GAP_S, REBUILD_TOKENS_PER_S, LivePolicy
from drafter_service.live.pending_buffer import PendingBuffer


def fold_pending(index: IndexSet, buffer: PendingBuffer, policy: LivePolicy) -> bool:
    """Folds the waiting documents in now and swaps in the result; False when none."""
    with index.changing:
        batch = buffer.take()
        if not batch:
            return False
        # Corpora and sub-indices change only under the structural-change lock, held here.
        base = index.state.learned
        static = sum(c.resident_bytes for c in index.state.corpora)
        work = rebuild_work(base, sum(len(r.tokens) for r in batch))
        origins = [record.origin for record in batch if record.origin is not None]
        start = time.perf_counter()
        try:
            learned = fold_documents(
                base, [r.tokens for r in batch], static, policy, index.vocab_size
            )
        except BaseException:
            buffer.put_back(batch)  # keep the documents for the next attempt
            raise
        elapsed = time.perf_counter() - start
        index.install_rebuild(
            learned, batch[-1].seq, origins[-1] if origins else None, elapsed, work
        )
        return True


def rebuild_work(learned: tuple[SubIndex, ...], pending_tokens: int) -> int:
    """Tokens the next rebuild re-sorts at most: the newest sub-index's and the waiting."""
    return pending_tokens + (learned[-1].num_tokens if learned else 0)


def early_rebuild_due(
    progress: IndexState, pending_tokens: int, policy: LivePolicy, since_s: float
) -> bool:
    """Whether ``rebuild_max_share`` brings the next rebuild forward, ``since_s`` after the
    last: its expected duration is at most that share of the time since."""
    share = policy.rebuild_max_share
    if share <= 0 or since_s < MIN_REBUILD_GAP_S:
        return False
    rate = progress.rebuild_tokens_per_s or REBUILD_TOKENS_PER_S
    return rebuild_work(progress.learned, pending_tokens) / rate <= share * since_s


def fold_documents(
    base: tuple[SubIndex, ...],
    docs: list[npt.NDArray[np.int32]],
    static_bytes: int,
    policy: LivePolicy,
    vocab_size: int,
) -> tuple[SubIndex, ...]:
    """``base`` with ``docs`` added; the corpora (``static_bytes``) count towards the
    memory bound but are never rotated out. Each document goes into the newest sub-index
    if it fits, else starts one, as if folded one at a time: the result never depends on
    batching, so replicas taking the same stream in different rebuilds stay identical."""
    subs = list(base)
    size = subs[-1].num_tokens if subs else None  # the newest's, a separator before each
    extending: list[npt.NDArray[np.int32]] = []  # into the newest of ``base``
    starting: list[list[npt.NDArray[np.int32]]] = []  # a new sub-index each
    for doc in docs:
        if size is not None and size + 1 + len(doc) <= policy.max_sub_index_tokens:
            size += 1 + len(doc)
            (starting[-1] if starting else extending).append(doc)
        else:
            size = len(doc)
            starting.append([doc])
    if extending:
        subs[-1] = subs[-1].extended(join_documents(extending))  # the newest grows
    subs += [SubIndex.from_text(join_documents(group), vocab_size) for group in starting]
    # Oldest first, until both bounds hold (max_sub_indices >= 1: the newest stays).
    bound = policy.max_resident_bytes
    while len(subs) > policy.max_sub_indices or (
        bound is not None
        and len(subs) > 1
        and static_bytes + sum(s.resident_bytes for s in subs) > bound
    ):
        subs.pop(0)
    return tuple(subs)


def maintenance_due(
    progress: IndexState,
    pending_records: int,
    pending_tokens: int,
    policy: LivePolicy,
    now_s: float,
    now_unix: float,
) -> tuple[bool, bool]:
    """(rebuild due, snapshot due) at ``now_s`` (monotonic) and ``now_unix``. A rebuild:
    anything waits and enough does, the interval passed, or it is cheap enough
    (:func:`early_rebuild_due`). A snapshot: the sub-indices hold records the newest
    snapshot lacks and the interval passed."""
    since = now_s - progress.last_rebuild_monotonic
    rebuild_due = pending_records > 0 and (
        pending_tokens >= policy.rebuild_min_tokens
        or since >= policy.rebuild_interval_s
        or early_rebuild_due(progress, pending_tokens, policy, since)
    )
    last = progress.last_snapshot_unix
    snapshot_due = (
        policy.snapshot_interval_s > 0
        and progress.covered > progress.snapshot_covered
        and (last is None or now_unix - last >= policy.snapshot_interval_s)
    )
    return rebuild_due, snapshot_due
