"""The real Redis server of the shared ingest stream tests (benchmarks/redis_server.py),
fsyncing every write; ``free_port`` for the processes beside it."""

from __future__ import annotations

from benchmarks.redis_server import RedisServer, free_port

__all__ = ["RedisServer", "free_port"]
