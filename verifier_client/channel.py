"""gRPC channel settings and error classification shared by the sync and asyncio clients."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc

from verifier_client.results import Outcome

__all__ = ["CAUSE_TIMEOUT_S", "CallFailed", "ChannelOptions", "DrafterUnreachable",
           "Unavailable", "aio_channel", "channel_options", "failure_of",
           "raise_unless_unreachable", "sync_channel", "unreachable_cause"]  # fmt: skip

ChannelOptions = Sequence[tuple[str, Any]]

_DEFAULT_OPTIONS: dict[str, Any] = {
    # gRPC's own reconnect backoff grows to 120 s by default; a drafter back after
    # an outage would then stay unused for minutes. The circuit breaker already
    # paces the attempts, so the channel may retry the connection quickly.
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    # Detect a dead peer under a long-lived stream. 30 s keeps well clear of the
    # servers' ping policing; the drafter allows pings this often.
    "grpc.keepalive_time_ms": 30_000,
    "grpc.keepalive_timeout_ms": 10_000,
    # Recent gRPC cores time a keepalive ping out with this (default 60 s) as well.
    "grpc.http2.ping_timeout_ms": 10_000,
    # Whole contexts after a resync and trees for a large batch can be big.
    "grpc.max_send_message_length": 64 * 1024 * 1024,
    "grpc.max_receive_message_length": 64 * 1024 * 1024,
}


def channel_options(overrides: ChannelOptions = ()) -> list[tuple[str, Any]]:
    """The default channel options with ``overrides`` applied (same keys replace)."""
    return list({**_DEFAULT_OPTIONS, **dict(overrides)}.items())


class CallFailed(Exception):
    """A draft call gave no usable answer; ``outcome`` says why."""

    def __init__(self, outcome: Outcome, detail: str = "") -> None:
        super().__init__(f"{outcome.value}: {detail}" if detail else outcome.value)
        self.outcome = outcome


def failure_of(error: grpc.RpcError) -> CallFailed:
    """A failed call as the CallFailed that the step reports, with gRPC's details."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    outcome = Outcome.ERROR
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        outcome = Outcome.DEADLINE
    elif code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        outcome = Outcome.UNAVAILABLE
    return CallFailed(outcome, str(error.details()))


# wait_ready: the codes of a drafter that cannot be reached, and how long the last,
# fail-fast attempt that asks gRPC for the cause may take.
_UNREACHABLE_CODES = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
CAUSE_TIMEOUT_S = 2.0


def raise_unless_unreachable(error: grpc.RpcError) -> None:
    """wait_ready's check of a failed attempt: raises ``error`` unless its code is one of a
    drafter that cannot be reached."""
    if error.code() not in _UNREACHABLE_CODES:
        raise error


class Unavailable(grpc.RpcError):  # type: ignore[misc]
    """An UNAVAILABLE RpcError of the client's own, with ``details``."""

    def __init__(self, details: str) -> None:
        super().__init__(details)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


class DrafterUnreachable(Unavailable):
    """``wait_ready`` could not reach the drafter; the message names the target and the
    cause (from gRPC's details of a last, fail-fast attempt)."""

    def __init__(self, target: str, timeout_s: float, details: str) -> None:
        self.target = target
        self.cause = unreachable_cause(details)
        super().__init__(f"drafter at {target!r} not ready after {timeout_s:g} s: {self.cause}"
                         f" (gRPC: {details})")  # fmt: skip


_CAUSES = (  # (what gRPC's details say, in lower case) -> the cause a user can act on
    (("resolving", "lookup", "name not found", "dns"),
     "the host name does not resolve (check the address or the DNS name)"),
    (("connection refused",), "nothing listens at that address (connection refused)"),
    (("handshake", "ssl", "tls", "certificate"),
     "the TLS handshake failed (one side uses TLS and the other does not, or the certificate "
     "is not trusted)"),
)  # fmt: skip


def unreachable_cause(details: str) -> str:
    """The cause of a failed connection, from gRPC's details of the failed call."""
    lowered = details.lower()
    for needles, cause in _CAUSES:
        if any(n in lowered for n in needles):
            return cause
    return "no answer in time (the drafter is down, starting, or the network drops packets)"


def sync_channel(
    target: str,
    options: ChannelOptions,
    credentials: grpc.ChannelCredentials | None,
    token: str | None,
) -> grpc.Channel:
    """A channel to the drafter: TLS with ``credentials``; ``token`` (the drafter's
    ``--grpc-tokens-file`` entry) sent as ``authorization: Bearer`` on every call."""
    channel = (
        grpc.secure_channel(target, credentials, options=options)
        if credentials is not None
        else grpc.insecure_channel(target, options=options)
    )
    return grpc.intercept_channel(channel, _BearerToken(token)) if token else channel


def aio_channel(
    target: str,
    options: ChannelOptions,
    credentials: grpc.ChannelCredentials | None,
    token: str | None,
) -> grpc.aio.Channel:
    """:func:`sync_channel` for grpc.aio, inside the running event loop that will use it
    (RuntimeError without one: now, rather than on the client's first call)."""
    asyncio.get_running_loop()
    interceptors = [_AioBearerToken(token), _AioStreamBearerToken(token)] if token else None
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials, options=options,
                                       interceptors=interceptors)  # fmt: skip
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)


class _Token:
    """Adds the bearer token to a call's metadata. Interceptors get gRPC's call details as
    namedtuples (grpc.aio.ClientCallDetails, and the sync API's own), so ``_replace``."""

    def __init__(self, token: str) -> None:
        self._token = token

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), ("authorization", f"Bearer {self._token}")]
        return details._replace(metadata=metadata)


class _BearerToken(
    _Token,
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """The token on every call of a sync channel (the service's methods are unary-unary
    and one stream-stream)."""

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


# grpc.aio files each interceptor under the first kind it is an instance of, so one
# object cannot serve both kinds: one class per kind.
class _AioBearerToken(_Token, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioStreamBearerToken(_Token, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(
        self, continuation: Any, details: Any, requests: Any
    ) -> Any:
        return await continuation(self._details(details), requests)
