"""What DrafterClient and AioDrafterClient share, without I/O: their surface and the logic
of a step, of the stream and of the breaker probe.

A step is ``_begin_step`` (commits recorded, breaker asked, message planned) → the
subclass's ``_io`` (the plan sent over ``_stream_to_send()``, or as one Draft call in unary
mode, and waited on until its deadline) → ``_advance``, which returns the step's result or
the next I/O of the same step (the resync resend). A failure that opens the circuit drops
the stream; a broken one is reopened before the next send. While the circuit is open, a
step the breaker lets probe starts one GetServiceInfo in the background; the next step
applies its outcome.
"""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from time import perf_counter
from typing import Any, Generic, Literal, Protocol, TypeVar, Unpack

import grpc

from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc
from verifier_client.background_sender import WorkSenderCore
from verifier_client.breaker import BreakerConfig, BreakerState, CircuitBreaker
from verifier_client.budget import BudgetRule
from verifier_client.channel import CallFailed, ChannelOptions
from verifier_client.channel import channel_options as merged_channel_options
from verifier_client.deltas import RequestOptions, RequestState
from verifier_client.results import ClientStats, StepResult
from verifier_client.session import DraftSession, StepPlan
from verifier_client.streams import StreamAnswers

__all__ = ["ClientCore"]

log = logging.getLogger(__name__)


