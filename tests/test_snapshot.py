"""Datastore snapshots: round trip, memory mapping, tokenizer identity, corruption, crash safety."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from drafter_service import Datastore, Drafter, SubIndex
from drafter_service.snapshot.manifest import CHECKSUM_KEY, manifest_checksum
from drafter_service.snapshot.store import (
    FORMAT_VERSION,
    SnapshotError,
    SnapshotInfo,
    TokenizerIdentity,
    delete_snapshot,
    list_snapshots,
    load_snapshot,
    read_manifest,
    remove_stale_temporaries,
    write_snapshot,
)

VOCAB = 50
TOKENIZER = TokenizerIdentity("test-tok", VOCAB, hashlib.sha256(b"test-tok").hexdigest())


def random_documents(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    # Small alphabet inside a larger vocabulary: plenty of repeated n-grams to draft from.
    return [
        rng.integers(0, 12, size=int(rng.integers(0, 40)), dtype=np.int32) for _ in range(count)
    ]


def small_datastore(seed: int = 0) -> Datastore:
    rng = np.random.default_rng(seed)
    subs = [SubIndex.build(random_documents(rng, n), VOCAB) for n in (30, 1, 25)]
    return Datastore([*subs, SubIndex.build([], VOCAB)], VOCAB)


@pytest.fixture
def snapshot_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "snap"
    write_snapshot(directory, small_datastore(), TOKENIZER, wal_position=7, metadata={"k": [1]})
    return directory


def drafts(datastore: Datastore, contexts: list[list[int]]) -> list[tuple[list[object], ...]]:
    drafter = Drafter(VOCAB, datastore=datastore)
    out: list[tuple[list[object], ...]] = []
    for i, context in enumerate(contexts):
        drafter.start(f"r{i}", context)
        tree = drafter.speculate([f"r{i}"], [[]], 16).tree(0)
        out.append((tree.tokens.tolist(), tree.parents.tolist(), tree.scores.tolist()))
    return out


def test_round_trip(tmp_path: Path) -> None:
    store = small_datastore()
    info = write_snapshot(tmp_path / "s", store, TOKENIZER, wal_position=42, metadata={"by": "x"})
    loaded, loaded_info = load_snapshot(tmp_path / "s", expect_tokenizer=TOKENIZER)
    assert loaded_info == info
    assert (info.wal_position, info.metadata, info.format_version) == (42, {"by": "x"}, 1)
    assert [e.name for e in info.sub_indices] == ["sub-000", "sub-001", "sub-002", "sub-003"]
    assert info.num_tokens == store.num_tokens == loaded.num_tokens
    assert [e.num_documents for e in info.sub_indices] == [30, 1, 25, 0]
    assert loaded.vocab_size == VOCAB and len(loaded.sub_indices) == len(store.sub_indices)
    for a, b in zip(store.sub_indices, loaded.sub_indices, strict=True):
        assert np.array_equal(a.tokens(), b.tokens())
        assert np.array_equal(a.suffix_array(), b.suffix_array())
    rng = np.random.default_rng(1)
    contexts = [rng.integers(0, 12, size=n).tolist() for n in (1, 3, 8, 20)]
    contexts.append(store.sub_indices[0].tokens()[:10].tolist())
    assert drafts(loaded, contexts) == drafts(store, contexts)
    assert any(tree[0] for tree in drafts(loaded, contexts))


def test_num_documents_counts_separators(tmp_path: Path) -> None:
    store = Datastore([SubIndex.build([[1, 2], [], [3]], VOCAB)], VOCAB)
    info = write_snapshot(tmp_path / "s", store, TOKENIZER)
    assert (info.sub_indices[0].num_tokens, info.sub_indices[0].num_documents) == (5, 3)


def test_empty_datastore_round_trips(tmp_path: Path) -> None:
    info = write_snapshot(tmp_path / "s", Datastore.empty(VOCAB), TOKENIZER)
    loaded, loaded_info = load_snapshot(tmp_path / "s")
    assert loaded.sub_indices == () and loaded.num_tokens == 0 and info.num_tokens == 0
    assert loaded_info == info and sorted(os.listdir(tmp_path / "s")) == ["manifest.json"]


def test_manifest_is_sorted_json_with_trailing_newline(snapshot_dir: Path) -> None:
    text = (snapshot_dir / "manifest.json").read_text()
    doc = json.loads(text)
    assert text == json.dumps(doc, sort_keys=True, indent=1) + "\n"
    assert sorted(doc) == [
        "created_unix",
        "format_version",
        "manifest_sha256",
        "metadata",
        "sub_indices",
        "tokenizer",
        "wal_position",
    ]
    assert doc["tokenizer"] == TOKENIZER.to_json()


def mapped_file(address: int) -> str | None:
    """The file backing ``address`` in this process, from /proc/self/maps."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) == 6 else ""
    return None


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_loaded_arrays_are_memory_mapped_files(snapshot_dir: Path) -> None:
    loaded, info = load_snapshot(snapshot_dir)
    sub, entry = loaded.sub_indices[0], info.sub_indices[0]
    for arr, name in ((sub.tokens(), entry.tokens_file), (sub.suffix_array(), entry.sa_file)):
        assert not arr.flags.writeable
        assert mapped_file(arr.ctypes.data) == str((snapshot_dir / name).resolve())
    del loaded, sub  # the mapping lives as long as the sub-index


