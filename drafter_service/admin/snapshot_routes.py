"""Snapshots of a live datastore: create (a job), list, show, restore (a job), delete."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import Path, Request, Response
from fastapi.responses import FileResponse

from drafter_service.admin import routes
from drafter_service.admin.http_errors import conflict, not_found
from drafter_service.admin.schemas import (
    NAME_PATTERN,
    JobInfo,
    SnapshotCreate,
    SnapshotDetail,
    SnapshotFile,
    SnapshotFiles,
    SnapshotList,
    SnapshotSummary,
)
from drafter_service.live.live_datastore import (
    CORPORA_KEY,
    LOG_OFFSET_KEY,
    PINNED_KEY,
    LiveDatastore,
)
from drafter_service.replication.replicated_datastore import ReplicatedDatastore
from drafter_service.snapshot.store import SnapshotError, SnapshotInfo

SnapshotName = Annotated[str, Path(pattern=NAME_PATTERN, description="snapshot name")]
FileName = Annotated[
    str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", description="file of the snapshot")
]
router = routes.v1_router("snapshots")


@router.get("/datastores/{name}/snapshots")
async def list_snapshots(request: Request, name: routes.DatastoreName) -> SnapshotList:
    live = routes.context(request).live(name)
    infos = await asyncio.to_thread(live.snapshots)
    return SnapshotList(snapshots=[_summary(i, i is infos[-1]) for i in infos])


@router.post(
    "/datastores/{name}/snapshots",
    status_code=202,
    summary="write a snapshot (a job; see /v1/jobs/{job_id})",
)
async def create_snapshot(
    request: Request,
    response: Response,
    name: routes.DatastoreName,
    body: SnapshotCreate | None = None,
) -> JobInfo:
    live = routes.context(request).live(name)
    body = body or SnapshotCreate()
    wanted = body.name
    if wanted is not None and wanted in [
        i.path.name for i in await asyncio.to_thread(live.snapshots)
    ]:
        raise conflict(f"snapshot {wanted!r} already exists")

    def work() -> dict[str, Any]:
        if body.rebuild_first:
            live.rebuild()  # include every ingest acknowledged so far
        info = live.snapshot(wanted, pinned=wanted is not None)
        return {
            "snapshot": info.path.name,
            "wal_position": info.wal_position,
            "num_tokens": info.num_tokens,
        }

    return routes.start_job(request, response, "snapshot", name, work)


@router.get("/datastores/{name}/snapshots/{snapshot}")
async def show_snapshot(
    request: Request, name: routes.DatastoreName, snapshot: SnapshotName
) -> SnapshotDetail:
    info, newest = await _snapshot(routes.context(request).live(name), name, snapshot)
    return SnapshotDetail(
        **_summary(info, newest).model_dump(),
        tokenizer=info.tokenizer.to_json(),
        metadata=info.metadata,
    )


@router.post(
    "/datastores/{name}/snapshots/{snapshot}/restore",
    status_code=202,
    summary="roll the datastore back to a snapshot (a job)",
    description="The snapshot's content (corpora included) replaces the datastore; "
    "drafting goes on during the swap. Ingests acknowledged before the restore that the "
    "snapshot does not hold are discarded (also from the log); the restored state is "
    "written as a new snapshot so that a restart keeps it.",
)
async def restore_snapshot(
    request: Request, response: Response, name: routes.DatastoreName, snapshot: SnapshotName
) -> JobInfo:
    live = routes.context(request).live(name)
    await _snapshot(live, name, snapshot)  # 404 for a snapshot it does not have
    if isinstance(live, ReplicatedDatastore):
        raise conflict(
            "restore is refused while the datastore follows a shared ingest stream: a "
            "rollback on one replica would make it differ from the others"
        )

    def work() -> dict[str, Any]:
        info = live.restore(snapshot)
        return {
            "restored": snapshot,
            "snapshot": info.path.name,
            "discarded_through": info.wal_position,
            "num_tokens": info.num_tokens,
        }

    return routes.start_job(request, response, "restore", name, work)


@router.get(
    "/datastores/{name}/snapshots/{snapshot}/files",
    summary="the files of a snapshot (what a new replica downloads; needs the token)",
)
async def list_snapshot_files(
    request: Request, name: routes.DatastoreName, snapshot: SnapshotName
) -> SnapshotFiles:
    info, _ = await _snapshot(routes.context(request).live(name), name, snapshot)
    files = await asyncio.to_thread(_files, info)
    return SnapshotFiles(files=[SnapshotFile(name=n, bytes=size) for n, size in files.items()])


@router.get(
    "/datastores/{name}/snapshots/{snapshot}/files/{file}",
    response_class=FileResponse,
    summary="one file of a snapshot, as stored (checksums in manifest.json; needs the token)",
)
async def download_snapshot_file(
    request: Request, name: routes.DatastoreName, snapshot: SnapshotName, file: FileName
) -> FileResponse:
    info, _ = await _snapshot(routes.context(request).live(name), name, snapshot)
    files = await asyncio.to_thread(_files, info)
    if file not in files:
        raise not_found(f"snapshot {snapshot!r} has no file {file!r}")
    return FileResponse(info.path / file, media_type="application/octet-stream")


async def _snapshot(live: LiveDatastore, name: str, snapshot: str) -> tuple[SnapshotInfo, bool]:
    """The snapshot named ``snapshot`` and whether it is the newest; 404 if there is none."""
    infos = await asyncio.to_thread(live.snapshots)
    for info in infos:
        if info.path.name == snapshot:
            return info, info is infos[-1]
    raise not_found(_missing(name, snapshot))


def _missing(name: str, snapshot: str) -> str:
    return f"datastore {name!r} has no snapshot {snapshot!r}"


def _files(info: SnapshotInfo) -> dict[str, int]:
    """The regular files of a snapshot directory and their sizes (an open file handle
    keeps a file readable even if rotation deletes the snapshot during a download)."""
    return {p.name: p.stat().st_size for p in sorted(info.path.iterdir()) if p.is_file()}


@router.delete("/datastores/{name}/snapshots/{snapshot}", status_code=204)
async def delete_snapshot(
    request: Request, name: routes.DatastoreName, snapshot: SnapshotName
) -> None:
    live = routes.context(request).live(name)
    try:
        await asyncio.to_thread(live.delete_snapshot, snapshot)
    except KeyError:
        raise not_found(_missing(name, snapshot)) from None
    except SnapshotError as exc:  # the newest snapshot: a restart needs it
        raise conflict(str(exc)) from None


def _summary(info: SnapshotInfo, newest: bool) -> SnapshotSummary:
    listed, offset = info.metadata.get(CORPORA_KEY), info.metadata.get(LOG_OFFSET_KEY)
    corpora = [
        str(c["name"])
        for c in (listed if isinstance(listed, list) else [])
        if isinstance(c, dict) and "name" in c
    ]
    return SnapshotSummary(
        name=info.path.name,
        created_unix=info.created_unix,
        wal_position=info.wal_position,
        num_tokens=info.num_tokens,
        sub_indices=len(info.sub_indices),
        log_offset=offset if isinstance(offset, str) else None,
        pinned=bool(info.metadata.get(PINNED_KEY)),
        corpora=corpora,
        newest=newest,
    )
