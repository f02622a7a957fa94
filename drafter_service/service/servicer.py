"""The gRPC servicer: converts messages, delegates to the engine, maps errors to codes."""

from __future__ import annotations

import asyncio
import logging
import time
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
from drafter_service.service.metrics import DrafterMetrics
from drafter_service.service.responses import (
    DatastoreSummary,
    draft_response,
    packed_draft_response,
    service_info_response,
)
from drafter_service.service.validation import (
    parse_draft_request,
    parse_finish_request,
    parse_ingest_request,
    parse_packed_draft_request,
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

    def __init__(
        self, version: str, max_message_bytes: int, metrics: DrafterMetrics | None = None
    ) -> None:
        self._version = version
        self._max_message_bytes = max_message_bytes
        self._metrics = DrafterMetrics(version) if metrics is None else metrics
        self._engine: DraftEngine | None = None

    def attach(self, engine: DraftEngine) -> None:
        self._engine = engine

    async def Draft(self, request: pb.DraftRequest, context: Any) -> pb.DraftResponse:
        return await self._guard(
            "Draft", context, lambda engine: self._draft(engine, request, "Draft")
        )

    async def DraftStream(
        self, request_iterator: AsyncIterator[pb.DraftRequest], context: Any
    ) -> AsyncIterator[pb.DraftResponse]:
        # One step at a time, in order; a refused message ends the stream with its code.
        async for request in request_iterator:
            yield await self._guard(
                "DraftStream",
                context,
                lambda engine: self._draft(engine, request, "DraftStream"),  # noqa: B023
            )

    async def Finish(self, request: pb.FinishRequest, context: Any) -> pb.FinishResponse:
        async def finish(engine: DraftEngine) -> pb.FinishResponse:
            queued, unknown = await engine.finish(parse_finish_request(request, engine.limits))
            return pb.FinishResponse(ingested=queued, unknown_request_ids=unknown)

        return await self._guard("Finish", context, finish)

    async def Ingest(self, request: pb.IngestRequest, context: Any) -> pb.IngestResponse:
        async def ingest(engine: DraftEngine) -> pb.IngestResponse:
            name, sequences = parse_ingest_request(request, engine.limits)
            accepted, position = await engine.ingest(name, sequences)
            return pb.IngestResponse(accepted=accepted, wal_position=position)

        return await self._guard("Ingest", context, ingest)

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

        return await self._guard("GetServiceInfo", context, info)

    async def _guard(
        self, method: str, context: Any, call: Callable[[DraftEngine], Awaitable[T]]
    ) -> T:
        """Runs ``call`` with the engine; a refusal becomes its status code, a bug INTERNAL.
        Counts failures by code and times the answered ones (metrics)."""
        start = time.perf_counter()
        try:
            if self._engine is None:
                raise Unavailable("the drafter is loading its datastores; retry shortly")
            result = await call(self._engine)
        except ServiceError as exc:
            code = status_code(exc)
            self._metrics.count_error(method, code.name)
            await context.abort(code, str(exc))
        except asyncio.CancelledError:  # the client went away (deadline, cancel)
            self._metrics.count_error(method, grpc.StatusCode.CANCELLED.name)
            raise
        except Exception as exc:
            self._metrics.count_error(method, grpc.StatusCode.INTERNAL.name)
            log.exception("internal error")
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc!r}")
        else:
            self._metrics.record_call(method, time.perf_counter() - start)
            return result
        raise AssertionError("context.abort returned")


    async def _draft(
        self, engine: DraftEngine, request: pb.DraftRequest, method: str
    ) -> pb.DraftResponse:
        packed = request.HasField("packed")
        parse = parse_packed_draft_request if packed else parse_draft_request
        answer = await engine.draft(parse(request, engine.limits))
        self._metrics.record_batch(method, len(answer.request_ids))
        respond = packed_draft_response if packed else draft_response
        return respond(answer, request.step)
