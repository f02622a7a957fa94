"""Unary Draft calls refused for the service's load before their message is received.

gRPC receives and parses the request of a unary method before the method runs, so a
refusal from the servicer has paid for the message: a heavy Draft call (64 requests of
2,000 tokens, 368 KB) costs about 1 ms of the service's core to receive and 1.6 ms to
parse. Under a flood those costs decide how much of the core is left for the calls it can
answer. The gate asks, when gRPC looks up the call's handler (before any of its message
is read), whether the service would refuse any call for its load alone; if so, it serves
the call with a request-streaming handler that aborts without reading: flow control leaves
the message with the caller. Otherwise the call goes on as registered, at no extra cost.

DraftStream steps are shed where they are parsed instead
(:class:`~drafter_service.edge.wire.Shed`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from drafter_service.edge.wire import SERVICE_NAME, Overloaded
from drafter_service.engine.call_errors import ServiceError

__all__ = ["LoadGate"]


class LoadGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses a unary Draft call with what ``overloaded()`` names before reading it;
    ``code_of`` maps the refusal to its status, ``refused(method, code)`` counts it.
    ``refused_unread`` counts those calls, for tests and benchmarks."""

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
        if details.method == self._draft and (refusal := self._overloaded()) is not None:
            return grpc.stream_unary_rpc_method_handler(self._refusing(refusal))
        return await continuation(details)

    def _refusing(self, refusal: ServiceError) -> Callable[[AsyncIterator[Any], Any], Any]:
        code = self._code_of(refusal)

        async def refuse(_: AsyncIterator[Any], context: Any) -> Any:
            self.refused_unread += 1
            self._refused("Draft", code.name)
            await context.abort(code, str(refusal))

        return refuse
