"""The live datastore as ``--live`` replays use it.

Finished records are ingested into the product's :class:`LiveDatastore`
(write-ahead log, real rebuild policy) in a temporary directory. A prebuilt base
(``--corpus`` or ``--snapshot``), if any, joins it in one of two layouts
(:data:`LIVE_BASE_LAYOUTS`): ``pinned``, a pinned corpus, as ``drafter serve
--snapshot`` seeds a data directory and the admin API adds a corpus (the base stays its
own sub-indices and its own drafting source, finished records get sub-indices of their
own); ``seed``, its initial learned snapshot (finished records fold into its newest
sub-index: one index, one source).
The policy rebuilds synchronously (``background=False``) so that replays stay
deterministic.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from drafter_bench.token_records import Record
from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.live.index_set import Unfolded
from drafter_service.live.live_datastore import LiveDatastore, LivePolicy
from drafter_service.live.pinned_corpora import CORPORA_KEY, Corpus, corpora_listing
from drafter_service.snapshot.store import TokenizerIdentity, write_snapshot

LIVE_BASE_LAYOUTS = ("pinned", "seed")
"""How a base joins the live datastore: ``pinned`` = a pinned corpus beside the learned
sub-indices; ``seed`` = its initial (learned) snapshot."""

PINNED_BASE_NAME = "replay-base"
"""The corpus name of a ``pinned`` base."""


class ReplayLiveStore:
    """A :class:`LiveDatastore` in a temporary directory, starting from ``base`` laid
    out as ``base_layout`` (one of :data:`LIVE_BASE_LAYOUTS`); ``unfolded``: a drafter
    whose recent tier holds each stored record until a rebuild folds it in."""

    def __init__(
        self,
        base: Sequence[SubIndex],
        vocab_size: int,
        policy: LivePolicy,
        base_layout: str = "pinned",
        unfolded: Unfolded | None = None,
    ) -> None:
        if base_layout not in LIVE_BASE_LAYOUTS:
            raise ValueError(
                f"unknown live base layout {base_layout!r}; "
                f"expected one of {', '.join(LIVE_BASE_LAYOUTS)}"
            )
        self._dir = tempfile.TemporaryDirectory(prefix="drafter-bench-live-")
        tokenizer = TokenizerIdentity(name="replay", vocab_size=vocab_size, fingerprint="")
        if base:
            initial = Path(self._dir.name) / "snapshots" / "initial"
            initial.parent.mkdir(parents=True)
            # The manifest's corpora listing is what makes the live datastore load the
            # base as a pinned corpus instead of as its first learned sub-indices.
            pinned = Corpus(PINNED_BASE_NAME, tuple(base))
            metadata = {CORPORA_KEY: corpora_listing([pinned])} if base_layout == "pinned" else None
            write_snapshot(initial, Datastore(base, vocab_size), tokenizer, metadata=metadata)
        self.store = LiveDatastore(self._dir.name, tokenizer, policy, background=False,
                                   unfolded=unfolded)  # fmt: skip

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
