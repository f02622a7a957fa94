"""Raw array files of a snapshot: written chunked with fsync and sha256, mapped read-only."""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

from drafter_service.snapshot.manifest import SnapshotError

CHUNK_TOKENS = 1 << 20  # 4 MiB per write / hash update
LE_INT32 = np.dtype("<i4")


class DamagedDataError(RuntimeError):
    """Data on disk that holds acknowledged ingests cannot be read: the service refuses
    to start rather than serve less than it acknowledged (the message names the file,
    what would be lost and how to proceed: ``drafter serve --salvage``)."""


def move_aside(path: Path, into: Path) -> Path:
    """Moves ``path`` (a file or directory) into ``into`` under a name no earlier move
    took; returns the new path. Damaged data is kept as evidence, never deleted."""
    into.mkdir(parents=True, exist_ok=True)
    target = into / path.name
    n = 1
    while target.exists():
        n += 1
        target = into / f"{path.name}.{n}"
    os.replace(path, target)
    fsync_dir(into)
    fsync_dir(path.parent)
    return target


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (possibly owned by another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def le_chunks(arr: npt.NDArray[np.int32]) -> Iterator[memoryview]:
    """Little-endian ``arr`` in 4 MiB chunks (views on little-endian hosts, else small copies)."""
    for lo in range(0, len(arr), CHUNK_TOKENS):
        yield arr[lo : lo + CHUNK_TOKENS].astype(LE_INT32, copy=False).data


def write_file(path: Path, chunks: Iterable[memoryview | bytes]) -> str:
    """Creates ``path`` with ``chunks``, fsyncs it, and returns the sha256 hex of its bytes."""
    digest = hashlib.sha256()
    with open(path, "xb") as f:
        for chunk in chunks:
            f.write(chunk)
            digest.update(chunk)
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """Makes the entries of directory ``path`` (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def map_array(path: Path, num_tokens: int, sha256: str | None) -> npt.NDArray[np.int32]:
    """Maps ``path`` read-only as ``num_tokens`` int32 values, checking size and checksum."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SnapshotError(f"{path} is missing") from None
    except OSError as exc:
        raise SnapshotError(f"cannot open {path}: {exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SnapshotError(f"{path} is not a regular file")
        expected = 4 * num_tokens
        if st.st_size != expected:
            kind = "truncated" if st.st_size < expected else "too long"
            raise SnapshotError(
                f"{path} is {kind}: {st.st_size} bytes, expected {expected} ({num_tokens} int32)"
            )
        if num_tokens == 0:
            buffer: mmap.mmap | bytes = b""
        else:
            buffer = mmap.mmap(fd, expected, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise SnapshotError(f"cannot map {path}: {exc}") from exc
    finally:
        os.close(fd)
    if sha256 is not None and (found := hashlib.sha256(buffer).hexdigest()) != sha256:
        raise SnapshotError(f"{path} fails its checksum: sha256 {found}, manifest says {sha256}")
    arr: npt.NDArray[np.int32] = np.frombuffer(buffer, dtype=LE_INT32)
    if sys.byteorder != "little":
        arr = arr.astype(np.int32)  # big-endian host: one converted copy
    return arr
