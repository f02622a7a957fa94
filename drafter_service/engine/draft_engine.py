"""The service's work: deltas in, trees out; finish; ingest. No gRPC here.

A call is planned on the event loop, where the request table is updated at once; the
drafters catch up when its jobs run (``draft_jobs``), in call order per datastore.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from drafter_service.engine.call_errors import (
    DeadlineExceeded,
    ResourceExhausted,
    Unavailable,
)
from drafter_service.engine.calls import DraftAnswer, DraftCall, Finished
from drafter_service.engine.catalog import Catalog
from drafter_service.engine.draft_jobs import (
    CallExpired,
    DrafterJob,
    JobOutcome,
    JobRunner,
    RequestsDropped,
)
from drafter_service.engine.ingest_queue import GenerationIngester
from drafter_service.engine.request_table import HeldRequest, RequestTable
from drafter_service.live.live_datastore import DatastoreFull, LiveDatastore
from drafter_service.replication.shared_log import LogError

Place = tuple[str, int]  # (datastore, row in its batch)
Jobs = defaultdict[str, DrafterJob]  # a call's, by datastore
HOPELESS = 2.0  # a call is refused at once when the queued work is this many times its time


class EngineMetrics(Protocol):
    """What the engine reports, as a protocol: the service's Prometheus collector
    (``drafter_service.metrics.drafter_metrics.DrafterMetrics``) is one, and the engine
    needs nothing of Prometheus."""

    def count_resync(self, reason: str, n: int = 1) -> None: ...

    def record_trees(
        self, datastore: str, offsets: npt.NDArray[np.int64], job_seconds: float
    ) -> None: ...


class DraftEngine:
    """Request state and drafting over a catalog of datastores. Use from one event loop.

    Refused: calls beyond ``max_inflight_calls`` whose work has not finished (queued or
    running, their caller gone or not), and Draft calls that would wait behind more than
    ``max_queue_s`` of measured queued work or past their deadline. ``inline_max_work``:
    see :class:`~drafter_service.engine.draft_jobs.JobRunner`. ``clients_apart``: the
    recent tier keeps each client's requests in flight to that client's (stored
    generations stay shared).
    """

    def __init__(
        self,
        catalog: Catalog,
        table: RequestTable,
        ingester: GenerationIngester,
        max_inflight_calls: int,
        metrics: EngineMetrics,
        inline_max_work: int = 0,
        finish_durable: bool = False,
        max_queue_s: float = 0.25,
        clients_apart: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.catalog = catalog
        self.finish_durable = finish_durable  # every Finish waits for durability
        self.table = table
        self.ingester = ingester
        self.max_inflight_calls = max_inflight_calls
        self.max_queue_s = max_queue_s  # drafting work queued ahead of a call, at most
        self.clock = clock  # what call deadlines are read against (monotonic seconds)
        self.metrics = metrics
        self.inflight_calls = 0  # calls admitted whose work has not finished (queued or running)
        # With clients_apart: a recent-tier group per client name (1, 2, ...); else all 0.
        self._groups: dict[str, int] | None = {} if clients_apart else None
        self._runner = JobRunner(catalog, inline_max_work)
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-rpc")

    async def draft(self, call: DraftCall, deadline_s: float | None = None) -> DraftAnswer:
        """Applies each request's delta and drafts; RESYNC where the state is not the
        one the client assumed. A call that could not be answered by ``deadline_s`` (by
        ``clock``) is refused unchanged (DEADLINE_EXCEEDED); one whose turn comes after
        it does nothing (its requests answer RESYNC next)."""
        self._admit_work(deadline_s)
        self._admit()
        try:
            now = self.table.clock()
            jobs: Jobs = defaultdict(DrafterJob)
            self._stop_all(self.table.expire(now), jobs)
            self._check_state_bytes(call)
            group = self._group(call.client)
            planned = [self._plan(call, i, now, jobs, group) for i in range(len(call.request_ids))]
            self._stop_all(self.table.trim(keep=call.request_ids), jobs)
            for job in jobs.values():  # its rows index the call's columns
                job.tokens, job.offsets = call.tokens, call.offsets
                job.deadline_s, job.clock = deadline_s, self.clock
            future = self._runner.run(jobs, functools.partial(self._settled, jobs))
        except BaseException:
            self._release()
            raise
        try:
            batches = await future
        except RuntimeError as exc:
            if isinstance(exc.__cause__, CallExpired):
                raise DeadlineExceeded(
                    "the call's deadline passed before its turn on the drafting thread: "
                    "nothing was drafted or changed; its requests answer RESYNC"
                ) from None
            if isinstance(exc.__cause__, RequestsDropped):  # every request starts over
                n = len(call.request_ids)
                self.metrics.count_resync("unknown", n)
                return DraftAnswer([0] * n, [None] * n, {})
            raise
        drafted = {name: batch for name, batch in batches.items() if batch is not None}
        for name, batch in drafted.items():
            self.metrics.record_trees(name, batch.offsets, jobs[name].seconds)
        return DraftAnswer([length for _, length in planned], [p for p, _ in planned], drafted)

    def _group(self, client: str) -> int:
        """``client``'s recent-tier group: 0 (seen by all) unless clients are kept apart."""
        if self._groups is None or not client:
            return 0
        return self._groups.setdefault(client, len(self._groups) + 1)

    def _plan(
        self,
        call: DraftCall,
        i: int,
        now: float,
        jobs: Jobs,
        group: int,
    ) -> tuple[Place | None, int]:
        request_id = call.request_ids[i]
        state = self.table.get(request_id)
        if call.known_lengths[i] == 0:  # (re)start: the tokens are the whole context
            if state is not None:
                jobs[state.datastore].stops.append(request_id)
            name, tokens = call.datastores[i], call.new_tokens(i)
            state, reserved = self.table.start(
                request_id, name, len(tokens), call.prompt_lengths[i], now
            )
            shared = not (call.private and call.private[i])
            jobs[name].starts.append((request_id, tokens, shared, group))
            row = -1  # its tokens are in the start
        elif state is None or state.length != call.known_lengths[i]:  # the client's view is stale
            self.metrics.count_resync("unknown" if state is None else "length_mismatch")
            if state is not None:
                self.table.pop(request_id)
                jobs[state.datastore].stops.append(request_id)
            return None, 0
        else:
            reserved = self.table.append(request_id, call.offsets[i + 1] - call.offsets[i], now)
            row = i
        job = jobs[state.datastore]
        job.states.append((state, reserved))
        return (state.datastore, job.add(request_id, row, call.budgets[i])), state.length

    async def finish(
        self, items: Sequence[Finished], wait_durable: bool = False
    ) -> tuple[int, list[str], int]:
        """Frees the requests and queues finished generations for storing. Returns how
        many were queued, the ids not held, and how many of the queued are durable (in
        the ingest log): with ``wait_durable``, all that were stored (awaited), else 0."""
        self._admit()
        tickets: list[concurrent.futures.Future[bool]] = []
        try:
            jobs: Jobs = defaultdict(DrafterJob)
            self._stop_all(self.table.expire(self.table.clock()), jobs)
            unknown: list[str] = []
            stores: list[tuple[str, LiveDatastore, Finished, int]] = []
            for item in items:
                state = self.table.pop(item.request_id)
                if state is None:
                    unknown.append(item.request_id)
                    continue
                job = jobs[state.datastore]
                job.stops.append(item.request_id)
                live = self.catalog.slots[state.datastore].live
                generated = state.length + len(item.final_tokens) - state.prompt_length
                if item.store and live is not None and generated:
                    job.collect.append(item.request_id)  # its tokens, read before the stop
                    stores.append((state.datastore, live, item, state.prompt_length))

            def settled(results: dict[str, JobOutcome]) -> None:
                # Queued once the tokens are read, whether or not the caller still waits.
                self._settled(jobs, results)
                for name, live, item, prompt_length in stores:
                    held = jobs[name].collected.get(item.request_id)
                    if held is None:
                        continue
                    ticket = self.ingester.offer(live, [held, item.final_tokens], prompt_length)
                    if ticket is not None:
                        tickets.append(ticket)

            future = self._runner.run(jobs, settled)
        except BaseException:
            self._release()
            raise
        await future
        if not (wait_durable or self.finish_durable) or not tickets:
            return len(tickets), unknown, 0
        # Once queued, a generation is stored whether or not this caller still waits.
        stored = await asyncio.shield(asyncio.gather(*map(asyncio.wrap_future, tickets)))
        return len(tickets), unknown, sum(stored)

    async def ingest(
        self, datastore: str, sequences: list[npt.NDArray[np.int32]]
    ) -> tuple[int, int]:
        """Stores ``sequences`` durably; returns (accepted, ingest-log position)."""
        live = self.catalog.slots[datastore].live
        assert live is not None, "parse_ingest_request admits live datastores only"
        self._admit()
        try:
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(self._io, _ingest_all, live, datastore, sequences)
        except BaseException:
            self._release()
            raise
        future.add_done_callback(self._release)
        future.add_done_callback(_retrieve)
        return await asyncio.shield(future)  # once started, an ingest completes

    def expire_idle(self) -> None:
        """Drops request states idle past the TTL (also done at every call)."""
        jobs: Jobs = defaultdict(DrafterJob)
        self._stop_all(self.table.expire(self.table.clock()), jobs)
        if jobs:
            self.inflight_calls += 1  # released when settled, like a call's
            settled = self._runner.run(jobs, functools.partial(self._settled, jobs))
            settled.add_done_callback(_retrieve)

    async def close(self) -> None:
        """Waits for the work in flight, then stores the queued generations."""
        await self._runner.wait_idle()
        await asyncio.to_thread(self._io.shutdown, True)
        await asyncio.to_thread(self.ingester.close)

    # -- internals ---------------------------------------------------------------------

    def _admit_work(self, deadline_s: float | None) -> None:
        """Refuses a call that would wait behind more than ``max_queue_s`` of queued work
        (RESOURCE_EXHAUSTED) or past its deadline (DEADLINE_EXCEEDED), so that under
        overload the queue drains within ``max_queue_s`` and holds only answerable work.
        A call that finds nothing queued is always taken."""
        if deadline_s is not None and deadline_s <= self.clock():
            raise DeadlineExceeded("the call's deadline passed before it arrived: not started")
        wait = self._runner.expected_wait_s()
        if not wait:
            return
        # Refused only when clearly hopeless (the estimate is rough): a call that might
        # make it is taken, and skipped at its turn if its deadline has passed by then.
        if deadline_s is not None and wait > HOPELESS * (left := deadline_s - self.clock()):
            raise DeadlineExceeded(
                f"~{wait * 1e3:.1f} ms of drafting work is queued ahead of this call, past "
                f"its deadline ({left * 1e3:.1f} ms left): not started"
            )
        if wait > self.max_queue_s:
            raise ResourceExhausted(
                f"~{wait * 1e3:.0f} ms of drafting work queued, over max_queue_ms "
                f"({self.max_queue_s * 1e3:.0f}); retry later"
            )

    def check_admission(self, deadline_s: float | None = None) -> None:
        """Raises what :meth:`draft` would refuse a call with for the load alone: the gRPC
        edge asks before it parses a message, so a refusal under overload costs no parsing."""
        self._admit_work(deadline_s)
        if self.inflight_calls >= self.max_inflight_calls:
            self._admit()  # raises

    def _admit(self) -> None:
        if self.inflight_calls >= self.max_inflight_calls:
            raise ResourceExhausted(
                f"{self.inflight_calls} calls in flight: at max_inflight_calls "
                f"({self.max_inflight_calls}); retry later"
            )
        self.inflight_calls += 1

    def _check_state_bytes(self, call: DraftCall) -> None:
        """Refuses a call whose own requests may hold more than the whole byte budget once
        its native work has run (at the bound of what they can cost before they are
        measured): evicting every other request would not make room. A call that fits
        evicts the least recently used other states instead (``trim``)."""
        table, cost = self.table, self.table.cost
        n = len(call.request_ids)
        if table.bytes + cost.worst(len(call.tokens)) + n * cost.fixed <= table.max_bytes:
            return  # the usual case: everything held plus this call fits (no per-request loop)
        need = 0
        for i, request_id in enumerate(call.request_ids):
            state, known = table.get(request_id), call.known_lengths[i]
            added = len(call.new_tokens(i))
            if known and state is not None and state.length == known:
                need += state.bytes + table.growth(state, added)
            else:
                need += cost.worst(added)
        if need > table.max_bytes:
            raise ResourceExhausted(
                f"this call's {n} requests may hold {need} bytes of request state (at most "
                f"{cost.worst(1) - cost.fixed} bytes a context token before it is measured), "
                f"over the budget of {table.max_bytes} bytes (--max-request-state-bytes); "
                "send fewer or shorter requests per call"
            )

    def _release(self, _: object = None) -> None:
        self.inflight_calls -= 1

    def _settled(self, jobs: dict[str, DrafterJob], results: dict[str, JobOutcome]) -> None:
        """A call's jobs have all run: end its admission, count what each request's state
        holds, forget requests whose job failed (it stopped them: they answer RESYNC)."""
        self._release()
        table = self.table
        for name, result in results.items():
            rows = zip(jobs[name].request_ids, jobs[name].states, strict=True)
            if isinstance(result, BaseException):
                # Only the states this call planned: a later call may have restarted
                # one of its requests meanwhile, and that state is the later call's.
                for request_id, (state, _) in rows:
                    if table.get(request_id) is state:
                        table.pop(request_id)
            elif result is not None:
                held, headroom = result.state_bytes.tolist(), result.state_headroom.tolist()
                for (request_id, (state, reserved)), b, h in zip(rows, held, headroom, strict=True):
                    table.measured(request_id, state, reserved, b, h)

    def _stop_all(self, states: Iterable[tuple[str, HeldRequest]], jobs: Jobs) -> None:
        for request_id, state in states:
            jobs[state.datastore].stops.append(request_id)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Marks an outcome nobody awaits as read (no 'exception never retrieved' noise)."""
    if not future.cancelled():
        future.exception()


def _ingest_all(
    live: LiveDatastore, name: str, sequences: list[npt.NDArray[np.int32]]
) -> tuple[int, int]:
    position = live.stats().wal_position
    for i, tokens in enumerate(sequences):
        try:
            position = live.ingest(tokens)
        except DatastoreFull as exc:
            raise ResourceExhausted(
                f"datastore {name!r} is full after {i} of {len(sequences)} sequences "
                f"(those are stored): {exc}"
            ) from None
        except (LogError, OSError) as exc:  # OSError: EIO, EROFS...: the volume cannot take it
            failed = "the shared ingest log did not take"
            if not isinstance(exc, LogError):
                failed = "its ingest log could not store"
            raise Unavailable(
                f"datastore {name!r}: {failed} sequence {i} of {len(sequences)} "
                f"(the ones before are stored; retry the rest): {exc}"
            ) from None
    return len(sequences), position
