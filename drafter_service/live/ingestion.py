"""What may enter the live datastore, and why the log refuses it when its volume is full.

A document enters through ``PendingBuffer.accept`` (pending_buffer), which makes it
durable in the ingest log and then buffers it. A log append that fails because its
volume is full (ENOSPC, EDQUOT, EFBIG, a short write) raises :class:`VolumeFull` naming
the directory (:func:`volume_full`), and logs one rate-limited line for all datastores
(no traceback): every call would hit it until space is freed. :func:`checked_document`
validates what a caller hands in; :func:`generation_document` is the policy's ``store``
rule for a finished generation.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.tokens import as_token_array
from drafter_service.live.live_policy import DatastoreFull, LivePolicy
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


def volume_full(directory: Path, error: OSError) -> VolumeFull | None:
    """``error``, from appending to the log in ``directory``, as :class:`VolumeFull` when
    :func:`is_volume_full` says so (and logged, rate-limited); None for another error."""
    if not is_volume_full(error):
        return None
    full = VolumeFull(directory, error)
    _volume_full_log.warning("ingest refused: %s", full)
    return full


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
