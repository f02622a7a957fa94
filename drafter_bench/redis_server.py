"""A real ``redis-server`` (the Debian package, installed by ``make setup``) as a
process on loopback: the shared ingest log for ``drafter-bench scale`` and the
scale-out tests. Durable (append-only file, fsynced as ``appendfsync`` says),
restartable on the same port and data directory. :func:`free_port`,
:func:`listening_address` and :func:`stop_process` serve the benchmarks' other
subprocesses too."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import redis


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening_address(proc: subprocess.Popen[str], log_path: Path | None = None) -> str:
    """The HOST:PORT of ``drafter serve`` ``proc`` (started with ``stdout=PIPE``), from the
    first line it prints; kills it and raises RuntimeError, with the tail of its log at
    ``log_path`` if given, when that line is anything else."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("drafter listening on "):
        proc.kill()
        tail = "" if log_path is None else "\n" + log_path.read_text()[-2000:]
        raise RuntimeError(f"drafter serve did not start: {line!r}{tail}")
    return line.removeprefix("drafter listening on ").strip()


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 30.0) -> None:
    """Stops ``proc`` if it still runs: SIGTERM, then SIGKILL after ``timeout_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class RedisServer:
    """``redis-server`` on 127.0.0.1 with its files under ``directory``; started at once."""

    def __init__(self, directory: Path, appendfsync: str = "always") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server not found: `make setup` installs it (Debian redis-server)"
            )
        self.binary = binary
        self.directory = directory
        self.appendfsync = appendfsync
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Starts it (again, on the same port and files) and waits until it answers."""
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.directory), "--appendonly", "yes",
             "--appendfsync", self.appendfsync, "--save", "", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 20
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(
                            f"redis-server did not start on port {self.port}"
                        ) from None
                    time.sleep(0.02)
        finally:
            client.close()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)

    def stop(self) -> None:
        """Stops it (SIGTERM, then SIGKILL after 30 s); the port and files are kept."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc)
