"""Probes, datastore stats, live settings and jobs, and what every route module shares."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response, Security
from fastapi.security import HTTPBearer

from drafter_service.admin.admin_jobs import AdminJobs
from drafter_service.admin.http_errors import AdminError, conflict, not_found
from drafter_service.admin.schemas import (
    ContentDigest,
    DatastoreDetail,
    DatastoreList,
    DatastoreSummary,
    Health,
    JobInfo,
    JobList,
    LiveDetail,
    Settings,
    SettingsPatch,
    SharedLogDetail,
)
from drafter_service.engine.catalog import Catalog, DatastoreSlot
from drafter_service.live.live_datastore import LiveDatastore
from drafter_service.live.live_stats import LiveStats
from drafter_service.replication.replicated_datastore import ReplicatedDatastore
from drafter_service.service.grpc_server import Phase
from drafter_service.service.setting_values import DATASTORE_NAME
from drafter_service.service.settings import ServeConfig

BEARER = HTTPBearer(auto_error=False, description="the admin token (see --admin-token-file)")
"""Declares the scheme in the OpenAPI schema; ``bearer_auth.BearerAuth`` enforces it."""
DatastoreName = Annotated[
    str, Path(pattern=f"^{DATASTORE_NAME.pattern}$", description="datastore name")
]


@dataclasses.dataclass(frozen=True, slots=True)
class AdminContext:
    """What the routes see of the running service: its settings, its datastores once
    loaded, and the job runner."""

    config: ServeConfig
    catalog: Callable[[], Catalog | None]  # None until the datastores are loaded
    phase: Callable[[], Phase]
    jobs: AdminJobs

    def loaded(self) -> Catalog:
        """The datastores, or 503 while loading or stopping."""
        catalog = self.catalog()
        phase = self.phase()
        if catalog is None or phase != "ok":
            raise AdminError(503, "unavailable", f"the datastores are not available ({phase})")
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


def v1_router(*tags: str) -> APIRouter:
    """A router for ``/v1`` routes (tagged ``tags``): every one of them needs the token."""
    return APIRouter(prefix="/v1", tags=list(tags), dependencies=[Security(BEARER)])


probes = APIRouter(tags=["probes"])
v1 = v1_router()


def context(request: Request) -> AdminContext:
    """What the routes see of the service (``create_app`` puts it on the app)."""
    ctx: AdminContext = request.app.state.admin
    return ctx


def start_job(
    request: Request,
    response: Response,
    kind: str,
    datastore: str,
    work: Callable[[], dict[str, Any]],
) -> JobInfo:
    """Queues ``work`` as a job; the 202 answer points at it (``Location``)."""
    job = context(request).jobs.submit(kind, datastore, work)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job


@probes.get("/healthz", summary="the process is alive")
async def healthz(request: Request) -> Health:
    return Health(status=context(request).phase())


@probes.get("/readyz", summary="datastores loaded and serving (503 otherwise)")
async def readyz(request: Request) -> Health:
    context(request).loaded()
    return Health(status="ok")


@v1.get("/datastores", tags=["datastores"])
async def list_datastores(request: Request) -> DatastoreList:
    catalog = context(request).loaded()
    return DatastoreList(datastores=[_summary(s) for _, s in sorted(catalog.slots.items())])


@v1.get("/datastores/{name}", tags=["datastores"])
async def show_datastore(request: Request, name: DatastoreName) -> DatastoreDetail:
    slot = context(request).slot(name)
    live = None
    if slot.live is not None:
        s = slot.live.stats()
        copied = LiveDetail.model_fields.keys() - {"corpora", "shared_log"}
        live = LiveDetail(
            **{field: getattr(s, field) for field in copied},
            corpora=len(slot.live.corpora),
            shared_log=_shared_log(slot.live, s),
        )
    return DatastoreDetail(
        **_summary(slot).model_dump(),
        active_requests=slot.drafter.num_requests,
        live_state=live,
    )


def _shared_log(live: LiveDatastore, s: LiveStats) -> SharedLogDetail | None:
    if not isinstance(live, ReplicatedDatastore):
        return None
    return SharedLogDetail(
        stream=live.shared_log.key,
        consumed_offset=_text(s.consumed_offset),
        covered_offset=_text(s.covered_offset),
        skipped_entries=s.stream_skipped,
        errors=s.stream_errors,
        lost=s.stream_lost,
    )


def _text(value: object) -> str | None:
    return None if value is None else str(value)


@v1.get("/datastores/{name}/digest", tags=["datastores"])
async def content_digest(request: Request, name: DatastoreName) -> ContentDigest:
    """The learned content's hash and stream offsets: compare replicas for convergence."""
    live = context(request).live(name)

    def read() -> ContentDigest:
        s = live.stats()
        return ContentDigest(
            content_sha256=live.content_digest(),
            num_tokens=s.num_tokens,
            pending_tokens=s.pending_tokens,
            consumed_offset=_text(s.consumed_offset),
            covered_offset=_text(s.covered_offset),
        )

    return await asyncio.to_thread(read)


@v1.post(
    "/datastores/{name}/rebuild",
    status_code=202,
    tags=["datastores"],
    summary="fold the waiting ingests into the sub-indices now (a job)",
)
async def rebuild(request: Request, response: Response, name: DatastoreName) -> JobInfo:
    live = context(request).live(name)

    def work() -> dict[str, object]:
        rebuilt = live.rebuild()
        return {"rebuilt": rebuilt, "num_tokens": live.stats().num_tokens}

    return start_job(request, response, "rebuild", name, work)


@v1.get("/datastores/{name}/settings", tags=["settings"])
async def get_settings(request: Request, name: DatastoreName) -> Settings:
    return Settings.model_validate(context(request).live(name).policy, from_attributes=True)


@v1.patch(
    "/datastores/{name}/settings",
    tags=["settings"],
    summary="change the maintenance schedule while serving",
    description="Only settings that are safe live: when rebuilds and snapshots run and how "
    "many snapshots are kept. What a datastore holds (sub-index caps, memory bound), the "
    "drafting knobs (the native drafter's DraftConfig is immutable) and the budget cap "
    "(clients size trees from it) need a restart.",
)
async def patch_settings(request: Request, name: DatastoreName, body: SettingsPatch) -> Settings:
    live = context(request).live(name)
    changes = body.model_dump(exclude_none=True)
    try:
        await asyncio.to_thread(live.update_policy, **changes)
    except ValueError as exc:
        raise AdminError(422, "invalid_setting", str(exc)) from None
    return Settings.model_validate(live.policy, from_attributes=True)


@v1.get("/jobs", tags=["jobs"])
async def list_jobs(request: Request) -> JobList:
    return JobList(jobs=list(context(request).jobs.by_id.values()))


@v1.get("/jobs/{job_id}", tags=["jobs"])
async def show_job(
    request: Request, job_id: Annotated[str, Path(pattern=r"^job-[0-9]{1,12}$")]
) -> JobInfo:
    job = context(request).jobs.by_id.get(job_id)
    if job is None:
        raise not_found(f"no job {job_id!r}")
    return job


def _summary(slot: DatastoreSlot) -> DatastoreSummary:
    stats = dataclasses.asdict(slot.stats())
    return DatastoreSummary(name=slot.name, live=slot.live is not None, **stats)
