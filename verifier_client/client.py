"""Synchronous drafter client for decode loops: one ``step`` per decode step, bounded by a
deadline. A slow or down drafter, or an open circuit, means no drafts: decoding goes on
without speculation. What a step, the stream and the probe decide is ClientCore's
(client_core.py, shared with the asyncio client); this class does the I/O.

Not thread-safe: call ``add_request``/``step``/``finish``/``abort`` from the decode loop's
thread (``ingest`` and the counters may be used from anywhere).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from time import perf_counter

import grpc

from sssd_drafter.v1 import drafter_pb2 as pb
from verifier_client.background_sender import BackgroundSender
from verifier_client.channel import (
    CAUSE_TIMEOUT_S,
    CallFailed,
    DrafterUnreachable,
    failure_of,
    raise_unless_unreachable,
    sync_channel,
)
from verifier_client.client_core import ClientCore, ProbeCall
from verifier_client.results import Outcome, StepResult
from verifier_client.session import StepPlan
from verifier_client.streams import SyncStream

__all__ = ["DrafterClient"]


class DrafterClient(ClientCore[SyncStream]):
    """Sync client of a DrafterService at ``target`` (``host:port``).

    Args:
        deadline_ms: per-step budget for the whole exchange; past it the step returns
            without drafts (``Outcome.DEADLINE``).
        mode: ``"stream"``: one bidirectional stream for all steps (reopened when it
            breaks); ``"unary"``: one Draft call per step.
        budget: draft nodes per request from the batch size (default: the H100 SXM rule).
        tokenizer_fingerprint: sha256 of tokenizer.json; the drafter refuses a mismatch
            (``wait_ready`` raises ValueError).
        channel_options: gRPC channel options over this package's defaults.
        credentials: TLS credentials; None = plaintext.
        token: bearer token (the drafter's ``--grpc-tokens-file`` entry) for every call.
        ingest_queue_size: background finish/abort/ingest work waiting; past it, work is
            dropped and counted (``stats.ingest_drops``).
        breaker: circuit breaker thresholds (default ``BreakerConfig()``).
        resync_retry: resend RESYNCed requests within the step when time is left.
        background_timeout_s: deadline of each background Finish/Ingest call.
        probe_timeout_s: how long a breaker probe waits for the drafter.
    """

    _open_channel = staticmethod(sync_channel)
    _stream_type = SyncStream
    _sender_type = BackgroundSender
    _sender: BackgroundSender
    _channel: grpc.Channel

    def wait_ready(self, timeout_s: float = 10.0) -> pb.GetServiceInfoResponse:
        """Connects (up to ``timeout_s``), checks the tokenizer, adopts the drafter's limits
        and returns its service info; call it at startup so the first steps draft. Raises
        DrafterUnreachable (UNAVAILABLE) naming the cause when the drafter stays unreachable."""
        request = pb.GetServiceInfoRequest()
        try:
            info: pb.GetServiceInfoResponse = self._stub.GetServiceInfo(
                request, timeout=timeout_s, wait_for_ready=True
            )
        except grpc.RpcError as e:
            raise_unless_unreachable(e)
            try:  # once more without waiting: gRPC then says why it cannot connect
                info = self._stub.GetServiceInfo(request, timeout=CAUSE_TIMEOUT_S)
            except grpc.RpcError as last:
                raise_unless_unreachable(last)
                raise DrafterUnreachable(self.target, timeout_s, str(last.details())) from None
        self._adopt(info)
        return info

    def step(
        self, commits: Mapping[str, Iterable[int]], budgets: Mapping[str, int] | None = None
    ) -> StepResult:
        """Drafts for the requests in ``commits`` (id → tokens committed since the last
        step, possibly none), within the deadline; ``budgets`` overrides the rule."""
        outcome = self._begin_step(commits, budgets)
        while not isinstance(outcome, StepResult):
            outcome = self._advance(outcome, self._io(outcome))
        return outcome

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Waits until the background work queued so far is sent; False on timeout, or when
        a call that carried something to store failed since the previous flush (it is lost;
        ``stats.background_failures``)."""
        return self._sender.flush(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Sends the queued background work (up to ``timeout_s``), then closes."""
        if self._mark_closed():
            self._release(self._sender.close(timeout_s))
            self._channel.close()

    def __enter__(self) -> DrafterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _launch_probe(self) -> ProbeCall:
        probe: ProbeCall = self._stub.GetServiceInfo.future(
            pb.GetServiceInfoRequest(), timeout=self._probe_timeout_s, wait_for_ready=True
        )
        return probe

    def _io(self, plan: StepPlan) -> pb.DraftResponse | CallFailed:
        """The answer to ``plan`` by its deadline, or why there is none."""
        stream = self._stream_to_send()
        if stream is not None:
            return stream.exchange(plan.message, plan.deadline_s)
        timeout_s = plan.deadline_s - perf_counter()
        if timeout_s <= 0:
            return CallFailed(Outcome.DEADLINE)
        # A blocking call's own deadline fires ~2-3 ms late (gRPC core timers), which
        # would double a 3 ms step; waiting on the future is exact to ~0.5 ms.
        call = self._stub.Draft.future(plan.message, timeout=timeout_s)
        try:
            response: pb.DraftResponse = call.result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            call.cancel()
            return CallFailed(Outcome.DEADLINE)
        except grpc.RpcError as error:
            return failure_of(error)
        return response
