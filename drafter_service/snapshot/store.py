"""Datastore snapshots: atomic, checksummed directories of raw int32 arrays, loaded memory-mapped.

Layout, manifest fields and the crash-safety protocol are in docs/snapshot-format.md.
Every refusal, I/O errors included, raises ``SnapshotError`` (a ``ValueError``) naming the
file and why.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from drafter_service.datastore.sub_indices import SEPARATOR, Datastore, SubIndex
from drafter_service.snapshot.array_files import (
    CHUNK_TOKENS,
    fsync_dir,
    le_chunks,
    map_array,
    process_alive,
    write_file,
)

# The names imported ``as`` themselves are re-exported: this module is the snapshot API.
from drafter_service.snapshot.manifest import FORMAT_VERSION as FORMAT_VERSION
from drafter_service.snapshot.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    SubIndexEntry,
    manifest_bytes,
    parse_manifest,
)
from drafter_service.snapshot.manifest import SnapshotError as SnapshotError
from drafter_service.snapshot.manifest import SnapshotInfo as SnapshotInfo
from drafter_service.snapshot.manifest import TokenizerIdentity as TokenizerIdentity

_TEMP_PID = re.compile(r"\.tmp-(\d+)-")


def write_snapshot(
    directory: str | Path,
    datastore: Datastore,
    tokenizer: TokenizerIdentity,
    *,
    wal_position: int = 0,
    metadata: Mapping[str, object] | None = None,
    clock: Callable[[], float] = time.time,
) -> SnapshotInfo:
    """Writes ``datastore`` to the new directory ``directory``, atomically: every file,
    manifest.json last, fsynced into a :func:`temporary_sibling` (a sub-index an earlier
    snapshot holds is hardlinked from it), which is fsynced and renamed into place, the
    parent fsynced. A crash leaves no ``directory`` or a complete one (and a temporary
    for ``remove_stale_temporaries``). ``clock`` gives ``created_unix``."""
    directory = Path(directory)
    if datastore.vocab_size != tokenizer.vocab_size:
        raise SnapshotError(
            f"cannot write {directory}: datastore vocab_size {datastore.vocab_size} differs from "
            f"tokenizer {tokenizer.describe()}"
        )
    meta = dict(metadata or {})
    info = SnapshotInfo(directory, FORMAT_VERSION, tokenizer, (), wal_position, clock(), meta)
    try:  # before touching the disk, refuse a manifest that would not load back
        parse_manifest(manifest_bytes(info), directory)
    except SnapshotError as exc:
        raise SnapshotError(f"cannot write {directory}: {exc}") from None
    if not directory.name or directory.name.startswith("."):
        raise SnapshotError(f"cannot write {directory}: the name must not be empty or hidden")
    if os.path.lexists(directory):
        raise SnapshotError(f"cannot write {directory}: it already exists")
    try:
        with atomic_directory(directory) as temp:
            entries = tuple(
                _write_sub_index(temp, f"sub-{i:03d}", sub)
                for i, sub in enumerate(datastore.sub_indices)
            )
            info = replace(info, sub_indices=entries)
            write_file(temp / MANIFEST_NAME, [manifest_bytes(info)])
    except OSError as exc:
        raise SnapshotError(f"cannot write {directory}: {exc}") from exc
    for sub, entry in zip(datastore.sub_indices, entries, strict=True):
        sub.origin = (directory, entry)
    return info


@contextmanager
def atomic_directory(directory: Path) -> Iterator[Path]:
    """A new :func:`temporary_sibling` of ``directory`` (its parent made if missing) for
    the block to fill: once the block completes, fsynced and renamed into place, the
    parent fsynced; removed if the block or any of this raises."""
    temp = temporary_sibling(directory)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        temp.mkdir()
        yield temp
        fsync_dir(temp)
        if os.path.lexists(directory):
            raise SnapshotError(f"cannot write {directory}: it was created meanwhile")
        os.rename(temp, directory)  # refuses a non-empty target
        fsync_dir(directory.parent)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


def read_manifest(directory: str | Path) -> SnapshotInfo:
    """Parses and validates ``directory``/manifest.json (format version, fields, types)."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        what = "is missing" if directory.is_dir() else "is missing (no such snapshot directory)"
        raise SnapshotError(f"{path} {what}") from None
    except OSError as exc:
        raise SnapshotError(f"cannot read {path}: {exc}") from exc
    if len(data) > MAX_MANIFEST_BYTES:
        raise SnapshotError(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        return parse_manifest(data, directory)
    except SnapshotError as exc:
        raise SnapshotError(f"{path}: {exc}") from None


def load_snapshot(
    directory: str | Path,
    *,
    expect_tokenizer: TokenizerIdentity | None = None,
    verify_checksums: bool = True,
) -> tuple[Datastore, SnapshotInfo]:
    """Loads a snapshot with every array memory-mapped read-only (processes loading it
    share the page cache). Refuses another tokenizer than ``expect_tokenizer``, a missing,
    truncated or too long file, a checksum mismatch (``verify_checksums``), and token or
    suffix-array values out of range (always checked, O(n), by ``SubIndex.from_arrays``)."""
    info = read_manifest(directory)
    if expect_tokenizer is not None:
        check_tokenizer(info, expect_tokenizer)
    vocab_size = info.tokenizer.vocab_size
    subs = []
    for entry in info.sub_indices:
        tokens_path, sa_path = info.path / entry.tokens_file, info.path / entry.sa_file
        sha = (entry.tokens_sha256, entry.sa_sha256) if verify_checksums else (None, None)
        tokens = map_array(tokens_path, entry.num_tokens, sha[0])
        sa = map_array(sa_path, entry.num_tokens, sha[1])
        if verify_checksums and (found := _documents(tokens)) != entry.num_documents:
            raise SnapshotError(
                f"{tokens_path} holds {found} documents, the manifest says "
                f"{entry.num_documents}: the manifest does not describe this snapshot's data"
            )
        try:
            sub = SubIndex.from_arrays(tokens, sa, vocab_size)
        except ValueError as exc:
            # The native check names the array: "token ..." or "suffix array entry ...".
            bad = sa_path if "suffix array" in str(exc) else tokens_path
            raise SnapshotError(f"{bad} is corrupt: {exc}") from None
        sub.origin = (info.path, entry)
        subs.append(sub)
    return Datastore(subs, vocab_size), info


def check_tokenizer(info: SnapshotInfo, expected: TokenizerIdentity) -> None:
    """Refuses a snapshot of another tokenizer than ``expected``."""
    if not expected.matches(info.tokenizer):
        raise SnapshotError(
            f"{info.path / MANIFEST_NAME}: snapshot tokenizer {info.tokenizer.describe()} does "
            f"not match the expected tokenizer {expected.describe()}"
        )


def _documents(tokens: npt.NDArray[np.int32]) -> int:
    """Documents in a text: separators + 1, or 0 for an empty text."""
    separators = 0
    for lo in range(0, len(tokens), CHUNK_TOKENS):
        separators += int(np.count_nonzero(tokens[lo : lo + CHUNK_TOKENS] == SEPARATOR))
    return separators + 1 if len(tokens) else 0


def list_snapshots(root: str | Path) -> list[SnapshotInfo]:
    """Complete snapshots directly under ``root`` (directories with a valid manifest),
    oldest first by ``created_unix`` then name. A missing ``root`` has none."""
    return scan_snapshots(root)[0]


def scan_snapshots(root: str | Path) -> tuple[list[SnapshotInfo], list[tuple[Path, str]]]:
    """One pass over ``root``: the complete snapshots (as :func:`list_snapshots`), and the
    other non-temporary directories (by name), each with why its manifest is unreadable."""
    root = Path(root)
    found: list[SnapshotInfo] = []
    unreadable: list[tuple[Path, str]] = []
    for child in sorted(_children(root, "snapshots in "), key=lambda e: e.name):
        if _is_temporary(child.name) or not child.is_dir():
            continue
        try:
            found.append(read_manifest(root / child.name))
        except SnapshotError as exc:
            unreadable.append((root / child.name, str(exc)))
    return sorted(found, key=lambda info: (info.created_unix, info.path.name)), unreadable


def remove_stale_temporaries(root: str | Path) -> int:
    """Deletes temporaries under ``root`` left by crashed writes; returns how many. One
    whose writer is alive on this host is kept (mid-write); on a filesystem shared between
    hosts, call this only while no other host writes snapshots into ``root``."""
    removed = 0
    for child in _children(Path(root), ""):
        if not _is_temporary(child.name) or not child.is_dir(follow_symlinks=False):
            continue
        match = _TEMP_PID.search(child.name)
        if match and process_alive(int(match.group(1))):
            continue
        try:
            shutil.rmtree(child.path)
        except FileNotFoundError:
            continue  # removed concurrently
        except OSError as exc:
            raise SnapshotError(f"cannot remove stale temporary {child.path}: {exc}") from exc
        removed += 1
    return removed


def delete_snapshot(directory: str | Path) -> None:
    """Deletes a snapshot atomically: renamed to a temporary first, so a crash never leaves
    a complete-looking directory lacking files (``remove_stale_temporaries`` clears it)."""
    directory = Path(directory)
    doomed = temporary_sibling(directory)
    try:
        os.rename(directory, doomed)
        fsync_dir(directory.parent)
        shutil.rmtree(doomed)
    except OSError as exc:
        raise SnapshotError(f"cannot delete snapshot {directory}: {exc}") from exc


def temporary_sibling(directory: Path) -> Path:
    """A fresh temporary name beside ``directory`` (``.NAME.tmp-PID-RANDOM``), which
    :func:`remove_stale_temporaries` clears once its process is gone."""
    return directory.parent / f".{directory.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


def _children(root: Path, what: str) -> list[os.DirEntry[str]]:
    """The entries of ``root`` (none if it is missing)."""
    try:
        return list(os.scandir(root))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SnapshotError(f"cannot list {what}{root}: {exc}") from exc


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and ".tmp" in name


def _write_sub_index(directory: Path, name: str, sub: SubIndex) -> SubIndexEntry:
    """The files of ``sub`` in ``directory``: hardlinked from the earlier snapshot that
    holds them (immutable) when there is one, else written."""
    if sub.origin is not None:
        source, entry = sub.origin
        if isinstance(entry, SubIndexEntry) and entry.num_tokens == sub.num_tokens:
            linked = replace(entry, name=name)
            try:
                os.link(source / entry.tokens_file, directory / linked.tokens_file)
                os.link(source / entry.sa_file, directory / linked.sa_file)
                return linked
            except OSError:  # gone, another filesystem, no hardlinks: write instead
                (directory / linked.tokens_file).unlink(missing_ok=True)
    tokens, sa = sub.tokens(), sub.suffix_array()
    return SubIndexEntry(
        name=name,
        num_tokens=len(tokens),
        num_documents=_documents(tokens),
        tokens_sha256=write_file(directory / f"{name}.tokens.i32", le_chunks(tokens)),
        sa_sha256=write_file(directory / f"{name}.sa.i32", le_chunks(sa)),
    )
