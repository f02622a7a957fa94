"""deploy/local-run.sh, run for real: a drafter, Prometheus and the reference worker start,
and when the script stops (its DURATION_S ends, or Ctrl-C) no process it started is left.

Every process the script starts inherits a marker environment variable, so the test finds
them all in /proc whatever their parent is now (an orphan is re-parented to PID 1). Needs
prometheus/promtool (`make tools`) and Linux's /proc; about 30 s.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "deploy" / "local-run.sh"
MARKER = "SSSD_LOCAL_RUN_TEST"
RESET_SIGINT_AND_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(
        shutil.which("prometheus") is None or shutil.which("promtool") is None,
        reason="prometheus/promtool not installed (make tools)",
    ),
    pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def marked_processes(token: str) -> dict[int, str]:
    """Live processes (pid → command line) whose environment holds MARKER=token."""
    needle = f"{MARKER}={token}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = next(line for line in (entry / "status").read_text().splitlines()
                         if line.startswith("State:"))  # fmt: skip
            if "zombie" in state:  # exited, waiting for its parent to reap it
                continue
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, StopIteration):  # gone meanwhile, or not ours to read
            continue
    return found


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.fixture
def token() -> Iterator[str]:
    token = uuid.uuid4().hex
    yield token
    for pid in marked_processes(token):  # a failed test leaves nothing running either
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start(tmp_path: Path, token: str, duration_s: int) -> tuple[subprocess.Popen[str], int]:
    """The script in a session of its own (as in a terminal); its worker's metrics port."""
    worker_metrics_port = free_port()
    env = {
        **os.environ,
        MARKER: token,
        "RUN_DIR": str(tmp_path / "run"),
        "DURATION_S": str(duration_s),
        "GRPC_PORT": str(free_port()),
        "METRICS_PORT": str(free_port()),
        "ADMIN_PORT": str(free_port()),
        "WORKER_METRICS_PORT": str(worker_metrics_port),
        "PROMETHEUS_PORT": str(free_port()),
    }
    # As from a terminal, Ctrl-C must reach the script: a suite started in the background
    # by a non-interactive shell (`make test &`, nohup) inherits SIGINT ignored, and a shell
    # cannot trap a signal ignored on entry. So SIGINT is reset before the script starts.
    command = [sys.executable, "-c", RESET_SIGINT_AND_EXEC, str(SCRIPT)]
    proc = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    return proc, worker_metrics_port


def wait_until(
    condition: Callable[[], bool], timeout_s: float, what: str, proc: subprocess.Popen[str]
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"local-run.sh exited ({proc.returncode}) before {what}: "
                        f"{proc.communicate()[1][-2000:]}")  # fmt: skip
        if time.monotonic() > deadline:
            pytest.fail(f"not {what} within {timeout_s} s")
        time.sleep(0.25)


def assert_nothing_left(proc: subprocess.Popen[str], token: str) -> None:
    _, stderr = proc.communicate(timeout=60)
    assert "[local-run] stopped" in stderr, stderr
    # A process the script killed may still be exiting: looked at until none is left (a
    # process left running stays, and fails the test at the bound, which bounds failure only).
    deadline = time.monotonic() + 30
    while left := marked_processes(token):
        assert time.monotonic() < deadline, f"local-run.sh left processes running: {left}"
        time.sleep(0.1)


def test_stops_everything_when_its_duration_ends(tmp_path: Path, token: str) -> None:
    proc, _ = start(tmp_path, token, duration_s=4)
    wait_until(lambda: any("drafter-worker" in c or "worker_cli" in c
                           for c in marked_processes(token).values()),
               90, "the worker started", proc)  # fmt: skip
    assert_nothing_left(proc, token)
    assert proc.returncode == 0


def test_ctrl_c_stops_everything(tmp_path: Path, token: str) -> None:
    proc, worker_metrics_port = start(tmp_path, token, duration_s=0)
    metrics = f"http://127.0.0.1:{worker_metrics_port}/metrics"
    wait_until(lambda: answers(metrics), 120, "the worker served /metrics", proc)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the terminal's foreground group
    assert_nothing_left(proc, token)
    assert proc.returncode == 130
