"""The service's method table, with request parsing that cannot fail inside gRPC and
shedding under load before a message is parsed or even received.

The generated ``add_DrafterServiceServicer_to_server`` parses with ``FromString`` inside
gRPC, which answers bad bytes with UNKNOWN and a traceback per call (a flood of garbage
became megabytes of log). Here they become an :class:`Unparsed` refused INVALID_ARGUMENT
in one rate-limited line. Under a flood, receiving and parsing decide how much of the
core is left for the calls it can answer (a heavy Draft call, 368 KB: ~1 ms to receive,
1.6 ms to parse), so while the service would refuse any call for its load, a DraftStream
step is not parsed but becomes an :class:`Unparsed` refused for it, and a unary Draft
call is refused by :class:`LoadGate` when gRPC looks up its handler (flow control leaves
the message with the caller).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from drafter_service.engine.call_errors import InvalidArgument, ServiceError
from sssd_drafter.v1 import drafter_pb2 as pb

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["DrafterService"].full_name


@dataclass(frozen=True, slots=True)
class Unparsed:
    """A request refused as bytes: not a valid message of the method's type
    (``undecodable``; INVALID_ARGUMENT naming the type and the size), or shed for the
    service's load before they were parsed."""

    refusal: ServiceError
    undecodable: bool = False


Overloaded = Callable[[], ServiceError | None]
"""What the service would refuse any call with for its load alone (None: room for it)."""


def _tolerant(
    message: type[Message], overloaded: Overloaded | None = None
) -> Callable[[bytes], Message | Unparsed]:
    name = message.DESCRIPTOR.full_name

    def parse(data: bytes) -> Message | Unparsed:
        if overloaded is not None and (refusal := overloaded()) is not None:
            return Unparsed(refusal)
        try:
            return message.FromString(data)
        except DecodeError as exc:
            refusal = InvalidArgument(f"{len(data)} bytes are not a valid {name} ({exc})")
            return Unparsed(refusal, undecodable=True)

    return parse


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def add_drafter_service(servicer: object, server: grpc.aio.Server, overloaded: Overloaded) -> None:
    """Registers ``servicer`` as ``sssd_drafter.v1.DrafterService`` (what the generated
    function does, with :func:`_tolerant` parsing)."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["DrafterService"].methods:
        streaming = method.client_streaming  # DraftStream
        make = (
            grpc.stream_stream_rpc_method_handler
            if streaming
            else grpc.unary_unary_rpc_method_handler
        )
        # A unary Draft call's load is asked before it is read (LoadGate) and again, with
        # its deadline, by the servicer: only a stream's steps are asked here.
        parse = _tolerant(getattr(pb, method.input_type.name), overloaded if streaming else None)
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=parse,
            response_serializer=_serialize,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


class LoadGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses a unary Draft call with what ``overloaded()`` names before reading it;
    ``code_of`` maps the refusal to its status, ``refused(method, code)`` counts it, and
    ``refused_unread`` counts those calls."""

    def __init__(
        self,
        overloaded: Overloaded,
        code_of: Callable[[ServiceError], grpc.StatusCode],
        refused: Callable[[str, str], None],
    ) -> None:
        self._overloaded = overloaded
        self._code_of = code_of
        self._refused = refused
        self._draft = f"/{SERVICE_NAME}/Draft"
        self.refused_unread = 0

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        if details.method != self._draft or (refusal := self._overloaded()) is None:
            return await continuation(details)
        code = self._code_of(refusal)

        async def refuse(_: AsyncIterator[Any], context: Any) -> Any:
            self.refused_unread += 1
            self._refused("Draft", code.name)
            await context.abort(code, str(refusal))

        return grpc.stream_unary_rpc_method_handler(refuse)
