"""The clients' background workers: they send finish, abort and ingest work.

The decode loop drops planned work into a bounded queue and never waits: when
the queue is full the work is dropped and counted. One thread drains the
queue, merges what is waiting into as few calls as the drafter allows, and
sends them with ``wait_for_ready`` so that a short drafter restart delays the
work instead of losing it. The asyncio worker is the same with a task.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from verifier_client.pending_work import Work, batch_messages, reingest_unknown
from verifier_client.results import ClientStats

__all__ = ["AioBackgroundWorker", "BackgroundWorker"]

log = logging.getLogger(__name__)
_DRAIN_MAX_ITEMS = 4096  # queue entries merged into one round of calls


class BackgroundWorker:
    """A bounded work queue and the thread that sends it through ``stub``."""

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
        self._timeout_s = timeout_s
        self._max_per_call = max_per_call
        self._queue: queue.Queue[list[Work] | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="drafter-work", daemon=True)
        self._thread.start()

    def offer(self, work: list[Work]) -> bool:
        """Queues ``work`` without waiting; False (and counted) when the queue is full."""
        if not work:
            return True
        try:
            self._queue.put_nowait(work)
        except queue.Full:
            self._stats.ingest_drops += 1
            return False
        return True

    def flush(self, timeout_s: float) -> bool:
        """Waits until everything queued so far is sent; False on timeout."""
        end_s = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() >= end_s:
                return False
            time.sleep(0.001)
        return True

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
        stop = False
        while not stop:
            first = self._queue.get()
            stop = first is None
            work, taken = list(first or ()), 1
            while not stop and len(work) < _DRAIN_MAX_ITEMS:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                taken += 1
                stop = more is None
                work.extend(more or ())
            try:
                self._send(work)
            except Exception:  # never let the thread die: later work would pile up unsent
                log.exception("drafter background work failed")
            finally:
                for _ in range(taken):
                    self._queue.task_done()

    def _send(self, work: list[Work]) -> None:
        max_per_call = self._max_per_call()
        finishes, ingests = batch_messages(work, max_per_call)
        for message, sent in finishes:
            answer = self._call(self._stub.Finish, message)
            lost = reingest_unknown(answer, sent) if answer is not None else []
            if lost:
                self._stats.reingested += len(lost)
                ingests.extend(batch_messages(lost, max_per_call)[1])
        for ingest in ingests:
            self._call(self._stub.Ingest, ingest)

    def _call(self, method: Any, message: Any) -> Any:
        try:
            answer = method(message, timeout=self._timeout_s, wait_for_ready=True)
        except grpc.RpcError as error:
            self._stats.background_failures += 1
            log.warning("drafter %s failed: %s", type(message).__name__, error.details())
            return None
        self._stats.background_sent += 1
        return answer


class AioBackgroundWorker:
    """BackgroundWorker for grpc.aio: an asyncio.Queue and a task on the running loop."""

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
        self._timeout_s = timeout_s
        self._max_per_call = max_per_call
        self._queue: asyncio.Queue[list[Work]] = asyncio.Queue(maxsize=queue_size)
        self._task = asyncio.get_running_loop().create_task(self._run())

    def offer(self, work: list[Work]) -> bool:
        """Queues ``work`` without waiting; False (and counted) when the queue is full."""
        if not work:
            return True
        try:
            self._queue.put_nowait(work)
        except asyncio.QueueFull:
            self._stats.ingest_drops += 1
            return False
        return True

    async def flush(self, timeout_s: float) -> bool:
        """Waits until everything queued so far is sent; False on timeout."""
        try:
            await asyncio.wait_for(self._queue.join(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def close(self, timeout_s: float) -> bool:
        """Sends what is queued (up to ``timeout_s``) and stops; False if work was left."""
        flushed = await self.flush(timeout_s)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return flushed

    async def _run(self) -> None:
        while True:
            work, taken = list(await self._queue.get()), 1
            while len(work) < _DRAIN_MAX_ITEMS and not self._queue.empty():
                work.extend(self._queue.get_nowait())
                taken += 1
            try:
                await self._send(work)
            except Exception:  # never let the task die: later work would pile up unsent
                log.exception("drafter background work failed")
            finally:
                for _ in range(taken):
                    self._queue.task_done()

    async def _send(self, work: list[Work]) -> None:
        max_per_call = self._max_per_call()
        finishes, ingests = batch_messages(work, max_per_call)
        for message, sent in finishes:
            answer = await self._call(self._stub.Finish, message)
            lost = reingest_unknown(answer, sent) if answer is not None else []
            if lost:
                self._stats.reingested += len(lost)
                ingests.extend(batch_messages(lost, max_per_call)[1])
        for ingest in ingests:
            await self._call(self._stub.Ingest, ingest)

    async def _call(self, method: Any, message: Any) -> Any:
        try:
            answer = await method(message, timeout=self._timeout_s, wait_for_ready=True)
        except grpc.RpcError as error:
            self._stats.background_failures += 1
            log.warning("drafter %s failed: %s", type(message).__name__, error.details())
            return None
        self._stats.background_sent += 1
        return answer
