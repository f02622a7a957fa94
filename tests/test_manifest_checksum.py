"""A snapshot manifest seals its own content (issue 29, item 2): a changed value is refused
as damage, a manifest written before manifests carried a checksum is still read, and the
manifest is cross-checked against the data files it describes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from drafter_service import Datastore, SubIndex
from drafter_service.snapshot.manifest import CHECKSUM_KEY, manifest_checksum
from drafter_service.snapshot.store import (
    SnapshotError,
    TokenizerIdentity,
    load_snapshot,
    read_manifest,
    scan_snapshots,
    write_snapshot,
)

VOCAB = 50
TOKENIZER = TokenizerIdentity("test-tok", VOCAB)


@pytest.fixture
def snapshot_dir(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, VOCAB, size=int(rng.integers(1, 20)), dtype=np.int32)
            for _ in range(12)]  # fmt: skip
    directory = tmp_path / "snap"
    write_snapshot(directory, Datastore([SubIndex.build(docs, VOCAB)], VOCAB), TOKENIZER,
                   wal_position=60, metadata={"k": [1]})  # fmt: skip
    return directory


def rewrite(directory: Path, key: str, value: object, *, seal: bool) -> Path:
    """Sets the manifest's ``key``; ``seal``: the checksum recomputed (as a writer would),
    else the stored one kept (as damage leaves it)."""
    path = directory / "manifest.json"
    doc = json.loads(path.read_text())
    doc[key] = value
    if seal:
        doc[CHECKSUM_KEY] = manifest_checksum(doc)
    path.write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n")
    return path


@pytest.mark.parametrize(("key", "value"), [("wal_position", 70), ("created_unix", 1.5e9)])
def test_a_changed_manifest_value_fails_its_checksum(
    snapshot_dir: Path, key: str, value: object
) -> None:
    path = rewrite(snapshot_dir, key, value, seal=False)
    for call in (read_manifest, load_snapshot):
        with pytest.raises(SnapshotError, match=rf"{path}: manifest fails its checksum"):
            call(snapshot_dir)
    complete, unreadable = scan_snapshots(snapshot_dir.parent)
    assert complete == [] and [p for p, _ in unreadable] == [snapshot_dir]


def test_a_manifest_without_a_checksum_is_read_as_before(snapshot_dir: Path) -> None:
    written = read_manifest(snapshot_dir)
    path = snapshot_dir / "manifest.json"
    doc = json.loads(path.read_text())
    assert doc[CHECKSUM_KEY] == manifest_checksum(doc)
    del doc[CHECKSUM_KEY]  # as every manifest before issue 29 was written
    path.write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n")
    assert read_manifest(snapshot_dir) == written
    assert load_snapshot(snapshot_dir)[1] == written
    rewrite(snapshot_dir, "wal_position", 70, seal=True)  # a writer's change, sealed: read
    assert read_manifest(snapshot_dir).wal_position == 70


def test_num_documents_is_checked_against_the_tokens_file(snapshot_dir: Path) -> None:
    entries = json.loads((snapshot_dir / "manifest.json").read_text())["sub_indices"]
    entries[0]["num_documents"] = 11  # the tokens file holds 12
    rewrite(snapshot_dir, "sub_indices", entries, seal=True)
    with pytest.raises(SnapshotError, match=r"sub-000\.tokens\.i32 holds 12 documents, the "
                       r"manifest says 11"):  # fmt: skip
        load_snapshot(snapshot_dir)