def test_tokenizer_identity_from_file(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]")
    )
    tok.add_special_tokens(["<sep>"])
    path = tmp_path / "tiny-tok" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    ident = TokenizerIdentity.from_file(path)
    assert ident == TokenizerIdentity("tiny-tok", 4, hashlib.sha256(path.read_bytes()).hexdigest())
    other = tmp_path / "my-tok.json"
    shutil.copy(path, other)
    assert TokenizerIdentity.from_file(other).name == "my-tok"
    assert TokenizerIdentity.from_file(other, name="x", vocab_size=9).vocab_size == 9
    assert TokenizerIdentity.from_json(ident.to_json()) == ident
    with pytest.raises(SnapshotError, match=r"missing\.json"):
        TokenizerIdentity.from_file(tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("{not a tokenizer")
    with pytest.raises(SnapshotError, match=r"junk\.json"):
        TokenizerIdentity.from_file(tmp_path / "junk.json")


def test_tokenizer_identity_matches_and_validates() -> None:
    a, b = "a" * 64, "b" * 64
    assert TokenizerIdentity("x", 5, a).matches(TokenizerIdentity("y", 5, a))
    assert TokenizerIdentity("x", 5, a).matches(TokenizerIdentity("x", 5, ""))
    assert not TokenizerIdentity("x", 5, a).matches(TokenizerIdentity("x", 5, b))
    assert not TokenizerIdentity("x", 5, "").matches(TokenizerIdentity("x", 6, ""))
    for bad in ({"vocab_size": 0}, {"vocab_size": True}, {"fingerprint": "xyz"}):
        with pytest.raises(ValueError, match=str(next(iter(bad.values())))):
            TokenizerIdentity(**{"name": "x", "vocab_size": 5, "fingerprint": "", **bad})  # type: ignore[arg-type]


def test_tokenizer_mismatch_is_refused_naming_both(snapshot_dir: Path) -> None:
    other = TokenizerIdentity("other-tok", VOCAB, "c" * 64)
    with pytest.raises(SnapshotError) as exc:
        load_snapshot(snapshot_dir, expect_tokenizer=other)
    for part in ("test-tok", "other-tok", TOKENIZER.fingerprint, "c" * 64, "manifest.json"):
        assert part in str(exc.value)
    with pytest.raises(SnapshotError, match="vocab_size 51"):
        load_snapshot(snapshot_dir, expect_tokenizer=TokenizerIdentity("test-tok", VOCAB + 1))
    load_snapshot(snapshot_dir, expect_tokenizer=TokenizerIdentity("unknown", VOCAB))


def test_write_refusals(tmp_path: Path) -> None:
    store = small_datastore()
    (tmp_path / "exists").mkdir()
    with pytest.raises(SnapshotError, match=r"exists: it already exists"):
        write_snapshot(tmp_path / "exists", store, TOKENIZER)
    with pytest.raises(SnapshotError, match="vocab_size 50"):
        write_snapshot(tmp_path / "a", store, TokenizerIdentity("t", 51))
    with pytest.raises(SnapshotError, match="metadata"):
        write_snapshot(tmp_path / "b", store, TOKENIZER, metadata={"x": object()})
    with pytest.raises(SnapshotError, match="metadata"):
        write_snapshot(tmp_path / "c", store, TOKENIZER, metadata={"x": float("nan")})
    with pytest.raises(SnapshotError, match="wal_position"):
        write_snapshot(tmp_path / "d", store, TOKENIZER, wal_position=-1)
    with pytest.raises(SnapshotError, match="wal_position"):  # it could not be read back
        write_snapshot(tmp_path / "e", store, TOKENIZER, wal_position=2**63)
    assert os.listdir(tmp_path) == ["exists"]  # nothing half-written


def rewrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize("which", ["tokens", "sa"])
def test_truncated_and_too_long_files(snapshot_dir: Path, which: str) -> None:
    path = snapshot_dir / f"sub-002.{which}.i32"
    size = path.stat().st_size
    os.truncate(path, size - 4)
    truncated = rf"{path.name} is truncated: {size - 4} bytes, expected {size}"
    with pytest.raises(SnapshotError, match=truncated):
        load_snapshot(snapshot_dir, verify_checksums=False)
    os.truncate(path, size + 1)
    too_long = rf"{path.name} is too long: {size + 1} bytes, expected {size}"
    with pytest.raises(SnapshotError, match=too_long):
        load_snapshot(snapshot_dir)


@pytest.mark.parametrize("which", ["tokens", "sa"])
def test_flipped_byte_fails_checksum(snapshot_dir: Path, which: str) -> None:
    path = snapshot_dir / f"sub-000.{which}.i32"
    data = bytearray(path.read_bytes())
    data[8] ^= 0x01  # low bit of entry 2: stays in range, only the checksum can notice
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match=rf"{path.name} fails its checksum"):
        load_snapshot(snapshot_dir)
    load_snapshot(snapshot_dir, verify_checksums=False)


