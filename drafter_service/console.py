"""The console scripts: each names the extra it needs when that is not installed (the
library install is numpy and the compiled core alone), not a ``ModuleNotFoundError``."""

from __future__ import annotations

import importlib
import sys

OURS = frozenset({"drafter_service", "datastore_builder", "verifier_client", "drafter_bench",
                  "sssd_drafter"})  # fmt: skip
"""A missing module of these is a broken install, not a missing extra: it is raised."""


def run(prog: str, module: str, extra: str) -> int:
    """Runs ``module.main()``; exit status 2, naming ``extra``, when a module is missing."""
    try:
        main = importlib.import_module(module).main
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if not missing or missing in OURS:
            raise
        print(f"{prog}: needs the {extra!r} extra; {missing!r} is not installed: "
              f"pip install 'sssd-drafter[{extra}]'", file=sys.stderr)  # fmt: skip
        return 2
    return int(main())


def drafter() -> int:
    return run("drafter", "drafter_service.drafter_cli", "service")


def datastore_builder() -> int:
    return run("datastore-builder", "datastore_builder.builder_cli", "builder")


def drafter_bench() -> int:
    return run("drafter-bench", "drafter_bench.bench_cli", "bench")
