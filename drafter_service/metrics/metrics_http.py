"""``/metrics`` over HTTP for one server's own registry, by prometheus_client's server."""

from __future__ import annotations

import contextlib
import socket
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

MetricsEndpoint = tuple[WSGIServer, threading.Thread]  # the server and its daemon thread


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> MetricsEndpoint:
    """Serves ``registry`` on ``host:port`` (0: a free port, see ``server_port``), a thread
    per scrape; OSError naming ``host:port`` when it cannot bind."""
    try:  # prometheus_client picks the address family from the bare address
        return start_http_server(port, addr=host.strip("[]"), registry=registry)
    except OSError as exc:
        raise OSError(f"cannot serve metrics on {host}:{port}: {exc}") from None


def stop_metrics(endpoint: MetricsEndpoint) -> None:
    """Stops serving, then closes the socket: a scrape after this is refused."""
    server, thread = endpoint
    stopping = threading.Thread(target=server.shutdown, name="metrics-http-stop")
    stopping.start()
    # The serving loop looks at the shutdown flag between 0.5 s selects, a poll interval
    # prometheus_client does not let a caller shorten; a connection ends the select now.
    address = server.socket.getsockname()[:2]
    while stopping.is_alive():
        with contextlib.suppress(OSError):
            socket.create_connection(address, timeout=1).close()
        stopping.join(0.01)
    server.server_close()
    thread.join()
