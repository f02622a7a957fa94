"""asyncio drafter client: the surface of DrafterClient for engines built on asyncio.

``step``, ``wait_ready``, ``flush`` and ``close`` are coroutines; ``add_request``,
``finish``, ``abort`` and ``ingest`` are plain methods that never await (they
only plan and queue). Construct it inside the running event loop; one step at
a time. Behaviour (deltas, deadline, breaker, background work) is the sync
client's: both run the same DraftSession.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from time import perf_counter
from typing import Literal

import grpc

from sssd.drafter.v1 import drafter_pb2 as pb
from sssd.drafter.v1 import drafter_pb2_grpc as pb_grpc
from verifier_client.background_sender import AioBackgroundWorker
from verifier_client.breaker import BreakerConfig, BreakerState, CircuitBreaker
from verifier_client.budget import BudgetRule
from verifier_client.channel import CallFailed, ChannelOptions, aio_channel, outcome_of
from verifier_client.channel import channel_options as merged_channel_options
from verifier_client.results import ClientStats, Outcome, StepResult
from verifier_client.session import DraftSession, StepPlan
from verifier_client.streams import AioStream

__all__ = ["AioDrafterClient"]

log = logging.getLogger(__name__)


class AioDrafterClient:
    """asyncio client of a DrafterService at ``target``; arguments as DrafterClient's."""

    def __init__(
        self,
        target: str,
        *,
        deadline_ms: float = 3.0,
        mode: Literal["stream", "unary"] = "stream",
        budget: BudgetRule | None = None,
        tokenizer_fingerprint: str = "",
        channel_options: ChannelOptions = (),
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        ingest_queue_size: int = 1024,
        breaker: BreakerConfig | None = None,
        resync_retry: bool = True,
        background_timeout_s: float = 5.0,
        probe_timeout_s: float = 1.0,
    ) -> None:
        if mode not in ("stream", "unary"):
            raise ValueError(f"mode must be 'stream' or 'unary', got {mode!r}")
        asyncio.get_running_loop()  # RuntimeError now rather than on the first step
        self._session = DraftSession(
            deadline_s=deadline_ms / 1e3,
            budget=budget or BudgetRule.for_gpu("h100-sxm"),
            breaker=CircuitBreaker(breaker),
            tokenizer_fingerprint=tokenizer_fingerprint,
            resync_retry=resync_retry,
        )
        self.stats: ClientStats = self._session.stats
        self._mode = mode
        options = merged_channel_options(channel_options)
        self._channel = aio_channel(target, options, credentials, token)
        self._stub = pb_grpc.DrafterServiceStub(self._channel)
        self._stream: AioStream | None = None
        self._streams_opened = 0
        self._probe: asyncio.Task[None] | None = None
        self._probe_result: bool | None = None
        self._probe_timeout_s = probe_timeout_s
        self._stepping = False
        self._closed = False
        self._worker = AioBackgroundWorker(
            self._stub, self.stats, queue_size=ingest_queue_size,
            timeout_s=background_timeout_s, max_per_call=lambda: self._session.max_per_call,
        )  # fmt: skip

    @property
    def breaker_state(self) -> BreakerState:
        """The circuit breaker's state."""
        return self._session.breaker.state

    async def wait_ready(self, timeout_s: float = 10.0) -> pb.GetServiceInfoResponse:
        """Connects (up to ``timeout_s``), checks the tokenizer, returns the service info."""
        info: pb.GetServiceInfoResponse = await self._stub.GetServiceInfo(
            pb.GetServiceInfoRequest(), timeout=timeout_s, wait_for_ready=True
        )
        self._session.adopt_service_info(info)
        if self._mode == "stream" and self._stream is None:
            self._open_stream()
        return info

    def add_request(
        self,
        request_id: str,
        prompt_ids: Iterable[int],
        *,
        datastore: str = "",
        prompt_length: int | None = None,
    ) -> None:
        """Starts tracking a request; ``prompt_ids`` is its context so far."""
        self._session.add(request_id, prompt_ids, datastore, prompt_length)

    async def step(
        self, commits: Mapping[str, Iterable[int]], budgets: Mapping[str, int] | None = None
    ) -> StepResult:
        """Drafts for the requests in ``commits`` within the deadline (see DrafterClient.step)."""
        if self._closed:
            raise RuntimeError("step() on a closed AioDrafterClient")
        if self._stepping:
            raise RuntimeError("AioDrafterClient.step() is already running: one step at a time")
        now_s = perf_counter()
        session = self._session
        if self._probe_result is not None:
            self._apply_probe(now_s)
        plan = session.begin(commits, budgets, now_s)
        if not isinstance(plan, StepPlan):
            if session.pop_probe_due():
                self._start_probe()
            return plan
        self._stepping = True
        try:
            result, retry = await self._exchange(plan)
            if retry is not None:
                result, _ = await self._exchange(retry)
        finally:
            self._stepping = False
        return result

    def finish(
        self,
        request_id: str,
        final_tokens: Iterable[int] = (),
        store: bool = True,
        durable: bool = False,
    ) -> bool:
        """Ends a finished request in the background; False when dropped (queue full).
        ``durable``: acknowledged once in the drafter's ingest log (see DrafterClient)."""
        return self._worker.offer(self._session.finish(request_id, final_tokens, store, durable))

    def abort(self, request_id: str) -> bool:
        """Ends a cancelled request in the background; nothing is stored."""
        return self._worker.offer(self._session.abort(request_id))

    def ingest(self, sequences: Iterable[Iterable[int]], datastore: str = "") -> bool:
        """Adds token sequences to a datastore in the background."""
        return self._worker.offer(self._session.ingest(sequences, datastore))

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Waits until the background work queued so far is sent; False on timeout."""
        return await self._worker.flush(timeout_s)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Sends the queued background work (up to ``timeout_s``), then closes."""
        if self._closed:
            return
        self._closed = True
        if not await self._worker.close(timeout_s):
            log.warning("drafter client closed with background work unsent")
        self._drop_stream()
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        await self._channel.close()

    async def __aenter__(self) -> AioDrafterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _exchange(self, plan: StepPlan) -> tuple[StepResult, StepPlan | None]:
        session = self._session
        try:
            response = await self._send(plan)
        except CallFailed as failure:
            result = session.fail(plan, failure.outcome, perf_counter())
            if session.breaker.state is BreakerState.OPEN:
                log.warning("drafter circuit open after %s", failure)
                self._drop_stream()
            return result, None
        return session.complete(plan, response, perf_counter())

    async def _send(self, plan: StepPlan) -> pb.DraftResponse:
        if self._mode == "stream":
            stream = self._stream
            if stream is None or stream.broken:
                stream = self._open_stream()
            return await stream.exchange(plan.message, plan.deadline_s)
        timeout_s = plan.deadline_s - perf_counter()
        if timeout_s <= 0:
            raise CallFailed(Outcome.DEADLINE)
        try:  # asyncio's timer, not only gRPC's: the core's deadline fires ~2-3 ms late
            async with asyncio.timeout(timeout_s):
                response: pb.DraftResponse = await self._stub.Draft(plan.message, timeout=timeout_s)
        except TimeoutError:
            raise CallFailed(Outcome.DEADLINE) from None
        except grpc.RpcError as error:
            raise CallFailed(outcome_of(error), str(error.details())) from None
        return response

    def _open_stream(self) -> AioStream:
        self._drop_stream()
        if self._streams_opened:
            self.stats.reconnects += 1
        self._streams_opened += 1
        self._stream = AioStream(self._stub, self.stats)
        return self._stream

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _start_probe(self) -> None:
        self.stats.probes += 1
        self._drop_stream()
        self._probe = asyncio.get_running_loop().create_task(self._run_probe())

    async def _run_probe(self) -> None:
        try:
            await self._stub.GetServiceInfo(
                pb.GetServiceInfoRequest(), timeout=self._probe_timeout_s, wait_for_ready=True
            )
            self._probe_result = True
        except Exception:  # unreachable, refused, or the client was closed meanwhile
            self._probe_result = False

    def _apply_probe(self, now_s: float) -> None:
        ok, self._probe_result = self._probe_result, None
        self._session.apply_probe(bool(ok), now_s)
