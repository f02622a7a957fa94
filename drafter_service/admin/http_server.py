"""The admin API's HTTP server: uvicorn on its own port, as a task of the event loop that
also runs the gRPC server. The socket is bound up front (a port in use fails the start,
port 0 gets a free one), and uvicorn leaves signal handling to the host process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
from collections.abc import Callable, Generator

import uvicorn

from drafter_service.admin.admin_jobs import AdminJobs
from drafter_service.admin.app import create_app
from drafter_service.admin.routes import AdminContext
from drafter_service.engine.catalog import Catalog
from drafter_service.service.admin_token import load_token
from drafter_service.service.grpc_server import Phase, host_port
from drafter_service.service.settings import ServeConfig

log = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # `drafter serve` owns SIGTERM/SIGINT and stops us through AdminServer.stop


class AdminServer:
    """Start with :meth:`start` (returns the bound port), stop with :meth:`stop`."""

    def __init__(
        self,
        config: ServeConfig,
        catalog: Callable[[], Catalog | None],
        phase: Callable[[], Phase],
    ) -> None:
        self.config = config
        self.jobs = AdminJobs()
        self._context = AdminContext(config, catalog, phase, self.jobs)
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Binds and serves; ValueError for a bad token, OSError for an address in use."""
        token = load_token(self.config.admin_token_file, os.environ)
        app = create_app(self._context, token)
        uv_config = uvicorn.Config(
            app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=max(1, math.ceil(self.config.grace_period_s)),
            server_header=False,
        )
        self._server = _EmbeddedServer(uv_config)
        host, port = self.config.admin_host, self.config.admin_port
        sock = _bind(host, port)  # from here on the server owns it (and closes it)
        bound: int = sock.getsockname()[1]
        self._task = asyncio.create_task(self._server.serve([sock]), name="drafter-admin")
        while not self._server.started:  # startup takes one loop turn or two
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise OSError(f"admin API on {host_port(host, bound)} stopped during startup")
            await asyncio.sleep(0.005)
        log.info(
            "admin API on http://%s (token %s)",
            host_port(host, bound),
            "configured" if token is not None else "not configured: read-only",
        )
        return bound

    async def stop(self) -> None:
        """Lets requests in flight finish (within the grace period), drops queued jobs and
        waits for the running one, also when the server failed (its error is raised, once).
        Idempotent."""
        try:
            if self._server is not None and self._task is not None:
                self._server.should_exit = True
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        finally:
            self._task = None  # a failed server is raised once
            await self.jobs.close()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(f"admin API: cannot listen on {host}:{port}: {exc}") from None
    return sock
