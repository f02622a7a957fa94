"""A datastore that grows with finished generations (``--live``).

Stand-in for the real live datastore: every ingest rebuilds one sub-index over
all live documents so far (on top of the fixed corpus sub-indices, if any).
Replay only talks to :class:`LiveDatastore`, so swapping in an incremental
implementation changes this module alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from drafter_service.datastore import Datastore, SubIndex

PROMPT_TAIL = 3
"""Prompt tokens kept in front of a finished output (context for its first tokens)."""


def live_document(
    prompt_ids: npt.NDArray[np.int32], output_ids: npt.NDArray[np.int32]
) -> npt.NDArray[np.int32]:
    """What a finished request contributes: the last prompt tokens, then its output."""
    return np.concatenate(
        [prompt_ids[len(prompt_ids) - min(PROMPT_TAIL, len(prompt_ids)) :], output_ids]
    ).astype(np.int32, copy=False)


class LiveDatastore:
    """Fixed ``base`` sub-indices plus one rebuilt-on-ingest sub-index of live documents."""

    def __init__(self, base: Sequence[SubIndex], vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._base = tuple(base)
        self._documents: list[npt.NDArray[np.int32]] = []
        self.rebuilds = 0
        """How many times the live sub-index was rebuilt."""
        self.rebuild_s = 0.0
        """Seconds spent rebuilding, in total."""
        self.datastore = Datastore(self._base, vocab_size)
        """The current datastore (replaced, never mutated, by :meth:`ingest`)."""

    @property
    def num_documents(self) -> int:
        return len(self._documents)

    def ingest(self, documents: Sequence[npt.NDArray[np.int32]]) -> Datastore:
        """Adds finished documents; returns the new datastore to install."""
        docs = [d for d in documents if len(d)]
        if not docs:
            return self.datastore
        self._documents.extend(docs)
        start = time.perf_counter()
        live = SubIndex.build(self._documents, self.vocab_size)
        self.datastore = Datastore([*self._base, live], self.vocab_size)
        self.rebuild_s += time.perf_counter() - start
        self.rebuilds += 1
        return self.datastore
