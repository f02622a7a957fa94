"""The drafting service (drafter.v1 over gRPC): ``drafter serve`` or, in process::

from drafter_service.service import ServeConfig, start_server

server = await start_server(ServeConfig(port=0, vocab_size=128256))
...  # clients connect to server.address
await server.stop()
"""

from drafter_service.service.config import ServeConfig
from drafter_service.service.server import DrafterServer, start_server

__all__ = ["DrafterServer", "ServeConfig", "start_server"]
