"""Service lifecycle: health transitions, reflection, graceful shutdown mid-stream, and
`drafter serve` as a real subprocess (listening line, restart → RESYNC, durable
ingest across kill -9, clean exit on SIGTERM)."""

from __future__ import annotations

import logging
import queue
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from service_support import VOCAB, LoopThread, Subprocess, config, delta, rpc_error, serving

from drafter_service.drafter_cli import main
from drafter_service.service import DrafterServer
from drafter_service.service.grpc_server import SERVICE_NAME
from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc

pytestmark = pytest.mark.system

Status = health_pb2.HealthCheckResponse


def health_status(channel: grpc.Channel, service: str = "") -> int:
    check = health_pb2_grpc.HealthStub(channel).Check
    status: int = check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
    return status


def test_health_goes_not_serving_serving_not_serving(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    server = DrafterServer(config(tmp_path))
    loop_thread.run(server.listen())
    channel = grpc.insecure_channel(server.address)
    try:
        assert health_status(channel) == health_status(channel, SERVICE_NAME) == Status.NOT_SERVING
        stub = pb_grpc.DrafterServiceStub(channel)
        err = rpc_error(stub.Draft, pb.DraftRequest(requests=[delta("a", [1])]), timeout=5)
        assert err.code() == grpc.StatusCode.UNAVAILABLE and "loading" in err.details()
        loop_thread.run(server.load())
        assert health_status(channel) == health_status(channel, SERVICE_NAME) == Status.SERVING
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        assert next(watch).status == Status.SERVING
        stopping = loop_thread.submit(server.stop(grace=0.3))
        assert next(watch).status == Status.NOT_SERVING  # before the listener goes away
        stopping.result(10)
        err = rpc_error(health_status, channel)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        channel.close()
        loop_thread.run(server.stop(0))


class _FailedSidecar:
    """An admin API whose server failed while serving: its stop raises."""

    def __init__(self, *views: object) -> None:
        pass

    async def start(self) -> int:
        return 0

    async def stop(self) -> None:
        raise RuntimeError("the admin server failed")


def test_a_failed_sidecar_is_raised_once_the_service_has_stopped(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    server = DrafterServer(config(tmp_path), admin=_FailedSidecar)
    loop_thread.run(server.listen())
    loop_thread.run(server.load())
    assert server.engine is not None
    live = server.engine.catalog.slots["default"].live
    assert live is not None
    with pytest.raises(RuntimeError, match="the admin server failed"):
        loop_thread.run(server.stop(0))
    with pytest.raises(RuntimeError):  # the datastores closed all the same
        live.ingest([1, 2, 3])
    with pytest.raises(OSError):  # and the gRPC port
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
    loop_thread.run(server.stop(0))  # stopped: a second stop returns at once


def test_a_port_in_use_is_an_os_error_naming_it(loop_thread: LoopThread, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        server = DrafterServer(config(tmp_path, port=port))
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}: "):
            loop_thread.run(server.listen())
        loop_thread.run(server.stop(0))


def test_an_ipv6_host_listens_and_serves(
    loop_thread: LoopThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # --host ::1 used to reach gRPC as "::1:0", which it reads as a host without a port
    # (it tried port 443 and failed): the listen target brackets an IPv6 host. The metrics
    # endpoint listens on the same host; the admin API on its own --admin-host.
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.skip("this machine has no IPv6")
    with caplog.at_level(logging.INFO), serving(
        loop_thread, config(tmp_path, host="::1", admin_host="::1")
    ) as s:
        assert re.fullmatch(r"\[::1\]:\d+", s.server.address)
        # The URLs they log are ones a browser or curl opens: the host in brackets.
        assert re.search(r"metrics on http://\[::1\]:\d+/metrics", caplog.text)
        assert re.search(r"admin API on http://\[::1\]:\d+ ", caplog.text)
        assert health_status(s.channel) == Status.SERVING
        answer = s.stub.Draft(pb.DraftRequest(requests=[delta("a", [1, 2])]), timeout=5)
        assert [d.request_id for d in answer.drafts] == ["a"]


def test_reflection_lists_the_services(loop_thread: LoopThread, tmp_path: Path) -> None:
    with serving(loop_thread, config(tmp_path)) as s:
        services = ProtoReflectionDescriptorDatabase(s.channel).get_services()
        assert SERVICE_NAME == "sssd_drafter.v1.DrafterService"
        assert {SERVICE_NAME, "grpc.health.v1.Health"} <= set(services)


def _stream(requests: queue.Queue[pb.DraftRequest | None]) -> Iterator[pb.DraftRequest]:
    while (item := requests.get()) is not None:
        yield item


def _refused_once_shut(stub: pb_grpc.DrafterServiceStub) -> None:
    """Calls until a new call is refused: the server has shut its listener, so its grace
    period has begun (a bound on failure only)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            stub.GetServiceInfo(pb.GetServiceInfoRequest(), timeout=60)
        except grpc.RpcError as err:
            # UNAVAILABLE once the client has the server's GOAWAY; CANCELLED for a call whose
            # stream the client opened as the GOAWAY crossed it (gRPC's core resets it).
            assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), err
            return
        assert time.monotonic() < deadline, "the server never stopped taking new calls"
        time.sleep(0.01)


def test_graceful_shutdown_finishes_calls_then_cancels_streams(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """An open stream is served in the grace period and the stop waits for it; one still
    open when the grace ends is cancelled. Ordered by events (a new call refused, the
    stream's answers), never by the clock: the first grace is a bound on failure only."""
    cfg = config(tmp_path, rebuild_min_tokens=10**6)
    with serving(loop_thread, cfg) as s:
        outbox: queue.Queue[pb.DraftRequest | None] = queue.Queue()
        responses = s.stub.DraftStream(_stream(outbox), timeout=600)
        outbox.put(pb.DraftRequest(step=1, requests=[delta("s", [1, 2, 3], prompt_length=2)]))
        assert next(responses).drafts[0].length == 3
        s.stub.Finish(
            pb.FinishRequest(
                requests=[pb.FinishedRequest(request_id="s", reason=pb.FINISH_REASON_FINISHED)]
            )
        )
        outbox.put(pb.DraftRequest(step=2, requests=[delta("s2", [4, 5])]))
        assert next(responses).step == 2
        stopping = loop_thread.submit(s.server.stop(grace=300))
        _refused_once_shut(s.stub)
        outbox.put(pb.DraftRequest(step=3, requests=[delta("s2", [6], known_length=2)]))
        assert next(responses).drafts[0].length == 3  # an open stream is served in the grace
        assert not stopping.done()  # and the stop waits for it
        outbox.put(None)  # the client ends its stream: the stop goes on at once
        with pytest.raises(StopIteration):
            next(responses)
        stopping.result(60)
        err = rpc_error(s.stub.GetServiceInfo, pb.GetServiceInfoRequest(), timeout=60)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
    # stopping stored the queued generation and closed the log: a reopen finds it
    with serving(loop_thread, config(tmp_path, rebuild_min_tokens=1)) as again:
        info = again.stub.GetServiceInfo(pb.GetServiceInfoRequest())
        assert info.datastores[0].num_tokens == 3  # the prompt [1, 2] and the output [3]
        outbox = queue.Queue()
        responses = again.stub.DraftStream(_stream(outbox), timeout=600)
        outbox.put(pb.DraftRequest(step=1, requests=[delta("t", [1, 2])]))
        assert next(responses).step == 1
        stopping = loop_thread.submit(again.server.stop(grace=0.3))
        with pytest.raises(grpc.RpcError) as cancelled:
            next(responses)  # still open when the grace ends: cancelled
        assert cancelled.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        stopping.result(60)
        outbox.put(None)


def test_subprocess_restart_resyncs_and_keeps_acknowledged_ingests(tmp_path: Path) -> None:
    args = (
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path),
        "--vocab-size",
        str(VOCAB),
    )
    first = Subprocess(*args)
    with grpc.insecure_channel(first.address) as channel:
        stub = pb_grpc.DrafterServiceStub(channel)
        r = stub.Draft(pb.DraftRequest(requests=[delta("r", [1, 2, 3, 4])]), timeout=10)
        assert r.drafts[0].length == 4
        ack = stub.Ingest(pb.IngestRequest(sequences=[pb.TokenSequence(tokens=[7, 8, 9])]))
        assert ack.wal_position == 1
    code, _, _ = first.stop(signal.SIGKILL)  # no shutdown at all
    assert code == -signal.SIGKILL

    second = Subprocess(*args)
    try:
        assert second.line == f"drafter listening on {second.address}\n"
        with grpc.insecure_channel(second.address) as channel:
            stub = pb_grpc.DrafterServiceStub(channel)
            r = stub.Draft(pb.DraftRequest(requests=[delta("r", [5], known_length=4)]), timeout=10)
            assert r.drafts[0].status == pb.DRAFT_STATUS_RESYNC
            r = stub.Draft(pb.DraftRequest(requests=[delta("r", [1, 2, 3, 4, 5])]), timeout=10)
            assert r.drafts[0].status == pb.DRAFT_STATUS_OK and r.drafts[0].length == 5
            info = stub.GetServiceInfo(pb.GetServiceInfoRequest(), timeout=10)
            assert info.datastores[0].num_tokens == 3  # the acknowledged ingest survived
    finally:
        code, rest, err = second.stop(signal.SIGTERM)
    assert code == 0, err
    assert rest == ""  # exactly one line on stdout


def test_serve_freezes_what_outlives_startup(tmp_path: Path) -> None:
    """`drafter serve` moves the objects that outlive startup out of the cyclic garbage
    collector's reach: a full collection would otherwise traverse them all while holding
    the GIL (~30 ms on the benchmark host) and stall every call meanwhile. It unfreezes
    them at shutdown, where frozen cycles would never be finalized: nanobind then reports
    the native datastores as leaked."""
    server = Subprocess("--host", "127.0.0.1", "--port", "0", "--data-dir", str(tmp_path),
                        "--vocab-size", str(VOCAB))  # fmt: skip
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.DrafterServiceStub(channel)
        r = stub.Draft(pb.DraftRequest(requests=[delta("r", [1, 2, 3, 4])]), timeout=10)
        assert r.drafts[0].status == pb.DRAFT_STATUS_OK
    code, _, err = server.stop(signal.SIGTERM)
    assert code == 0, err
    frozen = re.search(r"froze (\d+) objects that outlive startup", err)
    assert frozen is not None and int(frozen.group(1)) > 10_000, err
    assert "leaked" not in err, err


def test_serve_reports_bad_settings_with_status_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ports = ["--port", "0", "--metrics-port", "-1", "--admin-port", "-1"]
    assert main(["serve", *ports, "--data-dir", str(tmp_path), "--vocab-size", "0"]) == 2
    assert "ServeConfig.vocab_size = 0 is out of range" in capsys.readouterr().err
    assert main(["serve", *ports, "--data-dir", str(tmp_path), "--vocab-size", "many"]) == 2
    assert "--vocab-size: bad value 'many'" in capsys.readouterr().err
    assert main(["serve", "--max-budget", "lots"]) == 2
    assert "--max-budget: bad value 'lots'" in capsys.readouterr().err
    bad_snapshot = [
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "d"),
        "--snapshot",
        str(tmp_path / "missing"),
    ]
    assert main(bad_snapshot) == 2
    assert "manifest.json is missing" in capsys.readouterr().err


def _silent_http2_peer(address: str, listen_s: float) -> tuple[int, bool]:
    """Opens an HTTP/2 connection that answers SETTINGS but never a PING (a peer that
    died without closing its socket); returns (PINGs received, closed by the server)."""
    host, port = address.rsplit(":", 1)
    pings = 0
    with socket.create_connection((host, int(port)), timeout=listen_s) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(3) + b"\x04\x00" + bytes(4))
        buffer = b""
        end_s = time.monotonic() + listen_s
        while time.monotonic() < end_s:
            sock.settimeout(max(0.01, end_s - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                return pings, True
            buffer += chunk
            while len(buffer) >= 9:  # whole frames: 24-bit length, type, flags, stream id
                length = int.from_bytes(buffer[:3], "big")
                if len(buffer) < 9 + length:
                    break
                kind, flags = buffer[3], buffer[4]
                buffer = buffer[9 + length :]
                if kind == 0x4 and not flags & 0x1:  # SETTINGS: acknowledge
                    sock.sendall(bytes(3) + b"\x04\x01" + bytes(4))
                elif kind == 0x6 and not flags & 0x1:  # PING: never answered
                    pings += 1
    return pings, False


def test_keepalive_drops_a_peer_that_stops_answering(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """The keepalive settings reach gRPC: the server pings an idle connection every
    keepalive_time_s and closes it when no ack comes within keepalive_timeout_s."""
    cfg = config(tmp_path / "a", keepalive_time_s=0.2, keepalive_timeout_s=0.2,
                 keepalive_permit_without_calls=True)  # fmt: skip
    with serving(loop_thread, cfg) as s:
        pings, closed = _silent_http2_peer(s.server.address, listen_s=10)
        assert pings >= 1 and closed, (pings, closed)
    # The defaults (a ping after 30 s) leave the same peer alone for a while.
    with serving(loop_thread, config(tmp_path / "b", keepalive_permit_without_calls=True)) as s:
        assert _silent_http2_peer(s.server.address, listen_s=1.0) == (0, False)
