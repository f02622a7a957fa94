"""What may enter the live datastore, and why the log refuses it when its volume is full.

A log append failing for a full volume (ENOSPC, EDQUOT, EFBIG, a short write) raises
:class:`VolumeFull` naming the directory, logged in one rate-limited line for all
datastores (no traceback): every call hits it until space is freed.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.tokens import TokenIds, as_token_array
from drafter_service.live.live_policy import DatastoreFull, LivePolicy
from drafter_service.log_limits import RateLimitedLog

log = logging.getLogger(__name__)
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_volume_full_log = RateLimitedLog(log)


class VolumeFull(OSError, DatastoreFull):
    """The ingest log's volume has no room for a document (nothing of it was stored).

    A :class:`DatastoreFull`, so a caller storing several reports those before it as
    stored (``Ingest`` answers RESOURCE_EXHAUSTED saying how many), and an ``OSError``
    with the errno (``ENOSPC`` for a short write)."""

    def __init__(self, directory: Path, cause: OSError) -> None:
        super().__init__(
            cause.errno,
            f"the volume holding {directory} is full ({cause.strerror}); free space there "
            "(or raise its quota), then send again what was not stored",
        )
        self.directory = directory

    def __str__(self) -> str:
        return str(self.strerror)


def raise_if_volume_full(directory: Path, error: OSError) -> None:
    """Raises ``error``, from appending to the log in ``directory``, as :class:`VolumeFull`
    (and logs it) when it says the volume has no room: ENOSPC (also the log's short
    write), EDQUOT or EFBIG (a file-size limit); returns for another error."""
    if error.errno in _FULL_ERRNOS:
        full = VolumeFull(directory, error)
        _volume_full_log.warning("ingest refused: %s", full)
        raise full from None


def checked_document(
    tokens: TokenIds, policy: LivePolicy, vocab_size: int
) -> npt.NDArray[np.int32]:
    """``tokens`` as a document; ValueError for bad ids, empty, or past a sub-index."""
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
