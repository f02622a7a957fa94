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

from benchmarks.token_records import Record
from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.live.live_datastore import LiveDatastore, LivePolicy
from drafter_service.snapshot.store import TokenizerIdentity, write_snapshot


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

    def ingest(self, records: Sequence[Record]) -> Datastore:
        """Ingests finished records as the policy says (by default the last 3 prompt
        tokens, then the output), durably; returns the datastore to draft from."""
        for record in records:
            self.store.ingest_generation(record.prompt_ids, record.output_ids)
        return self.store.datastore

    def close(self) -> None:
        self.store.close()
        self._dir.cleanup()
