"""The long-lived DraftStream of each client, with a deadline on every exchange.

Answers carry their message's ``step``: an earlier message's answer (its step gave up) is
discarded and counted; a later one's means the stream lost its order, and it is not used
again. A reader beside the caller queues the answers, since waiting on the call itself
cannot time out safely (gRPC's sync API reads by blocking iteration; in grpc.aio,
cancelling a ``read()`` cancels the call). Which answer ends a wait is
:class:`StreamAnswers`'s (no I/O); neither stream raises for a failed exchange: it
returns the CallFailed.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from time import perf_counter
from typing import Any

import grpc

from sssd_drafter.v1 import drafter_pb2 as pb
from verifier_client.channel import CallFailed, failure_of
from verifier_client.results import ClientStats, Outcome

__all__ = ["AioStream", "StreamAnswers", "SyncStream"]

_END = None  # ends the request iterator

Answer = pb.DraftResponse | CallFailed  # what the reader queues: an answer or the call's end


class StreamAnswers(ABC):
    """The pure half of a DraftStream call: matches answers to the message waiting for
    one, counts late ones, and says when the stream may no longer be used."""

    def __init__(self, stats: ClientStats) -> None:
        self._stats = stats
        self.broken = False  # set once the call has ended or lost its order: reopen

    @abstractmethod
    def close(self) -> None:
        """Ends the call (the server drops whatever it still had queued)."""

    def _take(self, answer: Answer, step: int) -> Answer | None:
        """``answer`` if it ends the wait of message ``step`` (its answer, or the call's
        failure); None for the late answer of an earlier message, which is counted."""
        if isinstance(answer, CallFailed) or answer.step == step:
            return answer
        if answer.step > step:
            self.broken = True
            return CallFailed(Outcome.ERROR, f"answer for step {answer.step}, sent {step}")
        self._stats.late_responses += 1  # its step already fell back
        return None

    def _ended(self, error: grpc.RpcError | None) -> CallFailed:
        """The reader's last word: the call ended, by ``error`` or by the drafter."""
        self.broken = True
        if error is None:
            return CallFailed(Outcome.UNAVAILABLE, "stream closed by the drafter")
        return failure_of(error)


class SyncStream(StreamAnswers):
    """One DraftStream call: ``exchange`` sends a message and waits for its answer."""

    def __init__(self, stub: Any, stats: ClientStats) -> None:
        super().__init__(stats)
        self._requests: queue.SimpleQueue[pb.DraftRequest | None] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[Answer] = queue.SimpleQueue()
        self._call = stub.DraftStream(self._outgoing())
        self._reader = threading.Thread(
            target=self._read, name="drafter-stream-reader", daemon=True
        )
        self._reader.start()

    def exchange(self, message: pb.DraftRequest, deadline_s: float) -> Answer:
        """Sends ``message``; its answer, or why there is none by ``deadline_s`` (perf_counter).
        Never called once ``broken`` (the client opens a new stream instead): a call that
        ended meanwhile is answered by the failure its reader queued."""
        self._requests.put(message)
        while (left_s := deadline_s - perf_counter()) > 0:
            try:
                answer = self._answers.get(timeout=left_s)
            except queue.Empty:
                break
            if (mine := self._take(answer, message.step)) is not None:
                return mine
        return CallFailed(Outcome.DEADLINE)

    def close(self) -> None:
        self.broken = True
        self._requests.put(_END)
        self._call.cancel()

    def _outgoing(self) -> Iterator[pb.DraftRequest]:
        while (message := self._requests.get()) is not None:
            yield message

    def _read(self) -> None:
        error = None
        try:
            for answer in self._call:
                self._answers.put(answer)
        except grpc.RpcError as failed:
            error = failed
        self._answers.put(self._ended(error))


class AioStream(StreamAnswers):
    """One grpc.aio DraftStream call; ``exchange`` is a coroutine with the same contract."""

    def __init__(self, stub: Any, stats: ClientStats) -> None:
        super().__init__(stats)
        # Messages go out through a request iterator, like SyncStream's: a step that gives
        # up at its deadline cancels only its own wait, never a write (cancelling a
        # grpc.aio write cancels the whole call).
        self._requests: asyncio.Queue[pb.DraftRequest | None] = asyncio.Queue()
        self._answers: asyncio.Queue[Answer] = asyncio.Queue()
        self._call = stub.DraftStream(self._outgoing())
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def exchange(self, message: pb.DraftRequest, deadline_s: float) -> Answer:
        """SyncStream.exchange, awaited."""
        self._requests.put_nowait(message)
        try:
            async with asyncio.timeout(deadline_s - perf_counter()):
                mine = None
                while mine is None:
                    mine = self._take(await self._answers.get(), message.step)
                return mine
        except TimeoutError:
            return CallFailed(Outcome.DEADLINE)

    def close(self) -> None:
        self.broken = True
        self._requests.put_nowait(_END)
        self._call.cancel()
        self._reader.cancel()

    async def _outgoing(self) -> AsyncIterator[pb.DraftRequest]:
        while (message := await self._requests.get()) is not None:
            yield message

    async def _read(self) -> None:
        error = None
        try:
            while (answer := await self._call.read()) is not grpc.aio.EOF:
                self._answers.put_nowait(answer)
        except grpc.RpcError as failed:
            error = failed
        finally:  # also on cancellation by close()
            self._answers.put_nowait(self._ended(error))
