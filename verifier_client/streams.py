"""The long-lived DraftStream of each client, with a deadline on every exchange.

Answers carry their message's ``step``: an answer for an earlier message (its
step gave up) is discarded and counted. A reader runs beside the caller and
hands answers over, because waiting on the call itself cannot time out safely:
gRPC's sync API reads by blocking iteration, and in grpc.aio cancelling a
``read()`` cancels the whole call.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from time import perf_counter
from typing import Any

import grpc

from sssd.drafter.v1 import drafter_pb2 as pb
from verifier_client.channel import CallFailed, outcome_of
from verifier_client.results import ClientStats, Outcome

__all__ = ["AioStream", "SyncStream"]

_END = None  # ends the request iterator


class SyncStream:
    """One DraftStream call: ``exchange`` sends a message and waits for its answer."""

    def __init__(self, stub: Any, stats: ClientStats) -> None:
        self._stats = stats
        self._requests: queue.SimpleQueue[pb.DraftRequest | None] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[pb.DraftResponse | CallFailed] = queue.SimpleQueue()
        self.broken = False  # set once the call has ended; a new stream is needed
        self._call = stub.DraftStream(self._outgoing())
        self._reader = threading.Thread(
            target=self._read, name="drafter-stream-reader", daemon=True
        )
        self._reader.start()

    def exchange(self, message: pb.DraftRequest, deadline_s: float) -> pb.DraftResponse:
        """Sends ``message``; its answer, or CallFailed by ``deadline_s`` (perf_counter)."""
        if self.broken:
            raise CallFailed(Outcome.UNAVAILABLE, "stream ended")
        self._requests.put(message)
        want = message.step
        while True:
            left_s = deadline_s - perf_counter()
            if left_s <= 0:
                raise CallFailed(Outcome.DEADLINE)
            try:
                answer = self._answers.get(timeout=left_s)
            except queue.Empty:
                raise CallFailed(Outcome.DEADLINE) from None
            if isinstance(answer, CallFailed):
                raise answer
            if answer.step == want:
                return answer
            if answer.step > want:
                self.close()
                raise CallFailed(Outcome.ERROR, f"answer for step {answer.step}, sent {want}")
            self._stats.late_responses += 1  # its step already fell back

    def close(self) -> None:
        """Ends the call (the server drops whatever it still had queued)."""
        self.broken = True
        self._requests.put(_END)
        self._call.cancel()

    def _outgoing(self) -> Iterator[pb.DraftRequest]:
        while (message := self._requests.get()) is not None:
            yield message

    def _read(self) -> None:
        failure = CallFailed(Outcome.UNAVAILABLE, "stream closed by the drafter")
        try:
            for answer in self._call:
                self._answers.put(answer)
        except grpc.RpcError as error:
            failure = CallFailed(outcome_of(error), str(error.details()))
        self.broken = True
        self._answers.put(failure)


class AioStream:
    """One grpc.aio DraftStream call; ``exchange`` is a coroutine with the same contract."""

    def __init__(self, stub: Any, stats: ClientStats) -> None:
        self._stats = stats
        self._pending: dict[int, asyncio.Future[pb.DraftResponse]] = {}
        self.broken = False
        self._call = stub.DraftStream()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def exchange(self, message: pb.DraftRequest, deadline_s: float) -> pb.DraftResponse:
        """Sends ``message``; its answer, or CallFailed by ``deadline_s`` (perf_counter)."""
        if self.broken:
            raise CallFailed(Outcome.UNAVAILABLE, "stream ended")
        answer: asyncio.Future[pb.DraftResponse] = asyncio.get_running_loop().create_future()
        self._pending[message.step] = answer
        try:
            async with asyncio.timeout(deadline_s - perf_counter()):
                await self._call.write(message)
                return await answer
        except TimeoutError:
            raise CallFailed(Outcome.DEADLINE) from None
        except grpc.RpcError as error:
            raise CallFailed(outcome_of(error), str(error.details())) from None
        except (grpc.aio.UsageError, asyncio.InvalidStateError) as error:  # write after the end
            self.broken = True
            raise CallFailed(Outcome.UNAVAILABLE, str(error)) from None
        finally:
            self._pending.pop(message.step, None)

    def close(self) -> None:
        """Ends the call (the server drops whatever it still had queued)."""
        self.broken = True
        self._call.cancel()
        self._reader.cancel()

    async def _read(self) -> None:
        failure = CallFailed(Outcome.UNAVAILABLE, "stream closed by the drafter")
        try:
            while (answer := await self._call.read()) is not grpc.aio.EOF:
                waiter = self._pending.pop(answer.step, None)
                if waiter is None or waiter.done():
                    self._stats.late_responses += 1  # its step already fell back
                else:
                    waiter.set_result(answer)
        except grpc.RpcError as error:
            failure = CallFailed(outcome_of(error), str(error.details()))
        finally:  # also on cancellation by close()
            self.broken = True
            for waiter in self._pending.values():
                if not waiter.done():
                    waiter.set_exception(failure)
            self._pending.clear()
