"""Positions in the shared ingest stream (Redis stream entry ids): ``<ms>-<seq>``, two
u64 assigned in increasing order; the ingest log and snapshots record them, so a replica
knows exactly where to resume.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_ID = re.compile(r"^(\d{1,20})-(\d{1,20})$")
_U64 = 2**64


class StreamId(NamedTuple):
    """An entry id; ordered as the stream orders its entries."""

    ms: int
    seq: int

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"

    @classmethod
    def parse(cls, text: str | bytes) -> StreamId:
        """``"<ms>-<seq>"`` as a StreamId; ValueError naming the text otherwise."""
        raw = text.decode("ascii", "replace") if isinstance(text, bytes) else text
        match = _ID.match(raw)
        if match is None or int(match[1]) >= _U64 or int(match[2]) >= _U64:
            raise ValueError(f"not a stream entry id: {raw!r} (expected '<ms>-<seq>')")
        return cls(int(match[1]), int(match[2]))

    @classmethod
    def parse_optional(cls, value: object) -> StreamId | None:
        """A snapshot's recorded id (None when it records none); ValueError if malformed."""
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(f"not a stream entry id: {value!r}")
        return cls.parse(value)
