"""Bytes that are not a message get INVALID_ARGUMENT, one rate-limited log line and no
traceback (issue 17, item 5), and a bounded fuzz of the gRPC surface never gets UNKNOWN
or INTERNAL nor takes the service down. Against the real `drafter serve` process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from client_servers import DrafterProcess

pytestmark = pytest.mark.system

METHODS = ("Draft", "Finish", "Ingest", "GetServiceInfo")
FUZZ = Path(__file__).resolve().parents[1] / "drafter_bench" / "grpc_fuzz.py"
SERVICE = "/sssd_drafter.v1.DrafterService/"


def _code(channel: grpc.Channel, method: str, payload: bytes) -> grpc.StatusCode:
    call = channel.unary_unary(SERVICE + method)  # raw bytes both ways
    try:
        call(payload, timeout=10)
    except grpc.RpcError as err:
        code: grpc.StatusCode = err.code()
        return code
    return grpc.StatusCode.OK


def test_undecodable_messages_are_invalid_argument_without_tracebacks(tmp_path: Path) -> None:
    server = DrafterProcess(tmp_path / "data")
    log = tmp_path / "data.log"
    try:
        with grpc.insecure_channel(server.target) as channel:
            for method in METHODS:
                for _ in range(50):
                    assert _code(channel, method, b"\xff" * 6) == grpc.StatusCode.INVALID_ARGUMENT
            stream = channel.stream_stream(SERVICE + "DraftStream")
            try:
                list(stream(iter([b"\xff" * 6]), timeout=10))
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "not a valid sssd_drafter.v1.DraftRequest" in str(err.details())
            else:
                raise AssertionError("a garbage stream message was answered")
        server.info()  # still serving
    finally:
        server.stop()
    text = log.read_text()
    assert "Traceback" not in text
    # 201 refusals inside the rate limit's window: one line (at most two if it rolled over).
    assert 1 <= text.count("refused an undecodable request") <= 2


def test_a_bounded_fuzz_never_gets_unknown_or_internal(tmp_path: Path) -> None:
    """2,000 random and mutated messages through drafter_bench/grpc_fuzz.py (longer runs of
    the same script are a benchmark)."""
    server = DrafterProcess(tmp_path / "data")
    try:
        done = subprocess.run(
            [sys.executable, str(FUZZ), "--target", server.target, "--messages", "2000"],
            stdout=subprocess.PIPE, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        server.stop()
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result["unknown_or_internal"] == 0, result
    assert result["alive"] and result["codes"].get("INVALID_ARGUMENT", 0) > 500
    assert "Traceback" not in (tmp_path / "data.log").read_text()