@pytest.mark.parametrize(("which", "value"), [("tokens", 1000), ("tokens", -7), ("sa", 10**6)])
def test_out_of_range_value_caught_without_checksums(
    snapshot_dir: Path, which: str, value: int
) -> None:
    path = snapshot_dir / f"sub-002.{which}.i32"
    rewrite(path, 4 * 5, np.array([value], dtype="<i4").tobytes())
    with pytest.raises(SnapshotError, match=rf"{path.name} is corrupt: .*{value}"):
        load_snapshot(snapshot_dir, verify_checksums=False)
    with pytest.raises(SnapshotError, match=rf"{path.name} fails its checksum"):
        load_snapshot(snapshot_dir)


@pytest.mark.parametrize("name", ["sub-001.tokens.i32", "sub-003.sa.i32"])
def test_missing_file(snapshot_dir: Path, name: str) -> None:
    (snapshot_dir / name).unlink()
    with pytest.raises(SnapshotError, match=rf"{name} is missing"):
        load_snapshot(snapshot_dir)


def edit_manifest(directory: Path, edit: str) -> None:
    path = directory / "manifest.json"
    doc = json.loads(path.read_text())
    if edit == "bad json":
        path.write_text(path.read_text()[:-20])
        return
    if edit == "missing key":
        del doc["wal_position"]
    elif edit == "missing entry key":
        del doc["sub_indices"][1]["sa_sha256"]
    elif edit == "wrong type":
        doc["sub_indices"][0]["num_tokens"] = "12"
    elif edit == "bool":
        doc["tokenizer"]["vocab_size"] = True
    elif edit == "version":
        doc["format_version"] = FORMAT_VERSION + 1
    elif edit == "escaping name":
        doc["sub_indices"][0]["name"] = "../sub-000"
    elif edit == "duplicate name":
        doc["sub_indices"][1]["name"] = "sub-000"
    elif edit == "not an object":
        doc = [doc]
    if isinstance(doc, dict):  # sealed again, so the check under test is the one that refuses
        doc[CHECKSUM_KEY] = manifest_checksum(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ("bad json", "not valid JSON"),
        ("missing key", "missing key 'wal_position'"),
        ("missing entry key", r"sub_indices\[1\] \(sub-001\) is missing key 'sa_sha256'"),
        ("wrong type", "num_tokens must be an int, got '12'"),
        ("bool", "vocab_size must be an int, got True"),
        ("version", f"format_version {FORMAT_VERSION + 1} is not supported"),
        ("escaping name", "'../sub-000' does not match"),
        ("duplicate name", "names repeat"),
        ("not an object", "manifest must be a JSON object"),
    ],
)
def test_bad_manifest(snapshot_dir: Path, edit: str, why: str) -> None:
    edit_manifest(snapshot_dir, edit)
    for call in (read_manifest, load_snapshot):
        with pytest.raises(SnapshotError, match=rf"manifest\.json: .*{why}"):
            call(snapshot_dir)
    assert list_snapshots(snapshot_dir.parent) == []


def test_missing_manifest_or_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SnapshotError, match=r"empty/manifest\.json is missing"):
        load_snapshot(tmp_path / "empty")
    with pytest.raises(SnapshotError, match="no such snapshot directory"):
        read_manifest(tmp_path / "nope")


