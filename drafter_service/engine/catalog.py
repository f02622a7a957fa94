"""The service's datastores by name, each with its own Drafter (request state) and the
one worker thread its calls run on. Opened by ``drafter_service.service.open_catalog``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from drafter_service.drafting.drafter import Drafter
from drafter_service.live.live_datastore import LiveDatastore
from drafter_service.snapshot.store import TokenizerIdentity


@dataclass(frozen=True, slots=True)
class DatastoreStats:
    num_tokens: int  # text positions (tokens plus document separators)
    sub_indices: int
    resident_bytes: int


@dataclass(frozen=True, slots=True)
class DatastoreSlot:
    """One datastore and the drafter that holds the state of the requests using it."""

    name: str
    drafter: Drafter
    live: LiveDatastore | None  # None: read-only
    executor: ThreadPoolExecutor  # one worker: this drafter's calls run in call order

    def stats(self) -> DatastoreStats:
        if self.live is not None:
            s = self.live.stats()
            return DatastoreStats(s.num_tokens, s.sub_indices, s.resident_bytes)
        ds = self.drafter.datastore
        return DatastoreStats(ds.num_tokens, len(ds.sub_indices), ds.resident_bytes)


@dataclass(frozen=True, slots=True)
class Catalog:
    """Every datastore of the service, by name (the default one is live)."""

    tokenizer: TokenizerIdentity
    slots: dict[str, DatastoreSlot]

    def close(self) -> None:
        """Waits for queued drafting work, then closes the live datastore (its waiting
        documents stay in the ingest log)."""
        for slot in self.slots.values():
            slot.executor.shutdown(wait=True)
        for slot in self.slots.values():
            if slot.live is not None:
                slot.live.close()
