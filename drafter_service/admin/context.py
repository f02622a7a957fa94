"""What the admin routes see of the running service: its settings, its datastores once
loaded, and the job runner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from drafter_service.admin.admin_jobs import AdminJobs
from drafter_service.admin.http_errors import conflict, not_found, unavailable
from drafter_service.engine.catalog import Catalog, DatastoreSlot
from drafter_service.live.live_datastore import LiveDatastore
from drafter_service.service.grpc_server import Phase
from drafter_service.service.settings import ServeConfig


@dataclass(frozen=True, slots=True)
class AdminContext:
    config: ServeConfig
    catalog: Callable[[], Catalog | None]  # None until the datastores are loaded
    phase: Callable[[], Phase]
    jobs: AdminJobs

    def loaded(self) -> Catalog:
        """The datastores, or 503 while loading or stopping."""
        catalog = self.catalog()
        phase = self.phase()
        if catalog is None or phase != "ok":
            raise unavailable(f"the datastores are not available ({phase})")
        return catalog

    def slot(self, name: str) -> DatastoreSlot:
        slot = self.loaded().slots.get(name)
        if slot is None:
            raise not_found(f"no datastore {name!r}")
        return slot

    def live(self, name: str) -> LiveDatastore:
        """The live datastore ``name``; 409 for a read-only one."""
        slot = self.slot(name)
        if slot.live is None:
            raise conflict(
                f"datastore {name!r} is read-only (a --datastore snapshot): snapshots, "
                "rebuilds, corpora and settings apply to live datastores"
            )
        return slot.live
