"""Admin jobs (snapshot, rebuild, corpus add), run one at a time on a worker thread so a
long build never blocks the event loop that serves gRPC; the newest ``MAX_JOBS`` kept."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from drafter_service.admin.http_errors import AdminError
from drafter_service.admin.schemas import JobInfo

log = logging.getLogger(__name__)

MAX_JOBS = 256


class AdminJobs:
    """Runs jobs in submission order, one at a time, each on a worker thread."""

    def __init__(self) -> None:
        self.by_id: dict[str, JobInfo] = {}  # in submission order; changed on the event loop
        self._ids = itertools.count(1)
        self._turn = asyncio.Lock()  # taken in submission order: one job at a time
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def submit(self, kind: str, datastore: str, work: Callable[[], dict[str, Any]]) -> JobInfo:
        """Queues ``work`` (blocking; returns the job's result) and returns its job."""
        if self._closed:
            raise AdminError(503, "shutting_down", "the service is shutting down")
        job = JobInfo(
            id=f"job-{next(self._ids):06d}",
            kind=kind,
            datastore=datastore,
            state="queued",
            created_unix=time.time(),
            started_unix=None,
            finished_unix=None,
            result=None,
            error=None,
        )
        self.by_id[job.id] = job
        finished = [j.id for j in self.by_id.values() if j.state in ("succeeded", "failed")]
        for old in finished[: max(0, len(self.by_id) - MAX_JOBS)]:  # the oldest finished
            del self.by_id[old]
        task = asyncio.get_running_loop().create_task(self._run(job, work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def _run(self, job: JobInfo, work: Callable[[], dict[str, Any]]) -> None:
        try:
            async with self._turn:
                if self._closed:  # still queued when close was called
                    raise asyncio.CancelledError
                job.state, job.started_unix = "running", time.time()
                job.result = await asyncio.to_thread(work)
            job.state = "succeeded"
        except asyncio.CancelledError:
            job.state, job.error = "failed", "cancelled at shutdown"
        except AdminError as exc:
            job.state, job.error = "failed", exc.detail
        except Exception as exc:  # reported in the job's status, never raised
            log.warning("admin job %s (%s) failed: %s", job.id, job.kind, exc)
            job.state, job.error = "failed", f"{type(exc).__name__}: {exc}"
        job.finished_unix = time.time()

    async def close(self) -> None:
        """Refuses new jobs, drops queued ones, waits for the running one."""
        self._closed = True
        await asyncio.gather(*self._tasks, return_exceptions=True)
