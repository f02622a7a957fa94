"""The service's method table, with request parsing that cannot fail inside gRPC and
shedding under load before a message is parsed or even received.

The generated ``add_DrafterServiceServicer_to_server`` parses with ``FromString`` inside
gRPC, which answers bad bytes with UNKNOWN and a traceback per call (a flood of garbage
became megabytes of log). Here they become an :class:`Unparsed` refused INVALID_ARGUMENT
in one rate-limited line. Under a flood, receiving and parsing decide how much of the
core is left for the calls it can answer (a heavy Draft call, 368 KB: ~1 ms to receive,
1.6 ms to parse), so while the service would refuse any call for its load, a DraftStream
step is not parsed but becomes an :class:`Unparsed` refused for it, and a unary Draft
call is refused by :class:`CallGate` before its message is received (flow control leaves
the message with the caller), once the gate has checked the caller's credentials.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError, Message

from drafter_service.edge.grpc_auth import ClientAuth, Unauthenticated
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
        # A unary Draft call's load is asked before it is read (CallGate) and again, with
        # its deadline, by the servicer: only a stream's steps are asked here.
        parse = _tolerant(getattr(pb, method.input_type.name), overloaded if streaming else None)
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=parse,
            response_serializer=_serialize,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


caller_namespace: ContextVar[str] = ContextVar("caller_namespace")
"""The request-id prefix of the caller :class:`CallGate` admitted (``ClientAuth.namespace``),
set for the method it runs; unset in a call it did not gate."""


class CallGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Decides on each call of the service before its request message is read: first the
    caller's credentials (UNAUTHENTICATED), then, for a unary Draft call, the load (what
    ``overloaded()`` names; ``code_of`` maps it to its status), so a stranger never learns
    about the load and a refusal costs neither receiving nor parsing the message.

    gRPC parses a unary request before the method runs, so the gate serves a method with a
    request-streaming handler that decides first and reads the message once admitted.
    Without authentication only a unary Draft call met while the service is overloaded is
    gated. A refusal is reported to ``refused(method, code)``; ``refused_unread`` counts the
    calls refused for their load, ``messages_read`` the messages gated calls parsed."""

    def __init__(
        self,
        auth: ClientAuth,
        overloaded: Overloaded,
        code_of: Callable[[ServiceError], grpc.StatusCode],
        refused: Callable[[str, str], None],
    ) -> None:
        self._auth = auth
        self._overloaded = overloaded
        self._code_of = code_of
        self._refused = refused
        self._prefix = f"/{SERVICE_NAME}/"
        self._gated: dict[str, tuple[Any, Any]] = {}  # full method: (its handler, gated one)
        self.messages_read = 0
        self.refused_unread = 0

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = await continuation(details)
        full: str = details.method
        if handler is None or not full.startswith(self._prefix):
            return handler  # health checking and reflection stay open
        method = full.removeprefix(self._prefix)
        if not self._auth.enabled and (method != "Draft" or self._overloaded() is None):
            return handler  # nothing to decide before the message is read
        known = self._gated.get(full)
        if known is None or known[0] is not handler:
            known = (handler, self._gate(method, handler))
            self._gated[full] = known
        return known[1]

    async def _admit(self, method: str, context: Any) -> None:
        try:
            caller_namespace.set(self._auth.namespace(context))
        except Unauthenticated as exc:
            await self._refuse(method, context, grpc.StatusCode.UNAUTHENTICATED, str(exc))

    async def _refuse(self, method: str, context: Any, code: Any, why: str) -> NoReturn:
        self._refused(method, code.name)
        await context.abort(code, why)
        raise AssertionError("context.abort returned")

    def _gate(self, method: str, handler: Any) -> Any:
        """The service's methods are unary-unary or, DraftStream, stream-stream."""
        parse = handler.request_deserializer

        def deserialize(data: bytes) -> Any:
            self.messages_read += 1
            return parse(data)

        options = dict(request_deserializer=deserialize,
                       response_serializer=handler.response_serializer)  # fmt: skip
        if handler.response_streaming:

            async def stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
                await self._admit(method, context)
                async for response in handler.stream_stream(requests, context):
                    yield response

            return grpc.stream_stream_rpc_method_handler(stream, **options)

        async def unary(requests: AsyncIterator[Any], context: Any) -> Any:
            await self._admit(method, context)
            if method == "Draft" and (refusal := self._overloaded()) is not None:
                self.refused_unread += 1
                await self._refuse(method, context, self._code_of(refusal), str(refusal))
            request = await anext(aiter(requests), None)  # read once admitted
            if request is None:
                await self._refuse(method, context, grpc.StatusCode.INVALID_ARGUMENT,
                                   "the call carried no request message")  # fmt: skip
            return await handler.unary_unary(request, context)

        return grpc.stream_unary_rpc_method_handler(unary, **options)
