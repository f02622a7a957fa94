"""Builds and runs the native core tests (tests/native/core_test.cc) under ASan + UBSan.

The C++ core is exercised directly, without the Python bindings, where the sanitizers or
threads are the point: suffix arrays on adversarial texts, sub-index search bounds, the
input trie's growth, retrieval and fusion over random inputs (invariants and
determinism only; the Python property tests compare them with tests/reference.py), the
errors bad input raises, and the multi-threaded Drafter. The tests use GoogleTest (the
system's: Debian libgtest-dev, which `make tools` installs). The binary is configured
with ``-DDRAFTER_NATIVE_TESTS=ON`` into ``build/native-asan`` (incremental: a rebuild only
recompiles what changed). Missing tools or a missing GoogleTest fail the test instead of
skipping it, so a CI image without them cannot pass silently.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = ROOT / "build" / "native-asan"
BUILD_TIMEOUT_S = 3600  # bounds failure only: a loaded 2-core machine took 25 minutes
RUN_TIMEOUT_S = 600  # (same; the run takes seconds)
OUTPUT_TAIL_CHARS = 20_000


def _find_tool(*names: str) -> str | None:
    """A tool on PATH or next to this interpreter (the virtual environment's bin)."""
    venv_bin = Path(sys.executable).parent
    for name in names:
        found = shutil.which(name) or shutil.which(name, path=str(venv_bin))
        if found:
            return found
    return None


def _find_cxx() -> str | None:
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    return _find_tool("c++", "g++", "clang++")


def _tail(text: str) -> str:
    return text if len(text) <= OUTPUT_TAIL_CHARS else "...\n" + text[-OUTPUT_TAIL_CHARS:]


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Runs `cmd`, failing the test with its output if it fails or times out."""
    try:
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        pytest.fail(
            f"{' '.join(cmd)} timed out after {timeout:.0f} s; output:\n{_tail(out or '')}",
            pytrace=False,
        )
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} exited with {proc.returncode}; output:\n{_tail(proc.stdout)}",
            pytrace=False,
        )
    return proc.stdout


def test_native_core_under_sanitizers() -> None:
    cmake = _find_tool("cmake")
    ninja = _find_tool("ninja")
    cxx = _find_cxx()
    tools = (
        ("cmake", cmake),
        ("ninja", ninja),
        ("a C++ compiler ($CXX, c++, g++ or clang++)", cxx),
    )
    missing = [what for what, path in tools if path is None]
    if cmake is None or ninja is None or cxx is None:
        pytest.fail(
            "cannot build the native core tests: missing "
            + ", ".join(missing)
            + " (install them, e.g. `pip install cmake ninja` and a C++17 compiler)",
            pytrace=False,
        )

    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    # Serialise concurrent runs (e.g. pytest-xdist or two checkouts' sessions)
    # that would otherwise build into the same directory at once.
    with open(BUILD_DIR.parent / "native-asan.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        configure = [
            cmake,
            "-S",
            str(ROOT),
            "-B",
            str(BUILD_DIR),
            "-G",
            "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={ninja}",
            "-DDRAFTER_NATIVE_TESTS=ON",
        ]
        if not (BUILD_DIR / "CMakeCache.txt").exists():
            configure.append(f"-DCMAKE_CXX_COMPILER={cxx}")
        _run(configure, BUILD_TIMEOUT_S)
        _run([cmake, "--build", str(BUILD_DIR), "--target", "core_test"], BUILD_TIMEOUT_S)

        binary = BUILD_DIR / "core_test"
        assert binary.is_file(), f"the build did not produce {binary}"
        # No GTEST_* settings from the environment (a filter would pass with tests left out).
        env = {k: v for k, v in os.environ.items() if not k.startswith("GTEST_")}
        env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=1"
        env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
        # --gtest_brief=1: only failures are printed, then the summary.
        out = _run([str(binary), "--gtest_brief=1"], RUN_TIMEOUT_S, env=env)

    ran = re.search(r"^\[==========\] (\d+) tests? from \d+ test suites? ran\.", out, re.M)
    passed = re.search(r"^\[  PASSED  \] (\d+) tests?\.", out, re.M)
    if not ran or not passed or passed.group(1) != ran.group(1) or int(ran.group(1)) == 0:
        pytest.fail(f"not every native test ran and passed; output:\n{_tail(out)}",
                    pytrace=False)
