"""The grpc.aio server: DrafterService, health checking, reflection, graceful shutdown.

``listen`` binds and serves health (NOT_SERVING; drafting answers UNAVAILABLE) and
metrics, ``load`` opens the datastores and turns SERVING, ``stop`` lets calls in flight
finish within the grace period, then stores queued generations and closes the datastores.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import time
from collections.abc import Callable
from typing import Literal, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from drafter_service.edge.grpc_auth import ClientAuth, TokenFile, reloading_tls
from drafter_service.edge.servicer import ANSWERED_CODES, DrafterServicer, status_code
from drafter_service.edge.wire import SERVICE_NAME, CallGate, add_drafter_service
from drafter_service.engine.calls import CallLimits
from drafter_service.engine.catalog import Catalog
from drafter_service.engine.draft_engine import DraftEngine
from drafter_service.engine.ingest_queue import GenerationIngester
from drafter_service.engine.request_table import RECENT_BYTES_PER_TOKEN, RequestTable, StateCost
from drafter_service.metrics.drafter_metrics import DrafterMetrics
from drafter_service.metrics.metrics_http import MetricsEndpoint, serve_metrics, stop_metrics
from drafter_service.service.open_catalog import open_catalog
from drafter_service.service.setting_values import DEFAULT_DATASTORE
from drafter_service.service.settings import ServeConfig

log = logging.getLogger(__name__)


def package_version() -> str:
    try:
        return importlib.metadata.version("sssd-drafter")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def client_auth(config: ServeConfig) -> ClientAuth:
    """The authentication policy the settings ask for (ValueError names a bad file)."""
    tokens = TokenFile(config.grpc_tokens_file) if config.grpc_tokens_file else None
    auth = ClientAuth(tokens, mutual_tls=config.tls_client_ca_file is not None)
    if not auth.enabled and config.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "gRPC on %s has no authentication: any process that reaches the port can ingest "
            "and touch any request; set --grpc-tokens-file and/or --tls-client-ca-file",
            config.host,
        )
    return auth


def server_credentials(config: ServeConfig) -> grpc.ServerCredentials | None:
    """TLS for the gRPC port (mutual with a client CA), following renewed files; None: none."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    try:
        return reloading_tls(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)
    except OSError as exc:
        raise ValueError(f"cannot read a TLS file: {exc}") from None


