"""Corpora: static sub-indices an operator pins before the learned ones.

A corpus is built offline (e.g. by the admin API), never rebuilt, rotated or dropped, and
written into every later snapshot. The datastore holds the corpora's sub-indices first,
then the learned ones; the manifest's ``metadata.corpora`` lists each corpus with its
sub-index count, which is how :func:`split_corpora` tells them apart on load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.live.live_policy import DatastoreFull
from drafter_service.snapshot.store import SnapshotError, SnapshotInfo

CORPORA_KEY = "corpora"
"""Snapshot metadata key listing the corpora (name, sub-index count, metadata) in order."""


@dataclass(frozen=True, slots=True)
class Corpus:
    """Static sub-indices added by an operator; kept across rebuilds and snapshots."""

    name: str
    sub_indices: tuple[SubIndex, ...]
    metadata: Mapping[str, object] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.sub_indices)

    @property
    def resident_bytes(self) -> int:
        return sum(s.resident_bytes for s in self.sub_indices)


def joined_datastore(
    corpora: Sequence[Corpus], learned: Sequence[SubIndex], vocab_size: int
) -> Datastore:
    """The corpora's sub-indices (its base, a source of their own), then the learned ones."""
    base = [s for c in corpora for s in c.sub_indices]
    return Datastore(base + list(learned), vocab_size, base_count=len(base))


def corpora_listing(corpora: Sequence[Corpus]) -> list[dict[str, object]]:
    """The manifest's ``metadata.corpora`` for a datastore holding ``corpora``."""
    return [
        {"name": c.name, "sub_indices": len(c.sub_indices), "metadata": dict(c.metadata)}
        for c in corpora
    ]


def split_corpora(
    datastore: Datastore, info: SnapshotInfo
) -> tuple[tuple[Corpus, ...], tuple[SubIndex, ...]]:
    """The corpora a snapshot's metadata names and the learned sub-indices after them
    (without that metadata, e.g. from the builder: learned only)."""
    subs = datastore.sub_indices
    listed = info.metadata.get(CORPORA_KEY, [])
    malformed = SnapshotError(f"{info.path}: manifest metadata.{CORPORA_KEY} is malformed")
    if not isinstance(listed, list):
        raise malformed
    corpora: list[Corpus] = []
    start = 0
    for item in listed:
        if not isinstance(item, dict):
            raise malformed
        name, count, meta = item.get("name"), item.get("sub_indices"), item.get("metadata", {})
        if (
            not isinstance(name, str)
            or not isinstance(count, int)
            or isinstance(count, bool)
            or not isinstance(meta, dict)
            or not 0 <= count <= len(subs) - start
        ):
            raise malformed
        corpora.append(Corpus(name, subs[start : start + count], meta))
        start += count
    return tuple(corpora), subs[start:]


def with_corpus(
    corpora: tuple[Corpus, ...], corpus: Corpus, datastore: Datastore, bound: int | None
) -> tuple[Corpus, ...]:
    """``corpora`` of ``datastore`` with ``corpus`` last; ValueError for another vocabulary
    or a name in use, DatastoreFull when the datastore would pass ``bound`` bytes."""
    for sub in corpus.sub_indices:
        if sub.vocab_size != datastore.vocab_size:
            raise ValueError(
                f"corpus {corpus.name!r}: vocab_size {sub.vocab_size} differs from the "
                f"datastore's {datastore.vocab_size}"
            )
    if any(c.name == corpus.name for c in corpora):
        raise ValueError(f"corpus {corpus.name!r} already exists")
    total = datastore.resident_bytes + corpus.resident_bytes
    if bound is not None and total > bound:
        raise DatastoreFull(
            f"corpus {corpus.name!r} needs {corpus.resident_bytes} bytes: the "
            f"datastore would hold {total}, over max_resident_bytes ({bound})"
        )
    return (*corpora, corpus)


def without_corpus(corpora: tuple[Corpus, ...], name: str) -> tuple[Corpus, ...]:
    """``corpora`` without corpus ``name`` (KeyError when absent)."""
    kept = tuple(c for c in corpora if c.name != name)
    if len(kept) == len(corpora):
        raise KeyError(f"no corpus {name!r}")
    return kept
