"""The real Redis server of the shared ingest stream tests (drafter_bench/redis_server.py),
fsyncing every write; ``free_port`` for the processes beside it."""

from __future__ import annotations

from drafter_bench.redis_server import RedisServer, free_port

__all__ = ["RedisServer", "free_port"]
