"""The drafter process as one unit: the gRPC service with the REST admin API beside it
(``await start_server(ServeConfig(port=0))``, then ``server.address``, ``await
server.stop()``). The service knows the admin API only as a sidecar
(``service.grpc_server.Sidecar``); this module is where the two meet."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from drafter_service.admin.http_server import AdminServer
from drafter_service.service.grpc_server import DrafterServer
from drafter_service.service.settings import ServeConfig


def drafter_server(
    config: ServeConfig, clock: Callable[[], float] = time.monotonic
) -> DrafterServer:
    """The server, not yet listening, with the admin API wired in when ``admin_port >= 0``
    (``clock``: what request idleness is measured by, see ``DrafterServer``)."""
    admin = partial(AdminServer, config) if config.admin_port >= 0 else None
    return DrafterServer(config, admin=admin, clock=clock)


async def start_server(
    config: ServeConfig, clock: Callable[[], float] = time.monotonic
) -> DrafterServer:
    """Starts a drafter service and returns once it is SERVING (see ``DrafterServer.port``,
    ``.address``, ``await .stop(grace)``). Raises ValueError for a bad setting or snapshot
    (nothing is left running)."""
    server = drafter_server(config, clock)
    try:
        await server.listen()
        await server.load()
    except BaseException:
        await server.stop(0)
        raise
    return server
