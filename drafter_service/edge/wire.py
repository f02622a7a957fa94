"""The service's method table, with request parsing that cannot fail inside gRPC.

The generated ``add_DrafterServiceServicer_to_server`` parses each request with
``FromString`` before the servicer sees it; bytes that are not a message then
raise inside gRPC's own code, which answers UNKNOWN with the Python exception's
name and logs a traceback per call (a flood of garbage became megabytes of log).
Here a request that does not parse becomes an :class:`Undecodable` value, which
the servicer refuses with INVALID_ARGUMENT, counted like any other refusal and
logged in one rate-limited line.

A DraftStream step that arrives while the service is already full (too much drafting
work queued, or too many calls in flight) is not parsed at all: parsing a large message
costs more than refusing it (1.6 ms for 64 requests of 2,000 tokens), and under a flood
those costs are what decides how much of the service is left for the calls it can answer.
It becomes a :class:`Shed` value carrying the refusal. (A unary Draft call is refused
before it is even received: :mod:`drafter_service.edge.load_gate`.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError, Message

from drafter_service.engine.call_errors import InvalidArgument, ServiceError
from drafter_service.log_limits import RateLimitedLog
from sssd_drafter.v1 import drafter_pb2 as pb

__all__ = ["SERVICE_NAME", "Shed", "Undecodable", "UndecodableRefusals", "add_drafter_service"]

log = logging.getLogger(__name__)

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["DrafterService"].full_name


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Request bytes that are not a valid message of the method's type."""

    message_type: str
    size_bytes: int
    error: str


@dataclass(frozen=True, slots=True)
class Shed:
    """A request refused for the service's load before its bytes were parsed."""

    refusal: ServiceError


Overloaded = Callable[[], ServiceError | None]
"""What the service would refuse any call with for its load alone (None: room for it)."""


def _tolerant(
    message: type[Message], overloaded: Overloaded | None = None
) -> Callable[[bytes], Message | Undecodable | Shed]:
    name = message.DESCRIPTOR.full_name

    def parse(data: bytes) -> Message | Undecodable | Shed:
        if overloaded is not None and (refusal := overloaded()) is not None:
            return Shed(refusal)
        try:
            return message.FromString(data)
        except DecodeError as exc:
            return Undecodable(name, len(data), str(exc))

    return parse


class UndecodableRefusals:
    """Refuses undecodable requests, logging through a :class:`RateLimitedLog` (one line
    per interval at most, with how many were not logged): a flood of garbage must not
    become a flood of log."""

    def __init__(self) -> None:
        self._log = RateLimitedLog(log)

    def refuse(self, request: Undecodable) -> InvalidArgument:
        """The refusal of ``request`` (INVALID_ARGUMENT naming its type and size)."""
        what = (
            f"{request.size_bytes} bytes are not a valid {request.message_type} "
            f"({request.error})"
        )
        self._log.warning("refused an undecodable request: %s", what)
        return InvalidArgument(what)


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def add_drafter_service(
    servicer: object, server: grpc.aio.Server, overloaded: Overloaded | None = None
) -> None:
    """Registers ``servicer`` as ``sssd_drafter.v1.DrafterService`` (what the generated
    function does, with :func:`_tolerant` parsing; DraftStream steps that arrive while
    ``overloaded()`` names a refusal are not parsed)."""
    request: dict[str, type[Message]] = {
        "Draft": pb.DraftRequest, "DraftStream": pb.DraftRequest, "Finish": pb.FinishRequest,
        "Ingest": pb.IngestRequest, "GetServiceInfo": pb.GetServiceInfoRequest,
    }  # fmt: skip
    handlers = {}
    for method, message in request.items():
        make = (
            grpc.stream_stream_rpc_method_handler
            if method == "DraftStream"
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method] = make(
            getattr(servicer, method),
            # A unary Draft call's load is asked before it is read (LoadGate) and again,
            # with its deadline, by the servicer: only a stream's steps are asked here.
            request_deserializer=_tolerant(
                message, overloaded if method == "DraftStream" else None
            ),
            response_serializer=_serialize,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
