"""``/metrics`` over HTTP from a thread, for one server's own registry."""

from __future__ import annotations

import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """No access log on stderr: Prometheus scrapes every few seconds."""


class _Server4(ThreadingWSGIServer):
    address_family = socket.AF_INET


class _Server6(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class MetricsExporter:
    """``/metrics`` of one registry over HTTP, served from a thread (thread per scrape)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        """Binds ``host:port`` (0: a free port) and starts serving; raises OSError."""
        bare = host.strip("[]")
        family = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)[0][0]
        server_class = _Server6 if family == socket.AF_INET6 else _Server4
        self._httpd = make_server(
            bare, port, make_wsgi_app(registry), server_class, handler_class=_QuietHandler
        )
        self.port: int = self._httpd.server_port
        # A short poll interval keeps stop() quick (shutdown waits for the poll loop).
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="metrics-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stops serving and closes the socket (blocks for up to one poll interval)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
