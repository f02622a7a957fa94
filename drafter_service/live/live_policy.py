"""The live datastore's policy: when to rebuild, rotate and snapshot, what a finished
generation stores, and the memory bound (:class:`DatastoreFull` when it refuses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from drafter_service.datastore.sub_indices import MAX_SUB_INDEX_TOKENS

LIVE_SETTINGS = (
    "rebuild_min_tokens",
    "rebuild_interval_s",
    "rebuild_max_share",
    "snapshot_interval_s",
    "keep_snapshots",
)
"""Fields ``update_policy`` may change while serving: only *when* maintenance runs."""


MIN_REBUILD_GAP_S = 1.0
"""The shortest time between two rebuilds that ``rebuild_max_share`` brings forward."""

REBUILD_TOKENS_PER_S = 5_000_000.0
"""Rebuild speed (tokens re-sorted a second) assumed until one is measured; the SA build
runs at about 7M/s on one core of the benchmark host."""


class DatastoreFull(RuntimeError):
    """An ingest was refused because it would exceed the memory bound."""


@dataclass(frozen=True, slots=True)
class LivePolicy:
    """When to rebuild, rotate and snapshot, and what a finished generation stores."""

    max_sub_indices: int = 8
    """Sub-indices kept; past this the oldest is dropped."""
    max_sub_index_tokens: int = 512_000_000
    """Text positions per sub-index; a full one is left as is and a new one started."""
    rebuild_min_tokens: int = 1_000_000
    """Rebuild once this many tokens are waiting..."""
    rebuild_interval_s: float = 60.0
    """...or once this long has passed since the last rebuild with anything waiting..."""
    rebuild_max_share: float = 0.01
    """...or sooner while cheap: once the time since the last is at least the next one's
    expected duration over this share (and :data:`MIN_REBUILD_GAP_S`), so early rebuilds
    take about this share of a core: a small datastore learns within seconds, a large one
    waits up to ``rebuild_interval_s``. 0: only the two rules above."""
    snapshot_interval_s: float = 900.0
    """Write a snapshot this often when the datastore changed (0 = only on request)."""
    keep_snapshots: int = 2
    """Complete snapshots kept on disk (newest first)."""
    max_resident_bytes: int | None = None
    """Bound on accounted bytes (8 per token): the oldest sub-indices are dropped to stay
    under it, and an ingest that cannot fit is refused."""
    store: Literal["output", "prompt+output"] = "output"
    """What :meth:`LiveDatastore.ingest_generation` stores."""
    prompt_context_tokens: int = 3
    """With ``store="output"``, trailing prompt tokens kept so an answer's start matches."""

    def __post_init__(self) -> None:
        checks = {
            "max_sub_indices": self.max_sub_indices >= 1,
            "max_sub_index_tokens": 1 <= self.max_sub_index_tokens <= MAX_SUB_INDEX_TOKENS,
            "rebuild_min_tokens": self.rebuild_min_tokens >= 1,
            "rebuild_interval_s": self.rebuild_interval_s > 0,
            "rebuild_max_share": 0 <= self.rebuild_max_share < 1,
            "snapshot_interval_s": self.snapshot_interval_s >= 0,
            "keep_snapshots": self.keep_snapshots >= 1,
            "max_resident_bytes": self.max_resident_bytes is None or self.max_resident_bytes > 0,
            "store": self.store in ("output", "prompt+output"),
            "prompt_context_tokens": self.prompt_context_tokens >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"LivePolicy.{name} = {getattr(self, name)!r} is out of range")
