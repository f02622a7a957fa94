"""Where a document enters the live datastore: checked, made durable, then buffered.

:func:`accept_document` is the one way in. Under the state lock it checks the memory
bound, appends the document to the ingest log (fsynced: from here on the ingest is
acknowledged and survives a crash) and then adds it to the in-memory buffer that the
next rebuild folds into the sub-indices, so the buffer is always in log order and the
log holds everything the buffer does. A log append that fails because its volume is
full (ENOSPC, EDQUOT, EFBIG, a short write) raises :class:`VolumeFull` naming the
directory, and logs one rate-limited line for all datastores (no traceback): every
call would hit it until space is freed. :func:`checked_document` validates what a caller
hands in; :func:`generation_document` is the policy's ``store`` rule for a finished
generation.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.tokens import as_token_array
from drafter_service.live.ingest_log import LogRecord
from drafter_service.live.live_policy import DatastoreFull, LivePolicy
from drafter_service.live.live_state import LiveState
from drafter_service.live.stream_ids import StreamId
from drafter_service.log_limits import RateLimitedLog

TokenIds = Sequence[int] | npt.NDArray[np.integer]
log = logging.getLogger(__name__)
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_volume_full_log = RateLimitedLog(log)


class VolumeFull(OSError, DatastoreFull):
    """The ingest log's volume has no room for a document (nothing of it was stored).

    A :class:`DatastoreFull`, so a caller that stores several documents reports the ones
    before it as stored (``Ingest`` answers RESOURCE_EXHAUSTED saying how many), and an
    ``OSError`` carrying the errno (``ENOSPC``, ``EDQUOT``, ``EFBIG``; ``ENOSPC`` for a
    short write). ``directory``: where the log is written."""

    def __init__(self, directory: Path, cause: OSError) -> None:
        code = cause.errno if cause.errno in _FULL_ERRNOS else errno.ENOSPC
        why = cause.strerror or str(cause)
        super().__init__(
            code,
            f"the volume holding {directory} is full ({why}); free space there (or raise "
            "its quota), then send again what was not stored",
        )
        self.directory = directory

    def __str__(self) -> str:
        return str(self.strerror)


def is_volume_full(error: OSError) -> bool:
    """Whether ``error`` (from writing a file) says its volume has no room: ENOSPC,
    EDQUOT, EFBIG (a file-size limit), or a short write (the ingest log raises an
    OSError without errno when fewer bytes were written than asked)."""
    if error.errno in _FULL_ERRNOS:
        return True
    return error.errno is None and "short write" in str(error)


def checked_document(
    tokens: TokenIds, policy: LivePolicy, vocab_size: int
) -> npt.NDArray[np.int32]:
    """``tokens`` as a document to ingest; ValueError for bad ids, an empty document or
    one longer than a sub-index holds."""
    doc = as_token_array(tokens, vocab_size, what="tokens")
    if len(doc) == 0:
        raise ValueError("tokens: an ingested document must not be empty")
    if len(doc) > policy.max_sub_index_tokens:
        raise ValueError(
            f"tokens: document of {len(doc)} tokens exceeds max_sub_index_tokens "
            f"({policy.max_sub_index_tokens})"
        )
    return doc


def generation_document(
    prompt_ids: TokenIds, output_ids: TokenIds, policy: LivePolicy, vocab_size: int
) -> npt.NDArray[np.int32]:
    """What a finished generation stores: the output after the policy's few trailing
    prompt tokens (``store="output"``), or prompt + output."""
    prompt = as_token_array(prompt_ids, vocab_size, what="prompt_ids")
    output = as_token_array(output_ids, vocab_size, what="output_ids")
    if policy.store == "output":
        k = policy.prompt_context_tokens
        prompt = prompt[max(0, len(prompt) - k) :] if k else prompt[:0]
    return np.concatenate([prompt, output])


def accept_document(
    state: LiveState, doc: npt.NDArray[np.int32], origin: StreamId | None = None
) -> tuple[int | None, bool]:
    """Appends ``doc`` (checked) to the log, then to the buffer. ``origin``: its entry id
    in the shared ingest stream; an entry at or before the newest one taken already is a
    duplicate and is skipped (returns None for the sequence number), so consuming the
    stream stores each entry exactly once. Returns its log sequence number and whether
    the buffer now holds enough for a rebuild (the background thread has been woken).
    Raises DatastoreFull past the memory bound, RuntimeError once closed,
    :class:`VolumeFull` when the log's volume is full and another OSError when the log
    cannot be written (nothing is stored or buffered then)."""
    with state.lock:
        if state.closed:
            raise RuntimeError("live datastore is closed")
        if origin is not None and state.consumed is not None and origin <= state.consumed:
            return None, False
        _check_room(state, len(doc))
        try:
            seq = state.log.append(doc, origin)
        except OSError as exc:
            if not is_volume_full(exc):
                raise
            full = VolumeFull(state.log.directory, exc)
            _volume_full_log.warning("ingest refused: %s", full)
            raise full from None
        state.pending.append(LogRecord(seq, doc, origin))
        if origin is not None:
            note_consumed(state, origin)
        state.pending_tokens += len(doc)
        state.ingested_sequences += 1
        state.ingested_tokens += len(doc)
        due = state.pending_tokens >= state.policy.rebuild_min_tokens
        if due:
            state.wake.notify()
    return seq, due


def note_consumed(state: LiveState, origin: StreamId) -> None:
    """Records that the shared stream was taken through ``origin`` and wakes the ingests
    waiting for it (the caller holds the state lock)."""
    if state.consumed is None or origin > state.consumed:
        state.consumed = origin
        state.consumed_changed.notify_all()


def check_room(state: LiveState, n_tokens: int) -> None:
    """Raises DatastoreFull when ``n_tokens`` more could not stay resident now."""
    with state.lock:
        _check_room(state, n_tokens)


def _check_room(state: LiveState, n_tokens: int) -> None:
    """Raises DatastoreFull when ``n_tokens`` more could not stay resident (caller holds
    the state lock)."""
    policy = state.policy
    bound = policy.max_resident_bytes
    if bound is None:
        return
    # What must stay resident after the next rebuild, when every older
    # sub-index has been dropped: the sub-index the waiting documents land in.
    waiting = state.pending_tokens + n_tokens
    subs = state.learned
    if subs and subs[-1].num_tokens + 1 + waiting <= policy.max_sub_index_tokens:
        waiting += subs[-1].num_tokens + 1  # they extend the newest
    needed = 8 * waiting + 4 * (state.tokenizer.vocab_size + 1)  # text + SA + token table
    needed += sum(c.resident_bytes for c in state.corpora)  # never dropped
    if needed > bound:
        raise DatastoreFull(
            f"ingest of {n_tokens} tokens refused: it needs {needed} bytes, over the "
            f"max_resident_bytes bound of {bound}"
        )
