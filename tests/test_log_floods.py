"""Failures that repeat per call log at most one line per interval, with a count of the
ones left out, and no traceback per call (issue 29, item 9): the rate limiter itself on
an injected clock, and the real `drafter serve` with its shared log (a real Redis)
stopped under 100 Finish calls, which used to log two tracebacks each."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import grpc
import pytest
from client_servers import DrafterProcess, finish_durable
from log_server import RedisServer

from drafter_service.log_limits import DEFAULT_INTERVAL_S, RateLimitedLog
from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc

pytestmark = pytest.mark.system


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_interval_with_the_count_left_out(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger("floods.unit"), 10.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="floods.unit"):
        assert limited.warning("disk %s is full", "/data")
        assert not any(limited.warning("disk %s is full", "/data") for _ in range(99))
        clock.now += 9.99
        assert not limited.warning("disk %s is full", "/data")
        clock.now += 0.01  # the interval has passed
        assert limited.error("disk %s is full", "/data")
        clock.now += 10.0
        assert limited.log("disk %s is full again", "/data", level=logging.INFO)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "disk /data is full"),
        (logging.ERROR, "disk /data is full (100 more since the last line)"),
        (logging.INFO, "disk /data is full again"),
    ]


def test_a_traceback_only_the_first_time_an_error_type_is_seen(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger("floods.trace"), 1.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="floods.trace"):
        for error in (KeyError("a"), KeyError("b"), ValueError("c"), ValueError("d")):
            try:
                raise error
            except Exception as exc:
                assert limited.error("failed: %r", exc, error=exc)
            clock.now += 1.0
    assert [r.exc_info is not None and r.exc_info[0] for r in caplog.records] == [
        KeyError, False, ValueError, False,
    ]  # fmt: skip


def test_shared_log_down_finish_logs_a_handful_of_lines_not_tracebacks(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis")
    log_path = tmp_path / "data.log"
    server: DrafterProcess | None = None
    try:
        server = DrafterProcess(
            tmp_path / "data", "--shared-log", redis.url, "--shared-log-prefix", "floods",
            "--snapshot-interval-s", "0",
        )  # fmt: skip
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.DrafterServiceStub(channel)
            assert finish_durable(stub, "up").durable == 1
            redis.stop()
            before = len(log_path.read_text().splitlines())
            start = time.monotonic()
            for i in range(100):
                answer = finish_durable(stub, f"down-{i}")
                assert (answer.ingested, answer.durable) == (1, 0)
            for _ in range(20):  # Ingest says so to its caller, and logs nothing
                with pytest.raises(grpc.RpcError) as err:
                    stub.Ingest(pb.IngestRequest(sequences=[pb.TokenSequence(tokens=[1, 2, 3])]),
                                timeout=30)  # fmt: skip
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            flood = log_path.read_text().splitlines()[before:]
            windows = int((time.monotonic() - start) // DEFAULT_INTERVAL_S) + 1
            redis.start()
            assert finish_durable(stub, "back").durable == 1
    finally:
        if server is not None:
            server.stop()
        redis.stop()
    assert "Traceback" not in "\n".join(flood), flood
    # Per 10 s window: one line for the Finish failures, one for the follower's retries
    # (each limiter's window may straddle the start: one more line each).
    stored = [line for line in flood if "finished generation not stored" in line]
    assert 1 <= len(stored) <= windows + 1, flood
    assert "ConnectionError: Error 111 connecting to" in stored[0], stored
    assert len(flood) <= 2 * (windows + 1), flood
