"""The gRPC servicer: converts messages, delegates to the engine, maps errors to codes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from drafter_service.service.drafting import DraftEngine
from drafter_service.service.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    ServiceError,
    Unavailable,
)
from drafter_service.service.responses import (
    DatastoreSummary,
    draft_response,
    service_info_response,
)
from drafter_service.service.validation import (
    parse_draft_request,
    parse_finish_request,
    parse_ingest_request,
)
from sssd.drafter.v1 import drafter_pb2 as pb
from sssd.drafter.v1 import drafter_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")

_CODES: dict[type[ServiceError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    NotFound: grpc.StatusCode.NOT_FOUND,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
}


def status_code(error: ServiceError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in _CODES:
            return _CODES[cls]
    return grpc.StatusCode.INTERNAL


class DrafterServicer(pb_grpc.DrafterServiceServicer):
    """drafter.v1.DrafterService. Answers UNAVAILABLE until :meth:`attach`."""

    def __init__(self, version: str, max_message_bytes: int) -> None:
        self._version = version
        self._max_message_bytes = max_message_bytes
        self._engine: DraftEngine | None = None

    def attach(self, engine: DraftEngine) -> None:
        self._engine = engine

    async def Draft(self, request: pb.DraftRequest, context: Any) -> pb.DraftResponse:
        return await self._guard(context, lambda engine: _draft(engine, request))

    async def DraftStream(
        self, request_iterator: AsyncIterator[pb.DraftRequest], context: Any
    ) -> AsyncIterator[pb.DraftResponse]:
        # One step at a time, in order; a refused message ends the stream with its code.
        async for request in request_iterator:
            yield await self._guard(context, lambda engine: _draft(engine, request))  # noqa: B023

    async def Finish(self, request: pb.FinishRequest, context: Any) -> pb.FinishResponse:
        async def finish(engine: DraftEngine) -> pb.FinishResponse:
            queued, unknown = await engine.finish(parse_finish_request(request, engine.limits))
            return pb.FinishResponse(ingested=queued, unknown_request_ids=unknown)

        return await self._guard(context, finish)

    async def Ingest(self, request: pb.IngestRequest, context: Any) -> pb.IngestResponse:
        async def ingest(engine: DraftEngine) -> pb.IngestResponse:
            name, sequences = parse_ingest_request(request, engine.limits)
            accepted, position = await engine.ingest(name, sequences)
            return pb.IngestResponse(accepted=accepted, wal_position=position)

        return await self._guard(context, ingest)

    async def GetServiceInfo(
        self, request: pb.GetServiceInfoRequest, context: Any
    ) -> pb.GetServiceInfoResponse:
        async def info(engine: DraftEngine) -> pb.GetServiceInfoResponse:
            catalog = engine.catalog
            summaries = []
            for name, slot in catalog.slots.items():
                s = slot.stats()
                summaries.append(
                    DatastoreSummary(
                        name,
                        name == engine.limits.default_datastore,
                        slot.live is not None,
                        s.num_tokens,
                        s.sub_indices,
                        s.resident_bytes,
                    )
                )
            return service_info_response(
                self._version,
                catalog.tokenizer.name,
                engine.limits,
                self._max_message_bytes,
                summaries,
            )

        return await self._guard(context, info)

    async def _guard(self, context: Any, call: Callable[[DraftEngine], Awaitable[T]]) -> T:
        """Runs ``call`` with the engine; a refusal becomes its status code, a bug INTERNAL."""
        try:
            if self._engine is None:
                raise Unavailable("the drafter is loading its datastores; retry shortly")
            return await call(self._engine)
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        except Exception as exc:
            log.exception("internal error")
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc!r}")
        raise AssertionError("context.abort returned")


async def _draft(engine: DraftEngine, request: pb.DraftRequest) -> pb.DraftResponse:
    answer = await engine.draft(parse_draft_request(request, engine.limits))
    return draft_response(answer, request.step)
