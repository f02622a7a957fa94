"""The service's work: deltas in, trees out; finish; ingest. No gRPC here.

A call is planned on the event loop: the request table says what each request needs
(a start, an append, or a RESYNC) and is updated at once; the drafters catch up when
the call's jobs run (see ``jobs``), in call order per datastore, so the table always
describes the drafters once every queued job has run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from drafter_service.drafting.drafter import DraftBatch, Drafter, DraftTree
from drafter_service.drafting.predraft import Predraft, predraft_batch
from drafter_service.live.live_datastore import DatastoreFull, LiveDatastore
from drafter_service.live.shared_log import LogError
from drafter_service.service.call_errors import ResourceExhausted, Unavailable
from drafter_service.service.catalog import Catalog
from drafter_service.service.draft_jobs import DrafterJob, JobOutcome, JobRunner, jobs_for
from drafter_service.service.drafter_metrics import DrafterMetrics
from drafter_service.service.ingest_queue import GenerationIngester
from drafter_service.service.prefetch import RequestTrees, prefetch_response, resolve_prefetched
from drafter_service.service.request_table import (
    STATE_BYTES_PER_TOKEN,
    RequestState,
    RequestTable,
)
from drafter_service.service.responses import DraftAnswer
from drafter_service.service.validation import CallLimits, DraftCall, Finished
from sssd.drafter.v1 import drafter_pb2 as pb

_NO_TOKENS = np.zeros(0, dtype=np.int32)
Place = tuple[str, int]  # (datastore, row in its batch)
log = logging.getLogger(__name__)
PREDRAFT_CHUNK_REQUESTS = 8
"""Requests pre-drafted per worker-thread task: the most a next step can wait behind
pre-drafting (about 8 x 0.2-0.4 ms at fan-out 4-8 on the benchmark machine)."""


class _PredraftRow(NamedTuple):
    """A request of the step to pre-draft: its state and tree as they were then."""

    request_id: str  # as the engine knows it (namespaced)
    client_id: str  # as the client knows it
    state: RequestState
    trees: RequestTrees
    tree: DraftTree
    budget: int

    def unchanged(self, table: RequestTable) -> bool:
        """No call replaced the request or its tree since."""
        return table.get(self.request_id) is self.state and self.state.trees is self.trees


@dataclass(slots=True)
class Prefetch:
    """A step's pre-drafts, computed: the response to send, and what each request keeps
    once it is sent (:meth:`DraftEngine.keep_predrafts`)."""

    response: pb.DraftResponse
    kept: list[tuple[_PredraftRow, list[Predraft]]]


class DraftEngine:
    """Request state and drafting over a catalog of datastores. Use from one event loop.

    ``max_inflight_calls`` bounds the calls whose work has not finished (queued or
    running, including those whose caller gave up); beyond it calls are refused.
    Per-batch numbers go to ``metrics`` (a private one when not given). Light calls
    run their native work on the loop thread when nothing else is queued
    (``inline_max_work``, see :class:`~drafter_service.service.draft_jobs.JobRunner`).
    """

    def __init__(
        self,
        catalog: Catalog,
        limits: CallLimits,
        table: RequestTable,
        ingester: GenerationIngester,
        max_inflight_calls: int,
        metrics: DrafterMetrics | None = None,
        inline_max_work: int = 0,
        finish_durable: bool = False,
        prefetch_max_bytes: int = 1 << 20,
    ) -> None:
        self.catalog = catalog
        self.finish_durable = finish_durable  # every Finish waits for durability
        self.prefetch_max_bytes = prefetch_max_bytes  # pre-draft trees sent per step
        self.limits = limits
        self.table = table
        self.ingester = ingester
        self.max_inflight_calls = max_inflight_calls
        self.metrics = DrafterMetrics() if metrics is None else metrics
        self._inflight = 0
        self._planned_calls = 0  # Draft calls planned so far
        self._runner = JobRunner(catalog, inline_max_work)
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-rpc")

    async def draft(self, call: DraftCall) -> DraftAnswer:
        """Applies each request's delta and drafts; RESYNC where the state is not the
        one the client assumed."""
        self._admit()
        self._planned_calls += 1  # pending pre-drafting gives way (read by worker threads)
        try:
            now = time.monotonic()
            jobs: dict[str, DrafterJob] = {}
            self._stop_all(self.table.expire(now), jobs)
            self._check_state_bytes(call)
            places: list[Place | None] = []
            lengths: list[int] = []
            taken: dict[int, DraftTree | None] = {}  # prefetched rows: the pre-draft used
            for i in range(len(call.request_ids)):
                place, length = self._plan(call, i, now, jobs, taken)
                places.append(place)
                lengths.append(length)
            self._stop_all(self.table.trim(keep=call.request_ids), jobs)
            future = self._runner.run(jobs, lambda results: self._settled(jobs, results))
        except BaseException:
            self._release()
            raise
        batches = await future
        for name, batch in batches.items():
            if batch is not None:
                self.metrics.record_trees(name, batch.offsets, jobs[name].seconds)
        trees: list[tuple[DraftBatch, int] | None] = []
        for place in places:
            batch = batches[place[0]] if place is not None else None
            trees.append((batch, place[1]) if batch is not None and place is not None else None)
        self._remember_trees(call, trees, taken)
        return DraftAnswer(call.request_ids, lengths, trees)

    def _remember_trees(
        self,
        call: DraftCall,
        trees: list[tuple[DraftBatch, int] | None],
        taken: dict[int, DraftTree | None],
    ) -> None:
        """Each request's tree from now on: the one answered, or for a prefetched row the
        pre-draft the client took (None: one the service no longer holds). Kept only when
        the call asks for pre-drafts; a plain step skips this loop (trees a request kept
        from an earlier step are never used: a client marks a row prefetched only right
        after a step that sent pre-drafts, and that step set its tree)."""
        if not call.prefetch_fan_out or not self.prefetch_max_bytes:
            return
        for i, request_id in enumerate(call.request_ids):
            state = self.table.get(request_id)
            if state is None:
                continue
            if i in taken:
                state.trees = RequestTrees(taken[i])
            elif trees[i] is not None:
                batch, row = trees[i]  # type: ignore[misc]
                state.trees = RequestTrees(batch.tree(row))

    async def predraft(
        self, call: DraftCall, step: int, client_ids: list[str]
    ) -> Prefetch | None:
        """Pre-drafts for the outcomes of the trees ``call``'s requests now draft from
        (after its answer was sent; ``client_ids``: the ids as the client knows them). On
        each datastore's worker thread, after the call's own job; a request that another
        call changed meanwhile is left out. None when there is nothing to send."""
        if not call.prefetch_fan_out or not self.prefetch_max_bytes:
            return None
        started = time.perf_counter()
        groups: dict[str, list[_PredraftRow]] = {}
        for i, request_id in enumerate(call.request_ids):
            state = self.table.get(request_id)
            if state is None or state.trees is None or state.trees.tree is None:
                continue
            groups.setdefault(state.datastore, []).append(_PredraftRow(
                request_id, client_ids[i], state, state.trees, state.trees.tree, call.budgets[i]
            ))  # fmt: skip
        if not groups:
            return None
        loop = asyncio.get_running_loop()
        # In chunks on each datastore's worker thread, after the call's own job: a call
        # planned meanwhile (this stream's next step, or any other worker's) finds at most
        # one chunk ahead of its job, the rest skipped: real steps come first, and
        # pre-drafts overtaken by the next step could not be used anyway.
        planned = self._planned_calls
        futures = []
        for name, rows in groups.items():
            slot = self.catalog.slots[name]
            for lo in range(0, len(rows), PREDRAFT_CHUNK_REQUESTS):
                chunk = rows[lo : lo + PREDRAFT_CHUNK_REQUESTS]
                futures.append(loop.run_in_executor(
                    slot.executor, self._predraft_chunk, planned, slot.drafter,
                    [r.request_id for r in chunk], [r.tree for r in chunk],
                    call.prefetch_fan_out, [r.budget for r in chunk],
                ))  # fmt: skip
        try:
            results = await asyncio.gather(*futures)
        except Exception:  # a request stopped meanwhile (KeyError), say: no pre-drafts
            log.debug("pre-drafting skipped", exc_info=True)
            return None
        if any(r is None for r in results):  # overtaken by the next call
            return None
        every_row = [row for rows in groups.values() for row in rows]
        every_predraft = [pre for chunk in results if chunk is not None for pre in chunk]
        fresh = [
            (row, pre)
            for row, pre in zip(every_row, every_predraft, strict=True)
            if row.unchanged(self.table)
        ]
        response, kept = prefetch_response(
            step, [row.client_id for row, _ in fresh], [pre for _, pre in fresh],
            self.prefetch_max_bytes,
        )
        self.metrics.record_prefetch(
            sum(len(k) for k in kept), response.ByteSize() if response else 0,
            time.perf_counter() - started,
        )
        if response is None:
            return None
        return Prefetch(
            response, [(row, k) for (row, _), k in zip(fresh, kept, strict=True)]
        )

    def _predraft_chunk(
        self,
        planned: int,
        drafter: Drafter,
        request_ids: list[str],
        trees: list[DraftTree],
        fan_out: int,
        budgets: list[int],
    ) -> list[list[Predraft]] | None:
        """One chunk of a step's pre-drafting (a datastore's worker thread); None, at once,
        when another call was planned since the step (its job is queued behind us)."""
        if self._planned_calls != planned:
            return None
        return predraft_batch(drafter, request_ids, trees, fan_out, budgets)

    def keep_predrafts(self, prefetch: Prefetch) -> None:
        """The pre-drafts were sent: each request holds exactly those it was sent, unless
        a call changed it meanwhile."""
        for row, kept in prefetch.kept:
            if row.state.trees is row.trees:
                row.trees.predrafts = {(p.outcome.node, p.outcome.bonus): p.tree for p in kept}

    def _plan(
        self,
        call: DraftCall,
        i: int,
        now: float,
        jobs: dict[str, DrafterJob],
        taken: dict[int, DraftTree | None],
    ) -> tuple[Place | None, int]:
        request_id, budget = call.request_ids[i], call.budgets[i]
        tokens = call.new_tokens(i)
        state = self.table.get(request_id)
        if call.known_lengths[i] == 0:  # (re)start: the tokens are the whole context
            if state is not None:
                jobs_for(jobs, state.datastore).stops.append(request_id)
            name = call.datastores[i]
            # A live datastore stores the generation on finish: keep its tokens (a copy,
            # so the call's message-sized array is not kept alive by one request).
            history = [tokens.copy()] if self.catalog.slots[name].live is not None else None
            state = RequestState(name, len(tokens), call.prompt_lengths[i], history, now)
            self.table.put(request_id, state)
            job = jobs_for(jobs, name)
            job.starts.append((request_id, tokens))
            return (name, job.add(request_id, _NO_TOKENS, budget)), state.length
        if state is None or state.length != call.known_lengths[i]:  # the client's view is stale
            self.metrics.count_resync("unknown" if state is None else "length_mismatch")
            if state is not None:
                self.table.pop(request_id)
                jobs_for(jobs, state.datastore).stops.append(request_id)
            return None, 0
        if call.prefetched[i]:  # the client drafts from a pre-draft: draft nothing now
            taken[i] = resolve_prefetched(state.trees, tokens)
            self.metrics.count_prefetched(hit=taken[i] is not None)
            budget = 0
        self.table.append(request_id, tokens.copy() if state.history is not None else tokens)
        self.table.touch(request_id, now)
        job = jobs_for(jobs, state.datastore)
        return (state.datastore, job.add(request_id, tokens, budget)), state.length

    async def finish(
        self, items: Sequence[Finished], wait_durable: bool = False
    ) -> tuple[int, list[str], int]:
        """Frees the requests and queues finished generations for storing. Returns how
        many were queued, the ids the service did not hold, and how many of the queued
        are durable (in the ingest log): all that were stored when ``wait_durable``
        (the call then waits for them), else 0."""
        self._admit()
        tickets: list[concurrent.futures.Future[bool]] = []
        try:
            jobs: dict[str, DrafterJob] = {}
            self._stop_all(self.table.expire(time.monotonic()), jobs)
            queued, unknown = 0, []
            for item in items:
                state = self.table.pop(item.request_id)
                if state is None:
                    unknown.append(item.request_id)
                    continue
                jobs_for(jobs, state.datastore).stops.append(item.request_id)
                live = self.catalog.slots[state.datastore].live
                generated = state.length + len(item.final_tokens) - state.prompt_length
                if item.store and live is not None and state.history is not None and generated:
                    chunks = [*state.history, item.final_tokens]
                    ticket = self.ingester.offer(live, chunks, state.prompt_length)
                    if ticket is not None:
                        queued += 1
                        tickets.append(ticket)
            future = self._runner.run(jobs, lambda results: self._settled(jobs, results))
        except BaseException:
            self._release()
            raise
        await future
        if not (wait_durable or self.finish_durable) or not tickets:
            return queued, unknown, 0
        # Once queued, a generation is stored whether or not this caller still waits.
        stored = await asyncio.shield(asyncio.gather(*map(asyncio.wrap_future, tickets)))
        return queued, unknown, sum(stored)

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

    def expire_idle(self) -> int:
        """Drops request states idle past the TTL (also done at every call)."""
        jobs: dict[str, DrafterJob] = {}
        expired = self.table.expire(time.monotonic())
        self._stop_all(expired, jobs)
        if jobs:
            self._inflight += 1  # released when settled, like a call's
            self._runner.run(jobs, lambda results: self._settled(jobs, results)).add_done_callback(
                _retrieve
            )
        return len(expired)

    async def close(self) -> None:
        """Waits for the work in flight, then stores the queued generations."""
        await self._runner.wait_idle()
        await asyncio.to_thread(self._io.shutdown, True)
        await asyncio.to_thread(self.ingester.close)

    # -- internals ---------------------------------------------------------------------

    def _admit(self) -> None:
        if self._inflight >= self.max_inflight_calls:
            raise ResourceExhausted(
                f"{self._inflight} calls in flight: at max_inflight_calls "
                f"({self.max_inflight_calls}); retry later"
            )
        self._inflight += 1

    def _check_state_bytes(self, call: DraftCall) -> None:
        """Refuses a call whose own requests would hold more state than the whole byte
        budget: evicting every other request would not make room. (A call that fits
        evicts the least recently used other states instead, in ``trim``.)"""
        table = self.table
        tokens = len(call.tokens)
        if table.bytes + tokens * STATE_BYTES_PER_TOKEN <= table.max_bytes:
            return  # the usual case: everything held plus this call fits (no per-request loop)
        for i, request_id in enumerate(call.request_ids):
            state, known = table.get(request_id), call.known_lengths[i]
            if known and state is not None and state.length == known:
                tokens += state.length
        if tokens * STATE_BYTES_PER_TOKEN > table.max_bytes:
            raise ResourceExhausted(
                f"this call's {len(call.request_ids)} requests would hold {tokens} context "
                f"tokens ({tokens * STATE_BYTES_PER_TOKEN} bytes of request state), over the "
                f"budget of {table.max_bytes} bytes (--max-request-state-bytes); send fewer "
                "or shorter requests per call"
            )

    def _release(self, _: object = None) -> None:
        self._inflight -= 1

    def _settled(self, jobs: dict[str, DrafterJob], results: dict[str, JobOutcome]) -> None:
        """A call's jobs have all run: end its admission; forget requests whose job failed
        (the job stopped them, so they answer RESYNC next time)."""
        self._release()
        for name, result in results.items():
            if isinstance(result, BaseException):
                for request_id in jobs[name].request_ids:
                    state = self.table.get(request_id)
                    if state is not None and state.datastore == name:
                        self.table.pop(request_id)

    def _stop_all(
        self, states: Iterable[tuple[str, RequestState]], jobs: dict[str, DrafterJob]
    ) -> None:
        for request_id, state in states:
            jobs_for(jobs, state.datastore).stops.append(request_id)


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
        except LogError as exc:
            raise Unavailable(
                f"datastore {name!r}: the shared ingest log did not take sequence {i} of "
                f"{len(sequences)} (the ones before are stored; retry the rest): {exc}"
            ) from None
    return len(sequences), position