def grpc_options(config: ServeConfig) -> list[tuple[str, int]]:
    """Channel arguments: message sizes, keepalive, the pending-call bound, no port sharing."""
    options = [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.keepalive_time_ms", round(config.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", round(config.keepalive_timeout_s * 1000)),
        # Recent gRPC cores time a keepalive ping out with the general ping timeout
        # (default 60 s) rather than keepalive_timeout_ms alone: set both.
        ("grpc.http2.ping_timeout_ms", round(config.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", int(config.keepalive_permit_without_calls)),
        (
            "grpc.http2.min_recv_ping_interval_without_data_ms",
            round(config.keepalive_min_ping_interval_s * 1000),
        ),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.so_reuseport", 0),  # a port in use is an error, not a second listener
    ]
    if pending := config.max_pending_rpcs:  # random early detection from half of it on
        options.append(("grpc.server.max_pending_requests", pending // 2))
        options.append(("grpc.server.max_pending_requests_hard_limit", pending))
    return options


Phase = Literal["loading", "ok", "stopping"]


class Sidecar(Protocol):
    """A server beside the gRPC service on its event loop (the REST admin API): started
    once the gRPC port is bound, stopped before the datastores close."""

    async def start(self) -> int: ...  # binds and serves; returns the bound port

    async def stop(self) -> None: ...


SidecarFactory = Callable[[Callable[[], Catalog | None], Callable[[], Phase]], Sidecar]
"""Makes the sidecar from two views of the server: its catalog once loaded, its phase."""


class DrafterServer:
    """One drafter service on one port. Use :func:`start_server`, or ``listen`` then ``load``."""

    def __init__(
        self,
        config: ServeConfig,
        admin: SidecarFactory | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._clock = clock  # request idleness (the TTL), injectable for tests
        self.port = 0
        self.metrics_port: int | None = None  # bound by listen(); None: disabled
        self.admin_port: int | None = None  # REST admin API, bound by listen(); None: disabled
        self._admin = None if admin is None else admin(lambda: self._catalog, self._phase)
        self.health = health.aio.HealthServicer()
        version = package_version()
        self.metrics = DrafterMetrics(version, ANSWERED_CODES)
        self.registry = CollectorRegistry(auto_describe=False)  # this server's metrics only
        self.registry.register(self.metrics)
        self.auth = client_auth(config)
        self._servicer = DrafterServicer(version, config.max_message_bytes, self.metrics, self.auth)
        # Credentials are checked before a request is read, then the load: a unary Draft
        # call the service would refuse is not read either.
        self.gate = CallGate(
            self.auth, self._servicer.overloaded, status_code, self.metrics.count_error
        )
        self._metrics_endpoint: MetricsEndpoint | None = None
        self._server: grpc.aio.Server | None = None
        self._catalog: Catalog | None = None
        self.engine: DraftEngine | None = None  # once loaded
        self._sweeper: asyncio.Task[None] | None = None
        self._stopping: asyncio.Future[None] | None = None

    @property
    def address(self) -> str:
        return host_port(self.config.host, self.port)

    async def listen(self) -> None:
        """Binds the port and starts serving health (NOT_SERVING) and reflection."""
        server = grpc.aio.server(
            options=grpc_options(self.config),
            interceptors=[self.gate],
            maximum_concurrent_rpcs=self.config.max_concurrent_rpcs or None,
        )
        add_drafter_service(self._servicer, server, self._servicer.overloaded)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        self._server = server
        target = host_port(self.config.host, self.config.port)  # port 0: the kernel picks one
        try:
            credentials = server_credentials(self.config)
            if credentials is None:
                self.port = server.add_insecure_port(target)
            else:
                self.port = server.add_secure_port(target, credentials)
        except RuntimeError as exc:  # what grpc raises for a port it could not bind
            raise OSError(f"cannot listen on {target}: {exc}") from None
        await server.start()
        if self.config.metrics_port >= 0:
            host = self.config.metrics_host or self.config.host
            self._metrics_endpoint = await asyncio.to_thread(
                serve_metrics, self.registry, host, self.config.metrics_port
            )
            self.metrics_port = self._metrics_endpoint[0].server_port
            log.info("metrics on http://%s/metrics", host_port(host, self.metrics_port))
        if self._admin is not None:
            self.admin_port = await self._admin.start()

    async def load(self) -> None:
        """Opens the datastores (in a thread: snapshot loads, log replay) and turns SERVING."""
        config = self.config
        catalog = await asyncio.to_thread(open_catalog, config)
        self._catalog = catalog
        limits = CallLimits(
            catalog,
            max_requests_per_call=config.max_requests_per_call,
            max_tokens_per_request=config.max_tokens_per_request,
            max_budget=config.max_budget,
            default_datastore=DEFAULT_DATASTORE,
        )
        configs = [s.drafter.config for s in catalog.slots.values()]
        cost = StateCost(
            max(c.input_max_depth for c in configs),
            catalog.tokenizer.vocab_size,
            RECENT_BYTES_PER_TOKEN if any(c.recent_samples > 0 for c in configs) else 0,
        )
        table = RequestTable(
            config.request_ttl_s, config.max_request_states, config.max_request_state_bytes,
            cost, clock=self._clock,
        )  # fmt: skip
        ingester = GenerationIngester(config.ingest_queue_size, config.background_nice)
        self.engine = DraftEngine(
            catalog, table, ingester, config.max_inflight_calls, self.metrics,
            inline_max_work=config.inline_max_work, finish_durable=config.finish_durable,
            max_queue_s=config.max_queue_ms / 1e3, clients_apart=config.recent_scope == "client",
        )  # fmt: skip
        self.metrics.attach(catalog, table, ingester)
        self._servicer.attach(self.engine, limits)
        self._sweeper = asyncio.create_task(self._sweep(), name="drafter-ttl-sweep")
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "serving on %s: datastores %s, vocab_size %d",
            self.address,
            sorted(catalog.slots),
            catalog.tokenizer.vocab_size,
        )

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown (``grace`` defaults to the configured period). Idempotent."""
        if self._stopping is not None:
            return await asyncio.shield(self._stopping)
        self._stopping = asyncio.get_running_loop().create_future()
        admin_failure: Exception | None = None
        try:
            await self.health.enter_graceful_shutdown()
            if self._sweeper is not None:
                self._sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._sweeper
            if self._admin is not None:  # before the datastores close: waits for its job
                try:
                    await self._admin.stop()
                except Exception as exc:  # its server failed: raised once the rest stopped
                    admin_failure = exc
            if self._server is not None:
                await self._server.stop(self.config.grace_period_s if grace is None else grace)
            if self._metrics_endpoint is not None:
                await asyncio.to_thread(stop_metrics, self._metrics_endpoint)
            if self.engine is not None:
                await self.engine.close()
            if self._catalog is not None:
                await asyncio.to_thread(self._catalog.close)
        finally:
            self._stopping.set_result(None)
        log.info("stopped")
        if admin_failure is not None:
            raise admin_failure

    def _phase(self) -> Phase:
        if self._stopping is not None:
            return "stopping"
        return "loading" if self.engine is None else "ok"

    async def _sweep(self) -> None:
        # Idle requests are also dropped at every call; this frees memory when calls stop.
        interval_s = min(max(self.config.request_ttl_s / 4, 0.05), 10.0)
        while True:
            await asyncio.sleep(interval_s)
            if self.engine is not None:
                self.engine.expire_idle()


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets (gRPC reads ``::1:50051`` as a host alone)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
