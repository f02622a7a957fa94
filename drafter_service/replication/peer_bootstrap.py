"""A new replica's first snapshot, downloaded from a peer's admin API.

A replica with neither a snapshot nor a log segment (a new pod, a replaced volume, or data
:func:`supersede_behind_stream` moved aside) asks each ``--bootstrap-peers`` peer for its
newest snapshot, picks the one reaching furthest into the shared stream (``log_offset``),
downloads it into a temporary beside the snapshots (cleared at the next start if
interrupted), verifies every checksum and only then renames it into place. A plain-http
peer whose host names several addresses (a headless Service) counts as each (with https
the name is kept, so the certificate still matches).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from drafter_service.live.ingest_log import IngestLog
from drafter_service.live.startup import snapshot_offset
from drafter_service.live.stream_ids import StreamId
from drafter_service.replication.shared_log import LogError, RedisStream
from drafter_service.snapshot.array_files import move_aside
from drafter_service.snapshot.store import (
    SnapshotError,
    SnapshotInfo,
    TokenizerIdentity,
    atomic_directory,
    list_snapshots,
    load_snapshot,
    read_manifest,
)

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


class BootstrapError(RuntimeError):
    """Peers offered a snapshot but none could be downloaded intact."""


@dataclass(frozen=True, slots=True)
class _Offer:
    base: str  # the peer's admin API URL
    name: str
    url: str  # the snapshot's, on that API
    log_offset: StreamId | None
    created_unix: float


def offset_on_disk(directory: Path, salvage: bool = False) -> StreamId | None:
    """The newest stream entry ``directory`` holds, in its newest snapshot or its log
    (read as opening would, with ``salvage`` as the datastore will be); None: none."""
    root = directory / "snapshots"
    newest = list_snapshots(root)[-1:] if root.is_dir() else []
    known = [snapshot_offset(info) for info in newest]
    if (directory / "wal").is_dir():
        covered = newest[0].wal_position if newest else 0
        ingest_log = IngestLog(directory / "wal", covered_seq=covered, salvage=salvage)
        known.append(ingest_log.last_origin)
        ingest_log.close()
    return max((offset for offset in known if offset is not None), default=None)


def supersede_behind_stream(directory: Path, stream: RedisStream, salvage: bool = False) -> bool:
    """When retention trimmed stream entries after what ``directory`` holds, moves its
    snapshots and log aside into ``directory/superseded`` (kept) so the replica bootstraps
    from a peer instead of serving a hole. Returns whether it did; an unreachable stream
    changes nothing (the follower reports it). A damaged log is refused as opening it would
    be, unless ``salvage`` (the datastore's ``--salvage``)."""
    if needs_bootstrap(directory):
        return False
    held = offset_on_disk(directory, salvage)
    try:
        lost = stream.lost_after(held)
    except LogError as exc:
        log.warning("bootstrap: cannot check %s against the shared log: %s", directory, exc)
        return False
    if lost is None:
        return False
    into = directory / "superseded"
    for part in ("snapshots", "wal"):
        if (directory / part).exists():
            moved = move_aside(directory / part, into)
            log.warning("bootstrap: %s holds the stream only through %s and the stream now "
                        "starts at %s: moved %s aside to %s, starting from a peer",
                        directory, held, lost, part, moved)  # fmt: skip
    return True


def needs_bootstrap(directory: Path) -> bool:
    """Whether ``directory`` holds no snapshot and no ingest log segment."""
    snapshots, wal = directory / "snapshots", directory / "wal"
    if snapshots.is_dir() and list_snapshots(snapshots):
        return False
    return not (wal.is_dir() and any(p.suffix == ".log" for p in wal.iterdir()))


def bootstrap_from_peers(
    directory: Path,
    datastore: str,
    peers: Sequence[str],
    tokenizer: TokenizerIdentity,
    token: str | None,
    timeout_s: float = 30.0,
) -> SnapshotInfo | None:
    """Downloads the newest peer snapshot into ``directory/snapshots`` when
    :func:`needs_bootstrap`; None when not needed or none offered (the replica starts
    empty). Raises BootstrapError when every offered download failed."""
    if not needs_bootstrap(directory):
        return None
    get = partial(_get, token=token, timeout_s=timeout_s)
    offers = []
    for base in expand_peers(peers):
        try:
            offer = _newest_offer(get, base, datastore)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # HTTPError is an OSError
            log.warning("bootstrap: peer %s gave no snapshot listing: %s", base, exc)
            continue
        if offer is not None:
            offers.append(offer)
    if not offers:
        log.warning("bootstrap: no peer of %s offered a snapshot; starting empty", list(peers))
        return None
    offers.sort(key=lambda o: (o.log_offset or StreamId(-1, -1), o.created_unix), reverse=True)
    failures = []
    for offer in offers:
        try:
            info = _download(get, offer, directory / "snapshots", tokenizer)
        except (OSError, ValueError, SnapshotError) as exc:
            failures.append(f"{offer.base} {offer.name}: {exc}")
            log.warning("bootstrap: download of %s from %s failed: %s", offer.name, offer.base, exc)
            continue
        log.info("bootstrap: snapshot %s from %s (log offset %s, %d positions)",
                 offer.name, offer.base, offer.log_offset, info.num_tokens)  # fmt: skip
        return info
    raise BootstrapError("no peer snapshot could be downloaded intact: " + "; ".join(failures))


def expand_peers(peers: Sequence[str]) -> list[str]:
    """The peer URLs, a plain-http host one URL per address (resolver order, no repeats)."""
    urls: list[str] = []
    for url in peers:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
        addresses = [host] if host is not None else []
        if parts.scheme == "http" and host is not None:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                addresses = list(dict.fromkeys(str(info[4][0]) for info in infos)) or addresses
            except OSError as exc:
                log.warning("bootstrap: cannot resolve %s: %s", host, exc)
                continue
        for address in addresses:
            netloc = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
            expanded = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
            if expanded not in urls:
                urls.append(expanded)
    return urls


def _get(url: str, token: str | None, timeout_s: float) -> Any:
    """A GET of a peer's admin API (bound to its token and timeout: a :data:`_Get`)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s)


_Get = Callable[[str], Any]


def _json(get: _Get, url: str) -> Any:
    with get(url) as response:
        return json.load(response)


def _newest_offer(get: _Get, base: str, datastore: str) -> _Offer | None:
    url = f"{base}/v1/datastores/{quote(datastore)}/snapshots"
    newest = [s for s in _json(get, url)["snapshots"] if s.get("newest")]
    if not newest:
        return None
    s = newest[-1]
    name = str(s["name"])
    return _Offer(base, name, f"{url}/{quote(name)}", StreamId.parse_optional(s.get("log_offset")),
                  float(s["created_unix"]))  # fmt: skip


def _download(get: _Get, offer: _Offer, root: Path, tokenizer: TokenizerIdentity) -> SnapshotInfo:
    """Downloads and verifies into a temporary renamed into place (removed on failure)."""
    final = root / offer.name
    if final.exists():
        raise ValueError(f"{final} already exists")
    with atomic_directory(final) as temp:
        files_url = f"{offer.url}/files"
        for entry in _json(get, files_url)["files"]:
            name, size = str(entry["name"]), int(entry["bytes"])
            if "/" in name or name.startswith("."):
                raise ValueError(f"peer listed an unsafe file name {name!r}")
            _fetch(get, f"{files_url}/{quote(name)}", temp / name, size)
        load_snapshot(temp, expect_tokenizer=tokenizer)  # every checksum, before it counts
    return read_manifest(final)


def _fetch(get: _Get, url: str, path: Path, size: int) -> None:
    written = 0
    with get(url) as response, open(path, "wb") as out:
        while chunk := response.read(_CHUNK):
            written += len(chunk)
            if written > size:
                raise ValueError(f"{url}: more than the {size} bytes listed")
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    if written != size:
        raise ValueError(f"{url}: {written} bytes, the listing said {size}")
