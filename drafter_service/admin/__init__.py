"""The REST admin API of ``drafter serve`` (FastAPI on its own port, same event loop as
gRPC): probes, datastore stats, snapshots, rebuilds, corpora and live settings."""

from drafter_service.admin.app import create_app
from drafter_service.admin.http_server import AdminServer

__all__ = ["AdminServer", "create_app"]
