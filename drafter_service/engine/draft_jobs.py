"""Native work of a call: one job per call and datastore, run in call order on that
datastore's worker thread (or inline, see :class:`JobRunner`).

A job is never cancelled once submitted: the request table already describes its effect,
so a caller that stops waiting only loses the answer. A job whose call's deadline passed
before its turn only stops (:class:`CallExpired`): its requests answer RESYNC, which the
client, having lost the answer, needs anyway; under overload the worker thread thus works
only for calls that can still be answered. Each call's loop future is set from the worker
with ``call_soon_threadsafe``, so cancelling it cannot cancel the work.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from drafter_service.drafting.drafter import DraftBatch, Drafter
from drafter_service.engine.catalog import Catalog
from drafter_service.engine.request_table import HeldRequest

_NO_TOKENS = np.zeros(0, dtype=np.int32)
JobResults = dict[str, DraftBatch | None]
JobOutcome = DraftBatch | BaseException | None  # what a job returned or raised
# What a unit of weight is: about one drafted request at budget <= 64 (~12 µs of native
# work on the 2-core benchmark machine). Measured there: adding a token to a request's
# input trie costs 1-1.5 µs (start or append), stopping a request ~2 µs.
TOKENS_PER_WEIGHT = 8  # tokens added (starts and appends)
STOPS_PER_WEIGHT = 8
BUDGET_PER_WEIGHT = 64  # a drafted request weighs 1 more per this many nodes of budget
SECONDS_PER_WEIGHT = 12e-6  # what a unit costs before jobs measure it
_DECAY = 0.99  # each job's share of the measured speed fades by this factor per job


class CallExpired(Exception):
    """A job's call was past its deadline when the job's turn came: nothing was done."""


class RequestsDropped(Exception):
    """A request the job appends to was dropped by an earlier call's failed job (a client
    that sent one request in two calls at once): nothing was drafted; the job stopped its
    requests, which answer RESYNC."""


@dataclass(slots=True)
class DrafterJob:
    """What one call does to one datastore's drafter, in this order.

    A drafted request's new tokens are not copied out of the call: ``rows`` holds its
    index into the call's ``tokens``/``offsets`` columns, so a call whose requests all
    append to one datastore hands its columns to the native batch call as they are."""

    collect: list[str] = field(default_factory=list)  # finished: their tokens read first
    stops: list[str] = field(default_factory=list)  # restarted, mismatched, evicted, finished
    # (request id, its context, whether it shares its tokens with the recent tier, its
    # recent-tier group)
    starts: list[tuple[str, npt.NDArray[np.int32], bool, int]] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)  # drafted, in batch order
    rows: list[int] = field(default_factory=list)  # each one's index in the call; -1: none new
    budgets: list[int] = field(default_factory=list)
    # the engine's, for each drafted request: its state and the bytes reserved for its row
    states: list[tuple[HeldRequest, int]] = field(default_factory=list)
    tokens: npt.NDArray[np.int32] = field(default_factory=lambda: _NO_TOKENS)  # the call's new
    offsets: list[int] = field(default_factory=lambda: [0])  # tokens; request i's: [o[i], o[i+1])
    seconds: float = 0.0  # how long run() took (set on the worker thread; for metrics)
    collected: dict[str, npt.NDArray[np.int32]] = field(default_factory=dict)  # by run()
    deadline_s: float | None = None  # by `clock`; past it when its turn comes: CallExpired
    clock: Callable[[], float] = time.monotonic

    def add(self, request_id: str, row: int, budget: int) -> int:
        """Adds a request to the batch call, its new tokens those of ``row`` of the call
        (-1: none; rows are added in call order); returns its row in the batch."""
        self.request_ids.append(request_id)
        self.rows.append(row)
        self.budgets.append(budget)
        return len(self.request_ids) - 1

    def weight(self) -> int:
        """Rough native cost in drafted requests: every drafted request (more for large
        budgets), every token added to a request (a start's context, an append), every
        stop. Whatever a call carries, its weight grows with the work it asks for."""
        offs = self.offsets
        if self._whole_call():
            appended = offs[-1]
        else:
            appended = sum(offs[r + 1] - offs[r] for r in self.rows if r >= 0)
        tokens = sum(len(t) for _, t, _, _ in self.starts) + appended
        return (
            len(self.request_ids) + sum(self.budgets) // BUDGET_PER_WEIGHT
            + tokens // TOKENS_PER_WEIGHT + len(self.stops) // STOPS_PER_WEIGHT
        )  # fmt: skip

    def _whole_call(self) -> bool:
        """Whether the batch is every request of the call, in order, each with its new
        tokens (rows increase, so n of them in [0, n) are 0 .. n - 1)."""
        rows = self.rows
        return len(rows) == len(self.offsets) - 1 and -1 not in rows

    def _batch_tokens(self) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
        """The batch's new tokens, flat, and each request's offsets into them."""
        offs = self.offsets
        if self._whole_call():
            return self.tokens, np.asarray(offs, dtype=np.int64)
        rows = self.rows
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([offs[r + 1] - offs[r] if r >= 0 else 0 for r in rows], out=offsets[1:])
        pieces = [self.tokens[offs[r] : offs[r + 1]] for r in rows if r >= 0]
        return (np.concatenate(pieces) if pieces else _NO_TOKENS), offsets

    def run(self, drafter: Drafter) -> DraftBatch | None:
        """Reads the tokens of the requests to collect, stops, starts, then one native batch
        call (on the datastore's worker thread, or inline on the loop thread)."""
        start = time.perf_counter()
        try:
            if self.deadline_s is not None and self.clock() > self.deadline_s:
                for request_id in self.stops:  # the drafted ones are stopped below; no start
                    drafter.stop(request_id)
                raise CallExpired(f"the call's deadline passed {len(self.request_ids)} "
                                  "requests before its turn")  # fmt: skip
            for request_id in self.collect:
                if request_id in drafter:  # else an earlier job failed and dropped it
                    self.collected[request_id] = drafter.tokens(request_id)
            for request_id in self.stops:
                drafter.stop(request_id)
            for request_id, context, shared, group in self.starts:
                drafter.start(request_id, context, shared=shared, group=group)
            if not self.request_ids:
                return None
            if dropped := [r for r in self.request_ids if r not in drafter]:
                raise RequestsDropped(f"{len(dropped)} requests, e.g. {dropped[0]!r}")
            flat, offsets = self._batch_tokens()
            budgets = np.array(self.budgets, dtype=np.int32)
            return drafter.draft_batch(self.request_ids, flat, offsets, budgets)
        except BaseException:
            for request_id in self.request_ids:  # the service forgets them too (RESYNC)
                drafter.stop(request_id)
            raise
        finally:
            self.seconds = time.perf_counter() - start


class JobRunner:
    """Submits a call's jobs and resolves when all of them have run. Event loop only.

    A call whose jobs weigh at most ``inline_max_work`` (:meth:`DrafterJob.weight`) and
    that finds no other call pending runs them on the event loop thread (the native call
    still releases the GIL). That skips two thread hand-offs per step, which on a small
    host cost more than drafting a small batch, and keeps call order; the weight bound
    caps how long the loop is busy.
    """

    def __init__(self, catalog: Catalog, inline_max_work: int = 0) -> None:
        self._catalog = catalog
        self._inline_max_work = inline_max_work
        self._pending = 0  # calls whose jobs have not all run
        self._queued: dict[str, int] = {}  # per datastore: weight of its jobs not yet run
        # Measured speed: seconds over units of the jobs run, both decayed per job (a
        # ratio of sums, so light jobs' fixed costs do not swamp it); seeded with 1,000
        # units at SECONDS_PER_WEIGHT.
        self._seconds, self._units = 1000 * SECONDS_PER_WEIGHT, 1000.0
        self._idle = asyncio.Event()
        self._idle.set()

    def run(
        self,
        jobs: dict[str, DrafterJob],
        on_settled: Callable[[dict[str, JobOutcome]], None],
    ) -> asyncio.Future[JobResults]:
        """Starts ``jobs``; ``on_settled`` runs on the loop once all have run (awaited or
        not). The future fails with RuntimeError if a job raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[JobResults] = loop.create_future()
        results: dict[str, JobOutcome] = {}

        weights = {name: job.weight() for name, job in jobs.items()}

        def settle(name: str | None, result: JobOutcome) -> None:
            if name is not None:
                results[name] = result
                self._queued[name] -= weights[name]
                if not isinstance(result, CallExpired):
                    self._seconds = _DECAY * self._seconds + jobs[name].seconds
                    self._units = _DECAY * self._units + weights[name]
            if len(results) < len(jobs):
                return
            self._pending -= 1
            if not self._pending:
                self._idle.set()
            on_settled(results)
            if future.done():  # the caller stopped waiting
                return
            failed = [(n, r) for n, r in results.items() if isinstance(r, BaseException)]
            if failed:
                error = RuntimeError(f"drafting failed in datastore {failed[0][0]!r}")
                error.__cause__ = failed[0][1]
                future.set_exception(error)
            else:
                future.set_result(results)  # type: ignore[arg-type]  # no exceptions left

        self._pending += 1
        self._idle.clear()
        for name, w in weights.items():
            self._queued[name] = self._queued.get(name, 0) + w
        if not jobs:
            settle(None, None)
        elif self._pending == 1 and sum(weights.values()) <= self._inline_max_work:
            for name, job in jobs.items():
                settle(name, _outcome(job, self._catalog.slots[name].drafter))
            return future
        for name, job in jobs.items():
            slot = self._catalog.slots[name]
            slot.executor.submit(_run, loop, job, slot.drafter, functools.partial(settle, name))
        return future

    def expected_wait_s(self) -> float:
        """How long a call planned now would wait for its turn: the most work queued on
        one datastore, at the measured speed (0 when nothing is queued)."""
        return max(self._queued.values(), default=0) * self._seconds / self._units

    async def wait_idle(self) -> None:
        """Returns once every submitted job has run."""
        await self._idle.wait()


def _outcome(job: DrafterJob, drafter: Drafter) -> JobOutcome:
    try:
        return job.run(drafter)
    except BaseException as exc:  # reported on the loop, where the table is
        return exc


def _run(
    loop: asyncio.AbstractEventLoop,
    job: DrafterJob,
    drafter: Drafter,
    done: Callable[[JobOutcome], None],
) -> None:
    loop.call_soon_threadsafe(done, _outcome(job, drafter))