class ProbeCall(Protocol):
    """A GetServiceInfo running in the background: a gRPC future or an asyncio task."""

    def done(self) -> bool: ...
    def cancel(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def exception(self) -> BaseException | None: ...


StreamT = TypeVar("StreamT", bound=StreamAnswers)


class ClientCore(ABC, Generic[StreamT]):
    """A drafter client but for its I/O; arguments as documented on DrafterClient."""

    # The I/O each subclass brings (and ``_launch_probe``, ``wait_ready``, ``step``, ``_io``,
    # ``flush``, ``close``): sync_channel or aio_channel, SyncStream or AioStream,
    # BackgroundSender or AioBackgroundSender.
    _open_channel: Callable[[str, ChannelOptions, grpc.ChannelCredentials | None, str | None], Any]
    _stream_type: Callable[[Any, ClientStats], StreamT]
    _sender_type: Callable[..., WorkSenderCore]

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
        self._session = DraftSession(
            deadline_s=deadline_ms / 1e3,
            budget=budget or BudgetRule.for_gpu("h100-sxm"),
            breaker=CircuitBreaker(breaker or BreakerConfig()),
            tokenizer_fingerprint=tokenizer_fingerprint,
            resync_retry=resync_retry,
        )
        self.stats: ClientStats = self._session.stats
        self._mode = mode
        self._stream: StreamT | None = None
        self._started_s = 0.0  # the current step's entry
        self._streams_opened = 0
        self._probe: ProbeCall | None = None  # the probe out, or ended but not yet applied
        self._probe_timeout_s = probe_timeout_s
        self._closed = False
        self.target = target
        options = merged_channel_options(channel_options)
        self._channel = self._open_channel(target, options, credentials, token)
        self._stub = pb_grpc.DrafterServiceStub(self._channel)
        self._sender = self._sender_type(
            self._stub, self.stats, queue_size=ingest_queue_size,
            timeout_s=background_timeout_s, max_per_call=lambda: self._session.max_per_call,
        )  # fmt: skip

    @abstractmethod
    def _launch_probe(self) -> ProbeCall:
        """Starts GetServiceInfo (``_probe_timeout_s``, wait_for_ready) in the background."""

    # --- the decode loop's surface that needs no waiting

    @property
    def breaker_state(self) -> BreakerState:
        """The circuit breaker's state."""
        return self._session.breaker.state

    def add_request(
        self, request_id: str, prompt_ids: Iterable[int], **options: Unpack[RequestOptions]
    ) -> None:
        """Starts tracking a request; ``prompt_ids`` is its context so far (see deltas.py),
        ``options`` its ``datastore``, ``prompt_length`` and ``store`` (RequestState.new's).
        ``store=False``: it opted out of storage from the start, so the drafter never
        shares its tokens with other requests while it runs either (its ``finish`` stores
        nothing whatever it says)."""
        state = RequestState.new(request_id, prompt_ids, **options)
        self._session.tracker.add(state)

    def finish(
        self,
        request_id: str,
        *,
        tail: Iterable[int] = (),
        output: Iterable[int] | None = None,
        store: bool = True,
        durable: bool = False,
    ) -> bool:
        """Ends a finished request in the background (stored unless ``store=False``); False
        when the work queue was full (dropped, counted). Its last tokens come as ``tail``
        (committed since its last ``step``) or as ``output`` (its whole generated output,
        of which only what ``step`` has not sent goes; ValueError, the request still open,
        if it does not start with what was committed), never both. ``durable``: acknowledged
        once in the drafter's ingest log, so a True ``flush`` means it survives a crash."""
        return self._sender.offer(
            self._session.finish(request_id, tail, store, durable, output=output)
        )

    def abort(self, request_id: str) -> bool:
        """Ends a cancelled request in the background; nothing is stored."""
        return self._sender.offer(self._session.abort(request_id))

    def ingest(self, sequences: Iterable[Iterable[int]], datastore: str = "") -> bool:
        """Adds token sequences to a datastore in the background."""
        return self._sender.offer(self._session.ingest(sequences, datastore))

    # --- a step, around the call the subclass makes

    def _adopt(self, info: pb.GetServiceInfoResponse) -> None:
        """wait_ready's answer: checks the tokenizer, takes the drafter's limits, and opens
        the stream so that the first step need not."""
        self._session.adopt_service_info(info)
        if self._mode == "stream" and self._stream is None:
            self._open_stream()

    def _begin_step(
        self, commits: Mapping[str, Iterable[int]], budgets: Mapping[str, int] | None
    ) -> StepPlan | StepResult:
        """Records the commits; the plan to send, or the step's result when nothing goes
        out (circuit open, nothing to draft), after starting a probe if one is due."""
        if self._closed:
            raise RuntimeError(f"step() on a closed {type(self).__name__}")
        self._started_s = now_s = perf_counter()
        session = self._session
        probe = self._probe
        if probe is not None and probe.done():  # the drafter answered it (circuit closed) or not
            self._probe = None
            if not probe.cancelled() and probe.exception() is None:
                log.info("drafter reachable again: circuit closed")
                session.breaker.record_success()
            else:  # unreachable or refused
                session.breaker.record_failure(now_s)
        plan = session.begin(commits, budgets, now_s)
        if isinstance(plan, StepPlan):
            return plan
        if session.breaker.state is BreakerState.HALF_OPEN and self._probe is None:
            # The breaker asked for a probe (admitted one), and none is out yet: its result
            # is applied by a later step, which moves the breaker on.
            self.stats.probes += 1
            self._drop_stream()
            self._probe = self._launch_probe()
        return self._finished(plan)

    def _advance(
        self, plan: StepPlan, answer: pb.DraftResponse | CallFailed
    ) -> StepPlan | StepResult:
        """Applies what the call for ``plan`` brought, an answer or a CallFailed: the
        step's result, or the next call within the same step (a resync resend)."""
        session = self._session
        if isinstance(answer, CallFailed):
            result = session.fail(plan, answer.outcome, perf_counter())
            if session.breaker.state is BreakerState.OPEN:  # the circuit opened: drop the stream
                log.warning("drafter circuit open after %s", answer)
                self._drop_stream()
            return self._finished(result)
        result, resend = session.complete(plan, answer, perf_counter())
        return self._finished(result) if resend is None else resend

    def _finished(self, result: StepResult) -> StepResult:
        """``result`` with the step's wait."""
        return dataclasses.replace(result, wait_s=perf_counter() - self._started_s)

    def _stream_to_send(self) -> StreamT | None:
        """The stream for the next message, reopened if it broke; None in unary mode."""
        if self._mode == "unary":
            return None
        stream = self._stream
        if stream is None or stream.broken:
            stream = self._open_stream()
        return stream

    def _open_stream(self) -> StreamT:
        self._drop_stream()
        if self._streams_opened:
            self.stats.reconnects += 1
        self._streams_opened += 1
        self._stream = self._stream_type(self._stub, self.stats)
        return self._stream

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    # --- close

    def _mark_closed(self) -> bool:
        """Marks the client closed; False when it already was."""
        was_closed, self._closed = self._closed, True
        return not was_closed

    def _release(self, all_sent: bool) -> None:
        """After the background sender stopped: ends the stream and the probe."""
        if not all_sent:
            log.warning("drafter client closed with background work unsent")
        self._drop_stream()
        if self._probe is not None:
            self._probe.cancel()
