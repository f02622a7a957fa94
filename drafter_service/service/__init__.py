"""The drafting service process (sssd_drafter.v1 over gRPC): its settings, opening its
datastores, and the server that puts the edge, the engine and the metrics together."""

from drafter_service.service.grpc_server import DrafterServer
from drafter_service.service.settings import ServeConfig

__all__ = ["DrafterServer", "ServeConfig"]
