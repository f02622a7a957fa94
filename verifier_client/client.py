"""Synchronous drafter client for decode loops: one call per step, bounded by a deadline.

The decode loop calls :meth:`DrafterClient.step` once per step with the tokens
each request committed; it gets one tree per request, or none when the drafter
is slow, down, or the circuit is open, and decoding simply goes on without
speculation. Finish, abort and ingest go through a bounded queue to a worker
thread and never block the loop. While the circuit is open, a background
thread probes the drafter (GetServiceInfo); steps neither build messages nor
touch the network.

Not thread-safe: call ``add_request``/``step``/``finish``/``abort`` from the
decode loop's thread (``ingest`` and the counters may be used from anywhere).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from time import perf_counter
from typing import Literal

import grpc

from sssd.drafter.v1 import drafter_pb2 as pb
from sssd.drafter.v1 import drafter_pb2_grpc as pb_grpc
from verifier_client.background_sender import BackgroundWorker
from verifier_client.breaker import BreakerConfig, BreakerState, CircuitBreaker
from verifier_client.budget import BudgetRule
from verifier_client.channel import CallFailed, ChannelOptions, outcome_of, sync_channel
from verifier_client.channel import channel_options as merged_channel_options
from verifier_client.results import ClientStats, Outcome, StepResult
from verifier_client.session import DraftSession, StepPlan
from verifier_client.streams import SyncStream

__all__ = ["DrafterClient"]

log = logging.getLogger(__name__)


class DrafterClient:
    """Sync client of a DrafterService at ``target`` (``host:port``).

    Args:
        deadline_ms: per-step budget for the whole exchange; past it the step
            returns without drafts (``Outcome.DEADLINE``).
        mode: ``"stream"`` keeps one bidirectional stream for all steps
            (reopened when it breaks); ``"unary"`` makes one Draft call per step.
        budget: draft nodes per request from the batch size; default: the
            H100 SXM ridge-point rule (``BudgetRule.for_gpu("h100-sxm")``).
        tokenizer_fingerprint: sha256 of tokenizer.json; the drafter refuses a
            mismatch (and ``wait_ready`` raises ValueError).
        channel_options: gRPC channel options over this package's defaults.
        credentials: TLS credentials; None = plaintext.
        token: the drafter's bearer token for this client (its ``--grpc-tokens-file``
            entry), sent with every call; None = the drafter authenticates no one.
        ingest_queue_size: finish/abort/ingest work waiting for the background
            worker; past it, work is dropped and counted (``stats.ingest_drops``).
        breaker: circuit breaker thresholds (default ``BreakerConfig()``).
        resync_retry: resend RESYNCed requests within the step when time is left.
        background_timeout_s: deadline of each background Finish/Ingest call.
        probe_timeout_s: how long a breaker probe waits for the drafter.
    """

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
            breaker=CircuitBreaker(breaker),
            tokenizer_fingerprint=tokenizer_fingerprint,
            resync_retry=resync_retry,
        )
        self.stats: ClientStats = self._session.stats
        self._mode = mode
        options = merged_channel_options(channel_options)
        self._channel = sync_channel(target, options, credentials, token)
        self._stub = pb_grpc.DrafterServiceStub(self._channel)
        self._stream: SyncStream | None = None
        self._streams_opened = 0
        self._probe_result: bool | None = None  # written by the probe thread, read by step()
        self._probe_timeout_s = probe_timeout_s
        self._closed = False
        self._worker = BackgroundWorker(
            self._stub, self.stats, queue_size=ingest_queue_size,
            timeout_s=background_timeout_s, max_per_call=lambda: self._session.max_per_call,
        )  # fmt: skip

    # --- the decode loop's surface

    @property
    def breaker_state(self) -> BreakerState:
        """The circuit breaker's state."""
        return self._session.breaker.state

    def wait_ready(self, timeout_s: float = 10.0) -> pb.GetServiceInfoResponse:
        """Connects (blocking, up to ``timeout_s``), checks the tokenizer, adopts the
        drafter's limits and returns its service info. Call once at startup so the
        first steps draft. Raises grpc.RpcError when the drafter stays unreachable."""
        info: pb.GetServiceInfoResponse = self._stub.GetServiceInfo(
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
        """Starts tracking a request; ``prompt_ids`` is its context so far (see deltas.py)."""
        self._session.add(request_id, prompt_ids, datastore, prompt_length)

    def step(
        self, commits: Mapping[str, Iterable[int]], budgets: Mapping[str, int] | None = None
    ) -> StepResult:
        """Drafts for the requests in ``commits`` (id → tokens committed since the last
        step, possibly none), within the deadline; ``budgets`` overrides the rule."""
        if self._closed:
            raise RuntimeError("step() on a closed DrafterClient")
        now_s = perf_counter()
        session = self._session
        if self._probe_result is not None:
            self._apply_probe(now_s)
        plan = session.begin(commits, budgets, now_s)
        if not isinstance(plan, StepPlan):
            if session.pop_probe_due():
                self._start_probe()
            return plan
        result, retry = self._exchange(plan)
        if retry is not None:
            result, _ = self._exchange(retry)
        return result

    def finish(
        self,
        request_id: str,
        final_tokens: Iterable[int] = (),
        store: bool = True,
        durable: bool = False,
    ) -> bool:
        """Ends a finished request in the background (stored unless ``store=False``).
        False when the work queue was full and the work was dropped (counted).
        ``durable``: the drafter acknowledges it only once the generation is in its
        ingest log, so a :meth:`flush` that returns True means it survives a crash."""
        return self._worker.offer(self._session.finish(request_id, final_tokens, store, durable))

    def abort(self, request_id: str) -> bool:
        """Ends a cancelled request in the background; nothing is stored."""
        return self._worker.offer(self._session.abort(request_id))

    def ingest(self, sequences: Iterable[Iterable[int]], datastore: str = "") -> bool:
        """Adds token sequences to a datastore in the background."""
        return self._worker.offer(self._session.ingest(sequences, datastore))

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Waits until the background work queued so far is sent; False on timeout."""
        return self._worker.flush(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Sends the queued background work (up to ``timeout_s``), then closes."""
        if self._closed:
            return
        self._closed = True
        if not self._worker.close(timeout_s):
            log.warning("drafter client closed with background work unsent")
        self._drop_stream()
        self._channel.close()

    def __enter__(self) -> DrafterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- draft calls

    def _exchange(self, plan: StepPlan) -> tuple[StepResult, StepPlan | None]:
        session = self._session
        try:
            response = self._send(plan)
        except CallFailed as failure:
            result = session.fail(plan, failure.outcome, perf_counter())
            if session.breaker.state is BreakerState.OPEN:
                log.warning("drafter circuit open after %s", failure)
                self._drop_stream()
            return result, None
        return session.complete(plan, response, perf_counter())

    def _send(self, plan: StepPlan) -> pb.DraftResponse:
        if self._mode == "stream":
            stream = self._stream
            if stream is None or stream.broken:
                stream = self._open_stream()
            return stream.exchange(plan.message, plan.deadline_s)
        timeout_s = plan.deadline_s - perf_counter()
        if timeout_s <= 0:
            raise CallFailed(Outcome.DEADLINE)
        # A blocking call's own deadline fires ~2-3 ms late (gRPC core timers), which
        # would double a 3 ms step; waiting on the future is exact to ~0.5 ms.
        call = self._stub.Draft.future(plan.message, timeout=timeout_s)
        try:
            response: pb.DraftResponse = call.result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            call.cancel()
            raise CallFailed(Outcome.DEADLINE) from None
        except grpc.RpcError as error:
            raise CallFailed(outcome_of(error), str(error.details())) from None
        return response

    def _open_stream(self) -> SyncStream:
        self._drop_stream()
        if self._streams_opened:
            self.stats.reconnects += 1
        self._streams_opened += 1
        self._stream = SyncStream(self._stub, self.stats)
        return self._stream

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    # --- breaker probe (a background thread; its result is applied by the next step)

    def _start_probe(self) -> None:
        self.stats.probes += 1
        self._drop_stream()
        threading.Thread(target=self._probe, name="drafter-probe", daemon=True).start()

    def _probe(self) -> None:
        try:
            self._stub.GetServiceInfo(
                pb.GetServiceInfoRequest(), timeout=self._probe_timeout_s, wait_for_ready=True
            )
            self._probe_result = True
        except Exception:  # unreachable, refused, or the client was closed meanwhile
            self._probe_result = False

    def _apply_probe(self, now_s: float) -> None:
        ok, self._probe_result = self._probe_result, None
        self._session.apply_probe(bool(ok), now_s)
