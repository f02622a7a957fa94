"""asyncio drafter client: DrafterClient's surface and behaviour (both are a ClientCore) for
engines built on asyncio. ``step``, ``wait_ready``, ``flush`` and ``close`` are coroutines;
``add_request``, ``finish``, ``abort`` and ``ingest`` never await. Construct it inside the
running event loop; one step at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping
from time import perf_counter
from typing import Any

import grpc

from sssd_drafter.v1 import drafter_pb2 as pb
from verifier_client.background_sender import AioBackgroundSender
from verifier_client.channel import (
    CAUSE_TIMEOUT_S,
    CallFailed,
    DrafterUnreachable,
    aio_channel,
    failure_of,
    raise_unless_unreachable,
)
from verifier_client.client_core import ClientCore
from verifier_client.results import Outcome, StepResult
from verifier_client.session import StepPlan
from verifier_client.streams import AioStream

__all__ = ["AioDrafterClient"]


class AioDrafterClient(ClientCore[AioStream]):
    """asyncio client of a DrafterService at ``target``; arguments as DrafterClient's."""

    _open_channel = staticmethod(aio_channel)
    _stream_type = AioStream
    _sender_type = AioBackgroundSender
    _sender: AioBackgroundSender
    _channel: grpc.aio.Channel
    _probe: asyncio.Future[Any] | None
    _stepping = False  # a step is awaiting its answer

    async def wait_ready(self, timeout_s: float = 10.0) -> pb.GetServiceInfoResponse:
        """Connects (up to ``timeout_s``), checks the tokenizer, returns the service info;
        DrafterUnreachable naming the cause when it cannot (see DrafterClient.wait_ready)."""
        request = pb.GetServiceInfoRequest()
        try:
            info: pb.GetServiceInfoResponse = await self._stub.GetServiceInfo(
                request, timeout=timeout_s, wait_for_ready=True
            )
        except grpc.RpcError as e:
            raise_unless_unreachable(e)
            try:  # once more without waiting: gRPC then says why it cannot connect
                info = await self._stub.GetServiceInfo(request, timeout=CAUSE_TIMEOUT_S)
            except grpc.RpcError as last:
                raise_unless_unreachable(last)
                raise DrafterUnreachable(self.target, timeout_s, str(last.details())) from None
        self._adopt(info)
        return info

    async def step(
        self, commits: Mapping[str, Iterable[int]], budgets: Mapping[str, int] | None = None
    ) -> StepResult:
        """Drafts for the requests in ``commits`` within the deadline (see DrafterClient.step)."""
        if self._stepping:
            raise RuntimeError("AioDrafterClient.step() is already running: one step at a time")
        outcome = self._begin_step(commits, budgets)
        self._stepping = True
        try:
            while not isinstance(outcome, StepResult):
                outcome = self._advance(outcome, await self._io(outcome))
        finally:
            self._stepping = False
        return outcome

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """See DrafterClient.flush."""
        return await self._sender.flush(timeout_s)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Sends the queued background work (up to ``timeout_s``), then closes."""
        if self._mark_closed():
            self._release(await self._sender.close(timeout_s))
            if self._probe is not None:
                await asyncio.gather(self._probe, return_exceptions=True)
            await self._channel.close()

    async def __aenter__(self) -> AioDrafterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _launch_probe(self) -> asyncio.Future[Any]:
        info: Awaitable[pb.GetServiceInfoResponse] = self._stub.GetServiceInfo(
            pb.GetServiceInfoRequest(), timeout=self._probe_timeout_s, wait_for_ready=True
        )
        return asyncio.ensure_future(info)

    async def _io(self, plan: StepPlan) -> pb.DraftResponse | CallFailed:
        """The answer to ``plan`` by its deadline, or why there is none."""
        stream = self._stream_to_send()
        if stream is not None:
            return await stream.exchange(plan.message, plan.deadline_s)
        timeout_s = plan.deadline_s - perf_counter()
        if timeout_s <= 0:
            return CallFailed(Outcome.DEADLINE)
        try:  # asyncio's timer, not only gRPC's: the core's deadline fires ~2-3 ms late
            async with asyncio.timeout(timeout_s):
                response: pb.DraftResponse = await self._stub.Draft(plan.message, timeout=timeout_s)
        except TimeoutError:
            return CallFailed(Outcome.DEADLINE)
        except grpc.RpcError as error:
            return failure_of(error)
        return response
