"""Bytes that are not a message get INVALID_ARGUMENT, one rate-limited log line and no
traceback (issue 17, item 5), and a bounded fuzz of the gRPC surface never gets UNKNOWN
or INTERNAL nor takes the service down. Against the real `drafter serve` process."""

from __future__ import annotations

import random
from pathlib import Path

import grpc
from client_servers import DrafterProcess

METHODS = ("Draft", "Finish", "Ingest", "GetServiceInfo")
SERVICE = "/drafter.v1.DrafterService/"


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
                assert "not a valid drafter.v1.DraftRequest" in str(err.details())
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
    """A few thousand random and mutated messages (a longer run is a benchmark)."""
    server = DrafterProcess(tmp_path / "data")
    rng = random.Random(17)
    seeds = [
        bytes.fromhex("0a0a0a0172120501020304051810"),  # a plausible DraftRequest
        bytes.fromhex("0a03726571"),
        b"",
    ]
    codes: dict[grpc.StatusCode, int] = {}
    try:
        with grpc.insecure_channel(server.target) as channel:
            for i in range(2000):
                if i % 2:
                    payload = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 64)))
                else:
                    base = bytearray(rng.choice(seeds))
                    for _ in range(rng.randrange(1, 4)):
                        if base:
                            base[rng.randrange(len(base))] = rng.getrandbits(8)
                        else:
                            base.append(rng.getrandbits(8))
                    payload = bytes(base)
                code = _code(channel, rng.choice(METHODS), payload)
                codes[code] = codes.get(code, 0) + 1
        server.info()
    finally:
        server.stop()
    assert grpc.StatusCode.UNKNOWN not in codes and grpc.StatusCode.INTERNAL not in codes, codes
    assert codes.get(grpc.StatusCode.INVALID_ARGUMENT, 0) > 500
    assert "Traceback" not in (tmp_path / "data.log").read_text()
