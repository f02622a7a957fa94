"""The shared ingest stream: one Redis Stream per datastore that every replica appends
its documents to and consumes, so all learn from all traffic (docs/scale-out.md).

An entry is one document: ``v`` (format ``1``), ``tokens`` (little-endian int32) and
``crc`` (CRC-32 of ``tokens``, decimal). The server gives entries increasing ids
(:class:`StreamId`); ``retention`` trims to about that many on every append (``MAXLEN
~``), and :meth:`RedisStream.lost_after` tells a replica whether unconsumed ones went.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from drafter_service.live.stream_ids import StreamId

try:
    import redis
except ModuleNotFoundError:  # the library without the service extra: no shared log
    redis = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

FORMAT = b"1"


class _NoRedisError(Exception):
    """Stands for redis' errors where redis is not installed (nothing can raise them)."""


LogError: type[Exception] = _NoRedisError if redis is None else redis.RedisError
"""What a failed call to the log server raises (connection lost, timeout, refused)."""


def describe(error: BaseException) -> str:
    """``error``'s type and message (a redis error's repr omits which server refused)."""
    return f"{type(error).__name__}: {error}"


class BadEntry(ValueError):
    """A stream entry that is not a document of this format."""


@dataclass(frozen=True, slots=True)
class SharedLogConfig:
    """The shared stream's server (``redis://`` or ``rediss://``), key prefix (stream
    ``<prefix>:<NAME>``), entries kept per stream (0: all; >= 0 by ServeConfig), password file."""

    url: str
    prefix: str = "sssd-drafter"
    retention: int = 1_000_000
    password_file: Path | None = None
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError(
                f"shared log: {self.url!r} is not a redis://host[:port][/db] or "
                "rediss://host[:port][/db] URL"
            )
        try:
            parts.port  # noqa: B018 - validates the port
        except ValueError as exc:
            raise ValueError(f"shared log: {self.url!r}: {exc}") from None
        if not self.prefix or any(c.isspace() for c in self.prefix):
            raise ValueError(f"shared log prefix must be non-empty without spaces: {self.prefix!r}")

    def stream(self, datastore: str) -> RedisStream:
        """A connection to the stream of ``datastore``."""
        return RedisStream(self, f"{self.prefix}:{datastore}")


class RedisStream:
    """One datastore's stream; each method is one round trip raising :data:`LogError`."""

    def __init__(self, config: SharedLogConfig, key: str) -> None:
        if redis is None:
            raise RuntimeError(
                "the shared log needs the redis package: pip install 'sssd-drafter[service]'"
            )
        password = config.password_file.read_text().strip() if config.password_file else None
        self.key = key
        self._maxlen = config.retention or None  # trimmed to about this on every append
        timeout = config.timeout_s
        connect = partial(
            redis.Redis.from_url, config.url, password=password, socket_connect_timeout=timeout
        )
        self._redis = connect(socket_timeout=timeout, health_check_interval=30)
        # XREAD BLOCK needs a socket timeout longer than the block.
        self._reader = connect(socket_timeout=timeout + 5.0)

    def append(self, tokens: npt.NDArray[np.int32]) -> StreamId:
        """Appends one document; returns its entry id once the server has it."""
        payload = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
        fields: dict[Any, Any] = {b"v": FORMAT, b"tokens": payload, b"crc": zlib.crc32(payload)}
        entry_id = self._redis.xadd(self.key, fields, maxlen=self._maxlen, approximate=True)
        return StreamId.parse(cast("bytes", entry_id))

    def read_after(
        self, after: StreamId | None, *, block_ms: int, count: int
    ) -> list[tuple[StreamId, bytes | BadEntry]]:
        """Up to ``count`` entries after ``after`` (None: the start), waiting ``block_ms``
        for the first: (id, payload or why it is bad)."""
        start = str(after) if after is not None else "0-0"
        reply = cast(
            "list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None",
            self._reader.xread({self.key: start}, count=count, block=block_ms),
        )
        return [
            (StreamId.parse(raw_id), _payload(fields))
            for _key, items in reply or []
            for raw_id, fields in items
        ]

    def lost_after(self, after: StreamId | None) -> StreamId | None:
        """The oldest entry held when retention may have trimmed entries after ``after``
        (None: the start), else None. Trimming goes oldest first, so nothing after
        ``after`` is gone while it is held; once it is gone this says so even if none were
        (a consumer stopped right at the trim point), never the reverse."""
        try:
            info = self._redis.xinfo_stream(self.key)
        except redis.ResponseError as exc:
            if "no such key" in str(exc).lower():
                return None
            raise
        length, added = int(info["length"]), int(info["entries-added"])
        first = info.get("first-entry")
        if added <= length or first is None:  # nothing was ever trimmed
            return None
        oldest = StreamId.parse(first[0])
        if after is None:
            return oldest
        if oldest <= after or self._redis.xrange(self.key, str(after), str(after)):
            return None
        return oldest

    def last_id(self) -> StreamId | None:
        """The newest entry's id (None: the stream is empty or missing)."""
        newest = cast("list[tuple[bytes, Any]]", self._redis.xrevrange(self.key, count=1))
        return StreamId.parse(newest[0][0]) if newest else None

    def close(self) -> None:
        self._redis.close()
        self._reader.close()


def _payload(fields: dict[bytes, bytes]) -> bytes | BadEntry:
    """An entry's tokens, checked against its CRC; BadEntry naming what is wrong."""
    if fields.get(b"v") != FORMAT:
        return BadEntry(f"unknown entry format {fields.get(b'v')!r} (this build reads {FORMAT!r})")
    payload = fields.get(b"tokens")
    if payload is None or len(payload) % 4:
        return BadEntry("entry has no tokens or a length that is not a multiple of 4")
    crc = fields.get(b"crc", b"")
    if not crc.isdigit() or int(crc) != zlib.crc32(payload):
        return BadEntry(f"entry checksum mismatch (crc field {crc!r})")
    return payload


def decode_tokens(payload: bytes) -> npt.NDArray[np.int32]:
    """An entry's payload as token ids."""
    return np.frombuffer(payload, dtype="<i4").astype(np.int32)
