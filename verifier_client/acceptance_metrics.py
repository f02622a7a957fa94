"""Decode-worker metrics (docs/metrics.md): acceptance as vLLM exports it, prefix ``sssd:``,
so vLLM dashboards port by replacing ``vllm:``. Mean acceptance length (bonus included)::

    1 + rate(sssd:spec_decode_num_accepted_tokens_total[5m])
      / rate(sssd:spec_decode_num_drafts_total[5m])

Recorded per step (a few reductions, a counter update per metric and accepted position),
never per node; any engine can call :meth:`WorkerMetrics.record_acceptance`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from verifier_client.results import Outcome, StepResult

if TYPE_CHECKING:  # torch stays optional for importers of this module's types
    from torch import Tensor

    from verifier_client.verification.tree_verification import VerifyResult

__all__ = ["ROUND_TRIP_BUCKETS_S", "WAIT_BUCKETS_S", "WorkerMetrics"]

ROUND_TRIP_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1,
    0.25, 0.5, 1.0,
)  # fmt: skip
"""Histogram buckets of the drafter round trip: dense around the usual 2-5 ms deadline."""

WAIT_BUCKETS_S = (0.00001, 0.000025, 0.00005, 0.0001, 0.0002, 0.0003, *ROUND_TRIP_BUCKETS_S)
"""Histogram buckets of a step's wait for drafts: a step of pre-draft hits waits tens of
microseconds (the issue's target: p99 <= 0.3 ms), a plain one a round trip."""

WORKER_METRIC_PREFIX = "sssd:"
"""vLLM's metric names with ``vllm:`` replaced: its dashboards port by the same replacement."""

_FALLBACK_REASONS = (Outcome.DEADLINE, Outcome.UNAVAILABLE, Outcome.BREAKER_OPEN, Outcome.ERROR)


class WorkerMetrics:
    """The worker's Prometheus metrics, in their own registry unless one is given."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry

        def counter(name: str, documentation: str, *labels: str) -> Counter:
            return Counter(
                WORKER_METRIC_PREFIX + name, documentation, labels, registry=self.registry
            )

        self.num_drafts = counter(
            "spec_decode_num_drafts",
            "Drafts verified (one per request per step with a non-empty tree).",
        )
        self.num_draft_tokens = counter(
            "spec_decode_num_draft_tokens", "Draft tokens proposed (tree nodes, root excluded)."
        )
        self.num_accepted_tokens = counter(
            "spec_decode_num_accepted_tokens", "Draft tokens accepted (bonus token excluded)."
        )
        self.num_accepted_tokens_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens at each position (depth - 1) of the accepted path.",
            "position",
        )
        self.round_trip = Histogram(
            WORKER_METRIC_PREFIX + "drafter_round_trip_seconds",
            "One step's drafter call as the worker sees it (fallbacks at the deadline included).",
            buckets=ROUND_TRIP_BUCKETS_S,
            registry=self.registry,
        )
        self.fallbacks = counter(
            "drafter_fallbacks", "Steps decoded without drafts, by reason.", "reason"
        )
        self.resyncs = counter("drafter_resyncs", "Requests the drafter answered RESYNC for.")
        self.wait = Histogram(
            WORKER_METRIC_PREFIX + "drafter_wait_seconds",
            "Time a step waited for its drafts (step() entry to trees in hand).",
            buckets=WAIT_BUCKETS_S,
            registry=self.registry,
        )
        self.budget = Gauge(
            WORKER_METRIC_PREFIX + "draft_budget",
            "Draft budget (nodes per request) of the last step.",
            registry=self.registry,
        )
        # Label children resolved once: a step touches them without a lookup.
        self._fallback = {o: self.fallbacks.labels(reason=o.value) for o in _FALLBACK_REASONS}
        self._positions: list[Counter] = []

    def record_step(
        self,
        result: VerifyResult,
        draft_sizes: Tensor | Sequence[int],
        drafts: StepResult | None = None,
        round_trip_s: float | None = None,
        budget: int | None = None,
    ) -> None:
        """Records one verified decode step of a batch: its verification, the draft nodes
        per request (root excluded; 0 = no tree), and its drafter call (see
        record_drafter_call; ``drafts`` None: the worker has no drafter)."""
        self.record_acceptance(
            draft_sizes, int(result.accept_lengths.sum()), result.accepted_per_position.tolist()
        )
        self.record_drafter_call(drafts, round_trip_s, budget)

    def record_acceptance(
        self,
        draft_sizes: Tensor | Sequence[int],
        accepted_tokens: int,
        accepted_per_position: Sequence[int],
    ) -> None:
        """Records one step's verification, whatever verified it: draft tokens per request
        (root excluded; 0 = no draft), draft tokens accepted (bonus excluded), and the
        requests whose accepted path reached each position."""
        tolist = getattr(draft_sizes, "tolist", None)
        sizes: list[int] = tolist() if callable(tolist) else [int(s) for s in draft_sizes]
        self.num_drafts.inc(sum(1 for s in sizes if s > 0))
        self.num_draft_tokens.inc(sum(sizes))
        self.num_accepted_tokens.inc(accepted_tokens)
        for position, count in enumerate(accepted_per_position):
            if count:
                self._position(position).inc(count)

    def record_drafter_call(
        self, drafts: StepResult | None, round_trip_s: float | None, budget: int | None
    ) -> None:
        """Records one step's drafter call: its outcome, duration and budget (None = unknown),
        and the client's wait (``drafts.wait_s``)."""
        if drafts is not None:
            if drafts.outcome in self._fallback:
                self._fallback[drafts.outcome].inc()
            if drafts.request_outcomes:  # empty in most steps: skip the scan
                self.resyncs.inc(len(drafts.resynced))
            if drafts.wait_s is not None:
                self.wait.observe(drafts.wait_s)
        if round_trip_s is not None:
            self.round_trip.observe(round_trip_s)
        if budget is not None:
            self.budget.set(budget)

    def serve(self, port: int, addr: str = "0.0.0.0") -> WSGIServer:
        """Serves ``/metrics`` on ``addr:port`` in a daemon thread (0 = any free port: read
        ``server.server_port``; stop: ``shutdown()``, ``server_close()``); OSError naming
        ``addr:port`` when it cannot bind. Always the text format, never OpenMetrics (not
        ``start_http_server``, which answers as asked): in OpenMetrics prometheus-client
        writes ``sssd:x`` as ``sssd_x`` (prometheus/client_python#1177), breaking every
        vLLM-style query."""
        if not 0 <= port <= 65535:
            raise ValueError(f"metrics port must be in [0, 65535], got {port}")
        metrics_app = make_wsgi_app(self.registry)

        def text_format_app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            body: Iterable[bytes] = metrics_app({**environ, "HTTP_ACCEPT": "text/plain"},
                                                start_response)  # fmt: skip
            return body

        try:
            server = make_server(
                addr, port, text_format_app, ThreadingWSGIServer, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {addr}:{port}: {exc}") from None
        threading.Thread(target=server.serve_forever, name="worker-metrics-http",
                         daemon=True).start()  # fmt: skip
        return server

    def _position(self, position: int) -> Counter:
        while len(self._positions) <= position:
            self._positions.append(
                self.num_accepted_tokens_per_pos.labels(position=str(len(self._positions)))
            )
        return self._positions[position]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """No access log on stderr: Prometheus scrapes every few seconds."""
