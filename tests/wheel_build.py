"""The packaging tests' one way to build a wheel: offline, from this checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def build_wheel(project: Path, out: Path, timeout_s: float) -> Path:
    """``project``'s wheel, built into ``out`` with no index and no build isolation (the
    build directory `make setup` left makes the project's own build incremental)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(out), str(project)],
        capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("*.whl")
    return wheel
