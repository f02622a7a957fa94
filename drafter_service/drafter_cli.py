"""``drafter serve``: run the drafting service until SIGTERM or SIGINT.

Prints exactly one line to stdout, ``drafter listening on HOST:PORT``, once the service
is SERVING; logs go to stderr. Exit status: 0 after a graceful shutdown, 2 for a bad
setting or snapshot, 1 when the port cannot be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Sequence

from drafter_service.malloc_tuning import ENV as MALLOC_ENV
from drafter_service.malloc_tuning import fix_mmap_threshold
from drafter_service.service.admin_token import load_token
from drafter_service.service.setting_values import DEFAULT_VOCAB_SIZE
from drafter_service.service.settings import ServeConfig
from drafter_service.serving import start_server
from drafter_service.snapshot.array_files import DamagedDataError

log = logging.getLogger("drafter")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="drafter", description="SSSD drafting service.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the gRPC drafting service",
        description="Every flag also reads DRAFTER_<NAME> (e.g. DRAFTER_VOCAB_SIZE) and the "
        "key <name> of the TOML file given by --config-file (e.g. vocab_size = 32000); a "
        "flag wins over the variable, the variable over the file. Default: an empty live "
        f"datastore in ./drafter-data with the Llama-3 vocabulary ({DEFAULT_VOCAB_SIZE} "
        "token ids).",
    )
    ServeConfig.add_arguments(serve)
    return parser


async def serve(config: ServeConfig) -> None:
    """Runs until SIGTERM/SIGINT, then shuts down gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before loading: a signal then stops cleanly
        loop.add_signal_handler(sig, stop.set)
    threshold = fix_mmap_threshold(os.environ)
    if threshold is not None:
        log.info("malloc: buffers of %d KiB or more are returned to the system when freed "
                 "(M_MMAP_THRESHOLD fixed; %s overrides)", threshold >> 10, MALLOC_ENV)  # fmt: skip
    server = await start_server(config)
    # Every object alive after startup (~90,000) out of the cyclic collector's reach: else
    # each full collection traverses them all holding the GIL (~30 ms on 2 cores, a step
    # waiting for it). Frozen objects are still freed by refcount.
    gc.collect()
    gc.freeze()
    log.info("froze %d objects that outlive startup (gc.freeze)", gc.get_freeze_count())
    try:
        print(f"drafter listening on {server.address}", flush=True)
        await stop.wait()
        log.info("signal received: shutting down (grace %.1f s)", config.grace_period_s)
        await server.stop()
    finally:
        # Back into the collector's reach: interpreter shutdown never collects frozen
        # objects, so their cycles would outlive it unfinalized (nanobind reports the
        # native datastores among them as leaked).
        gc.unfreeze()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = ServeConfig.from_namespace(args)
        if config.admin_port >= 0 or config.bootstrap_peers:  # checked before anything starts
            load_token(config.admin_token_file, os.environ)
        logging.basicConfig(
            level=config.log_level.upper(),
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        asyncio.run(serve(config))
    except DamagedDataError as exc:  # refuses rather than serve less than it acknowledged
        print(f"drafter serve: error: damaged data: {exc}", file=sys.stderr)
        return 3
    except ValueError as exc:  # a bad setting, SnapshotError included
        print(f"drafter serve: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"drafter serve: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
