"""wait_ready names why the drafter cannot be reached (issue 33, item 4): a host name that
does not resolve, a port nobody listens on, a TLS client against a plaintext server. Real
gRPC channels and a real gRPC server; the error is still a grpc.RpcError (UNAVAILABLE),
so code that caught the old bare DEADLINE_EXCEEDED keeps working."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from verifier_client import AioDrafterClient, DrafterClient, DrafterUnreachable
from verifier_client.channel import unreachable_cause

WAIT_S = 0.5  # how long wait_ready waits before it asks gRPC for the cause


def free_port() -> int:
    """A port nothing listens on (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def plaintext_server() -> Iterator[str]:
    """A real gRPC server without TLS (and without services: the handshake fails first)."""
    server = grpc.server(futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def unreachable(client: DrafterClient) -> DrafterUnreachable:
    with client, pytest.raises(DrafterUnreachable) as raised:
        client.wait_ready(WAIT_S)
    return raised.value


def test_a_name_that_does_not_resolve_is_named() -> None:
    error = unreachable(DrafterClient("drafter-nowhere.invalid:50051"))
    assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.UNAVAILABLE
    assert "'drafter-nowhere.invalid:50051'" in str(error)
    assert "does not resolve" in error.cause and error.cause in error.details()


def test_a_refused_connection_is_named() -> None:
    target = f"127.0.0.1:{free_port()}"
    error = unreachable(DrafterClient(target))
    assert error.target == target and "connection refused" in error.cause


def test_tls_against_a_plaintext_server_is_named(plaintext_server: str) -> None:
    client = DrafterClient(plaintext_server, credentials=grpc.ssl_channel_credentials())
    assert "TLS handshake failed" in unreachable(client).cause


def test_the_asyncio_client_names_the_cause_too() -> None:
    target = f"127.0.0.1:{free_port()}"

    async def run() -> DrafterUnreachable:
        client = AioDrafterClient(target)
        try:
            with pytest.raises(DrafterUnreachable) as raised:
                await client.wait_ready(WAIT_S)
            return raised.value
        finally:
            await client.close()

    assert "connection refused" in asyncio.run(run()).cause


@pytest.mark.parametrize(
    ("details", "cause"),
    [
        ("errors resolving x:1: [hostname lookup error: Domain name not found]", "resolve"),
        ("failed to connect to all addresses; last error: UNKNOWN: Connection refused", "refused"),
        ("Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL", "TLS"),
        ("Deadline Exceeded", "no answer in time"),
    ],
)
def test_causes_from_grpc_details(details: str, cause: str) -> None:
    assert cause in unreachable_cause(details)


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_close_after_a_failed_background_call_does_not_say_work_was_left(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A stored generation whose call failed (nothing listens; the request was never sent,
    so it goes as an Ingest) was sent and lost, not left unsent, and close says so in both
    clients (the asyncio one logged "background work unsent")."""
    target = "127.0.0.1:1"

    def work(client: DrafterClient | AioDrafterClient) -> None:
        client.add_request("r", [1, 2, 3])
        assert client.finish("r", output=[4, 5])  # queued, to be stored

    client: DrafterClient | AioDrafterClient
    with caplog.at_level("WARNING", logger="verifier_client"):
        if kind == "sync":
            client = DrafterClient(target, background_timeout_s=0.05)
            work(client)
            client.close(60.0)  # a bound on failure only: the call fails within 0.05 s
        else:

            async def run() -> AioDrafterClient:
                aio = AioDrafterClient(target, background_timeout_s=0.05)
                work(aio)
                await aio.close(60.0)
                return aio

            client = asyncio.run(run())
    assert client.stats.background_failures == 1
    assert "drafter IngestRequest failed" in caplog.text
    assert "background work unsent" not in caplog.text
