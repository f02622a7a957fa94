"""The live datastore as ``--live`` replays use it.

Finished records are ingested into the product's :class:`LiveDatastore`
(write-ahead log, real rebuild policy) in a temporary directory; a prebuilt
corpus, if any, is its initial snapshot. The policy rebuilds synchronously
(``background=False``) so that replays stay deterministic.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from drafter_service.datastore import Datastore, SubIndex
from drafter_service.live_datastore import LiveDatastore, LivePolicy
from drafter_service.snapshot import TokenizerIdentity, write_snapshot

PROMPT_TAIL = 3
"""Prompt tokens kept in front of a finished output (context for its first tokens)."""


def live_document(
    prompt_ids: npt.NDArray[np.int32], output_ids: npt.NDArray[np.int32]
) -> npt.NDArray[np.int32]:
    """What a finished request contributes: the last prompt tokens, then its output."""
    return np.concatenate(
        [prompt_ids[len(prompt_ids) - min(PROMPT_TAIL, len(prompt_ids)) :], output_ids]
    ).astype(np.int32, copy=False)


class ReplayLiveStore:
    """A :class:`LiveDatastore` in a temporary directory, starting from ``base``."""

    def __init__(self, base: Sequence[SubIndex], vocab_size: int, policy: LivePolicy) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="drafter-bench-live-")
        tokenizer = TokenizerIdentity(name="replay", vocab_size=vocab_size, fingerprint="")
        if base:
            initial = Path(self._dir.name) / "snapshots" / "initial"
            initial.parent.mkdir(parents=True)
            write_snapshot(initial, Datastore(base, vocab_size), tokenizer)
        self.store = LiveDatastore(self._dir.name, tokenizer, policy, background=False)

    @property
    def datastore(self) -> Datastore:
        return self.store.datastore

    def ingest(self, documents: Sequence[npt.NDArray[np.int32]]) -> Datastore:
        """Ingests finished documents (durably); returns the datastore to draft from."""
        for doc in documents:
            if len(doc):
                self.store.ingest(doc)
        return self.store.datastore

    def close(self) -> None:
        self.store.close()
        self._dir.cleanup()