def test_list_snapshots_and_stale_temporaries(tmp_path: Path) -> None:
    store = Datastore.empty(VOCAB)
    names = ["b", "a", "c"]  # written in this order: oldest first, not by name
    for created, name in zip((1.7e9, 1.7e9 + 1, 1.7e9 + 2), names, strict=True):
        write_snapshot(tmp_path / name, store, TOKENIZER, clock=lambda t=created: t)
    (tmp_path / "no-manifest").mkdir()
    (tmp_path / "a-file").write_text("x")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = [f".d.tmp-{dead.pid}-0000", ".e.tmp"]
    live = f".f.tmp-{os.getpid()}-0000"  # this process may be writing it
    for temp in [*stale, live]:
        shutil.copytree(tmp_path / "a", tmp_path / temp)
    assert [info.path.name for info in list_snapshots(tmp_path)] == names
    assert all(isinstance(info, SnapshotInfo) for info in list_snapshots(tmp_path))
    assert remove_stale_temporaries(tmp_path) == 2
    assert sorted(os.listdir(tmp_path)) == sorted([*names, "no-manifest", "a-file", live])
    assert list_snapshots(tmp_path / "missing") == [] and remove_stale_temporaries("/nope") == 0


CHILD = """
import sys
from drafter_service.snapshot.store import load_snapshot, write_snapshot
store, info = load_snapshot(sys.argv[1], verify_checksums=False)
print("ready", flush=True)
for k in range(1000):
    write_snapshot(f"{sys.argv[2]}/snap-{sys.argv[3]}-{k:03d}", store, info.tokenizer)
    print("wrote", flush=True)
"""


@pytest.mark.system
def test_crash_safety_under_sigkill(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    big = Datastore(
        [
            SubIndex.from_text(rng.integers(0, VOCAB, size=n, dtype=np.int32), VOCAB)
            for n in (1_500_000, 1_000_000)
        ],
        VOCAB,
    )
    source = write_snapshot(tmp_path / "source", big, TOKENIZER)
    root = tmp_path / "root"
    root.mkdir()
    chooser = random.Random(4)
    complete = interrupted = 0
    for i in range(20):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(source.path), str(root), str(i)],
            stdout=subprocess.PIPE,
        )
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        if i % 4 == 3:  # some kills after a complete write, however slow the disk
            assert child.stdout.readline() == b"wrote\n"
        time.sleep(chooser.uniform(0.0, 0.35))
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
        child.stdout.close()
        entries = os.listdir(root)
        temps = [e for e in entries if e.startswith(".")]
        done = sorted(e for e in entries if not e.startswith("."))
        assert [info.path.name for info in list_snapshots(root)] == done
        for name in done:
            _, info = load_snapshot(root / name, expect_tokenizer=TOKENIZER)
            assert info.sub_indices == source.sub_indices
        assert remove_stale_temporaries(root) == len(temps)
        assert sorted(os.listdir(root)) == done
        complete += len(done)
        interrupted += len(temps)
        for name in done:
            shutil.rmtree(root / name)
    assert complete > 0 and interrupted > 0  # kills landed both between and inside writes


def test_delete_snapshot_leaves_nothing_that_lists(tmp_path: Path) -> None:
    write_snapshot(tmp_path / "a", small_datastore(), TOKENIZER)
    write_snapshot(tmp_path / "b", small_datastore(1), TOKENIZER)
    delete_snapshot(tmp_path / "a")
    assert [info.path.name for info in list_snapshots(tmp_path)] == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    with pytest.raises(SnapshotError, match="cannot delete"):
        delete_snapshot(tmp_path / "a")


def test_unchanged_sub_indices_are_hardlinked_not_rewritten(tmp_path: Path) -> None:
    first = small_datastore()
    write_snapshot(tmp_path / "a", first, TOKENIZER)
    loaded, _ = load_snapshot(tmp_path / "a")
    newest = SubIndex.build([[1, 2, 3]], VOCAB)
    grown = Datastore([*loaded.sub_indices, newest], VOCAB)
    info = write_snapshot(tmp_path / "b", grown, TOKENIZER)
    old_files = sorted(p for p in (tmp_path / "a").iterdir() if p.suffix == ".i32")
    for i, old in enumerate(old_files[: 2 * len(first.sub_indices)]):
        assert (tmp_path / "b" / old.name).stat().st_ino == old.stat().st_ino, i
    new_file = tmp_path / "b" / info.sub_indices[-1].tokens_file
    assert new_file.stat().st_nlink == 1  # written, not linked
    delete_snapshot(tmp_path / "a")  # the links keep the data alive
    again, _ = load_snapshot(tmp_path / "b")
    assert [s.tokens().tolist() for s in again.sub_indices] == [
        s.tokens().tolist() for s in grown.sub_indices
    ]
