"""gRPC channel settings and error classification shared by the sync and asyncio clients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from .results import Outcome

__all__ = ["CallFailed", "ChannelOptions", "channel_options", "outcome_of"]

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
    merged = dict(_DEFAULT_OPTIONS)
    merged.update(dict(overrides))
    return list(merged.items())


class CallFailed(Exception):
    """A draft call gave no usable answer; ``outcome`` says why."""

    def __init__(self, outcome: Outcome, detail: str = "") -> None:
        super().__init__(f"{outcome.value}: {detail}" if detail else outcome.value)
        self.outcome = outcome


def outcome_of(error: grpc.RpcError) -> Outcome:
    """The step outcome for a failed call."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Outcome.DEADLINE
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return Outcome.UNAVAILABLE
    return Outcome.ERROR
