"""The clients' background senders of finish, abort and ingest work.

The decode loop drops work into a bounded queue and never waits (when full, the work is
dropped and counted). A thread (a task, for the asyncio client) drains it, merges what is
waiting into as few calls as the drafter allows, and sends them with ``wait_for_ready``, so
a short drafter restart delays the work instead of losing it. What is merged, sent and
counted is :class:`WorkSenderCore`'s (no I/O); the subclasses only wait and make the calls.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from verifier_client.pending_work import Work, batch_messages, reingest_unknown
from verifier_client.results import ClientStats

__all__ = ["AioBackgroundSender", "BackgroundSender", "WorkSenderCore"]

log = logging.getLogger(__name__)
_DRAIN_MAX_ITEMS = 4096  # queue entries merged into one round of calls


@dataclass(slots=True)
class BackgroundCall:
    """One Finish or Ingest call of a round; the sender makes it and sets ``answer``."""

    method: Any  # the stub's Finish or Ingest
    message: Any  # its FinishRequest or IngestRequest
    answer: Any = None  # the response, or the grpc.RpcError the call failed with


class WorkSenderCore(ABC):
    """The pure half of a background sender: the bounded queue's use and the calls that
    send what it holds. Subclasses create the queue and drain it (``_start``)."""

    _queue: queue.Queue[list[Work] | None] | asyncio.Queue[list[Work]]  # None: the stop mark

    def __init__(
        self,
        stub: Any,
        stats: ClientStats,
        *,
        queue_size: int,
        timeout_s: float,
        max_per_call: Callable[[], int],
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"ingest_queue_size must be >= 1, got {queue_size}")
        self._stub = stub
        self._stats = stats
        self._lost = 0  # failed calls that carried generations or sequences to store
        self._lost_flushed = 0  # _lost when the last flush returned
        self._timeout_s = timeout_s
        self._max_per_call = max_per_call
        self._start(queue_size)

    @abstractmethod
    def _start(self, queue_size: int) -> None:
        """Creates the queue (``queue_size`` entries) and starts draining it."""

    def offer(self, work: list[Work]) -> bool:
        """Queues ``work`` without waiting; False (and counted) when the queue is full."""
        if not work:
            return True
        try:
            self._queue.put_nowait(work)
        except (queue.Full, asyncio.QueueFull):
            self._stats.ingest_drops += 1
            return False
        return True

    def _merge(self, first: list[Work] | None) -> tuple[list[Work], int, bool]:
        """``first`` and the entries waiting behind it (up to _DRAIN_MAX_ITEMS); how many
        entries it took, and whether the stop mark was one."""
        last = first is None
        work, taken = list(first or ()), 1
        while not last and len(work) < _DRAIN_MAX_ITEMS:
            try:
                more = self._queue.get_nowait()
            except (queue.Empty, asyncio.QueueEmpty):
                break
            taken += 1
            last = more is None
            work.extend(more or ())
        return work, taken, last

    @contextmanager
    def _round(self, taken: int) -> Iterator[None]:
        """Around one round of calls: marks its ``taken`` entries done, and logs errors
        instead of raising (a dead thread or task would leave later work piling up)."""
        try:
            yield
        except Exception:
            log.exception("drafter background work failed")
        finally:
            for _ in range(taken):
                self._queue.task_done()

    def _calls(self, work: list[Work]) -> Iterator[BackgroundCall]:
        """The calls that send ``work``: the Finish calls, then the Ingest calls, with the
        generations a Finish answer says the drafter lost. Set each ``answer`` before the
        next is taken."""
        max_per_call = self._max_per_call()
        finishes, ingests = batch_messages(work, max_per_call)
        for message, sent in finishes:
            call = BackgroundCall(self._stub.Finish, message)
            yield call
            stores = any(not w.aborted and not w.do_not_store for w in sent)
            lost = reingest_unknown(call.answer, sent) if self._count(call, stores) else []
            if lost:
                self._stats.reingested += len(lost)
                ingests.extend(batch_messages(lost, max_per_call)[1])
        for ingest in ingests:
            call = BackgroundCall(self._stub.Ingest, ingest)
            yield call
            self._count(call, True)

    def _flushed(self) -> bool:
        """At the end of a flush: True unless a call carrying something to store (so not an
        abort) failed since the previous flush."""
        clean = self._lost == self._lost_flushed
        self._lost_flushed = self._lost
        return clean

    def _count(self, call: BackgroundCall, stores: bool) -> bool:
        """Counts a call that was made (``stores``: it carried something the drafter would
        store, so not only aborts); True when it succeeded."""
        if isinstance(call.answer, grpc.RpcError):
            self._stats.background_failures += 1
            self._lost += stores
            log.warning("drafter %s failed: %s", type(call.message).__name__,
                        call.answer.details())  # fmt: skip
            return False
        self._stats.background_sent += 1
        return True


class BackgroundSender(WorkSenderCore):
    """A bounded work queue and the thread that sends it through ``stub``."""

    _queue: queue.Queue[list[Work] | None]

    def _start(self, queue_size: int) -> None:
        self._queue = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="drafter-work", daemon=True)
        self._thread.start()

    def flush(self, timeout_s: float) -> bool:
        """Waits until everything queued so far is sent; False on timeout, or when a call
        made since the previous flush that carried something to store failed (it is lost)."""
        done = self._queue.all_tasks_done  # what Queue.join() waits on, here with a timeout
        with done:
            if not done.wait_for(lambda: not self._queue.unfinished_tasks, timeout_s):
                return False
        return self._flushed()

    def close(self, timeout_s: float) -> bool:
        """Sends what is queued (up to ``timeout_s``) and stops; False if work was left."""
        end_s = time.monotonic() + timeout_s
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return False
        self._thread.join(max(0.0, end_s - time.monotonic()))
        return not self._thread.is_alive()

    def _run(self) -> None:
        last = False
        while not last:
            work, taken, last = self._merge(self._queue.get())
            with self._round(taken):
                for call in self._calls(work):
                    try:
                        call.answer = call.method(call.message, timeout=self._timeout_s,
                                                  wait_for_ready=True)  # fmt: skip
                    except grpc.RpcError as error:
                        call.answer = error


class AioBackgroundSender(WorkSenderCore):
    """BackgroundSender for grpc.aio: an asyncio.Queue and a task on the running loop."""

    _queue: asyncio.Queue[list[Work]]

    def _start(self, queue_size: int) -> None:
        self._queue = asyncio.Queue(maxsize=queue_size)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def flush(self, timeout_s: float) -> bool:
        """See BackgroundSender.flush."""
        return await self._drained(timeout_s) and self._flushed()

    async def close(self, timeout_s: float) -> bool:
        """See BackgroundSender.close."""
        drained = await self._drained(timeout_s)  # a call that failed was sent, not left
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return drained

    async def _drained(self, timeout_s: float) -> bool:
        """Waits until everything queued so far is sent; False on timeout."""
        try:
            await asyncio.wait_for(self._queue.join(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def _run(self) -> None:
        while True:  # until close() cancels it
            work, taken, _ = self._merge(await self._queue.get())
            with self._round(taken):
                for call in self._calls(work):
                    try:
                        call.answer = await call.method(call.message, timeout=self._timeout_s,
                                                        wait_for_ready=True)  # fmt: skip
                    except grpc.RpcError as error:
                        call.answer = error
