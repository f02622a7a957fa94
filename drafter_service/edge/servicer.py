"""The gRPC servicer: converts messages, delegates to the engine, maps errors to codes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

import grpc

from drafter_service.edge.grpc_auth import ClientAuth, Unauthenticated
from drafter_service.edge.responses import draft_response, service_info_response
from drafter_service.edge.validation import (
    parse_draft_request,
    parse_finish_request,
    parse_ingest_request,
)
from drafter_service.edge.wire import Unparsed, caller_namespace
from drafter_service.engine.call_errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    ServiceError,
    Unavailable,
)
from drafter_service.engine.calls import CallLimits
from drafter_service.engine.draft_engine import DraftEngine
from drafter_service.log_limits import RateLimitedLog
from drafter_service.metrics.drafter_metrics import DrafterMetrics
from sssd_drafter.v1 import drafter_pb2 as pb
from sssd_drafter.v1 import drafter_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")
M = TypeVar("M")

_CODES: dict[type[ServiceError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    NotFound: grpc.StatusCode.NOT_FOUND,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
}


ANSWERED_CODES = (*(code.name for code in _CODES.values()), "INTERNAL", "CANCELLED")
"""Every status name a call is counted as failing with (``DrafterMetrics``' error codes)."""


def status_code(error: ServiceError) -> grpc.StatusCode:
    return _CODES.get(type(error), grpc.StatusCode.INTERNAL)


class DrafterServicer(pb_grpc.DrafterServiceServicer):
    """sssd_drafter.v1.DrafterService. Answers UNAVAILABLE until :meth:`attach`."""

    def __init__(
        self, version: str, max_message_bytes: int, metrics: DrafterMetrics, auth: ClientAuth
    ) -> None:
        self._auth = auth
        self._internal_log = RateLimitedLog(log)  # a bug every call hits: one line a while
        self._undecodable_log = RateLimitedLog(log)  # a flood of garbage, likewise
        self._version = version
        self._max_message_bytes = max_message_bytes
        self._metrics = metrics
        self._engine: DraftEngine | None = None
        self._limits: CallLimits  # set with the engine

    def attach(self, engine: DraftEngine, limits: CallLimits) -> None:
        self._engine, self._limits = engine, limits

    def overloaded(self) -> ServiceError | None:
        """What a Draft call arriving now would be refused for the load alone."""
        if self._engine is None:
            return None  # the loading answer comes from _guard, after authentication
        try:
            self._engine.check_admission()
        except ServiceError as exc:
            return exc
        return None

    async def Draft(self, request: pb.DraftRequest | Unparsed, context: Any) -> pb.DraftResponse:
        remaining = context.time_remaining()  # None without a deadline
        deadline = time.monotonic() + remaining if remaining is not None else None
        draft = partial(self._draft, "Draft", deadline_s=deadline)
        return await self._guard("Draft", context, request, draft)

    async def DraftStream(
        self, request_iterator: AsyncIterator[pb.DraftRequest | Unparsed], context: Any
    ) -> AsyncIterator[pb.DraftResponse]:
        # One step at a time, in order; a refused message ends the stream with its code.
        draft = partial(self._draft, "DraftStream")
        async for request in request_iterator:
            yield await self._guard("DraftStream", context, request, draft)

    async def Finish(self, request: pb.FinishRequest | Unparsed, context: Any) -> pb.FinishResponse:
        return await self._guard("Finish", context, request, self._finish)

    async def Ingest(self, request: pb.IngestRequest | Unparsed, context: Any) -> pb.IngestResponse:
        return await self._guard("Ingest", context, request, self._ingest)

    async def GetServiceInfo(
        self, request: pb.GetServiceInfoRequest | Unparsed, context: Any
    ) -> pb.GetServiceInfoResponse:
        return await self._guard("GetServiceInfo", context, request, self._service_info)

    async def _guard(
        self,
        method: str,
        context: Any,
        request: M | Unparsed,
        call: Callable[[DraftEngine, M, str], Awaitable[T]],
    ) -> T:
        """Runs ``call`` with the engine; a refusal becomes its status code, a bug INTERNAL
        (counted by code; answered calls timed)."""
        start = time.perf_counter()
        try:
            namespace = caller_namespace.get(None)  # the gate's, when it checked the caller
            if namespace is None:
                namespace = self._auth.namespace(context)  # first: strangers learn nothing
            if isinstance(request, Unparsed):
                if request.undecodable:
                    log_line = "refused an undecodable request: %s"
                    self._undecodable_log.warning(log_line, request.refusal)
                raise request.refusal
            if self._engine is None:
                raise Unavailable("the drafter is loading its datastores; retry shortly")
            result = await call(self._engine, request, namespace)
        except ServiceError as exc:
            code = status_code(exc)
            self._metrics.count_error(method, code.name)
            await context.abort(code, str(exc))
        except asyncio.CancelledError:  # the client went away (deadline, cancel)
            self._metrics.count_error(method, grpc.StatusCode.CANCELLED.name)
            raise
        except Exception as exc:
            self._metrics.count_error(method, grpc.StatusCode.INTERNAL.name)
            self._internal_log.error("internal error in %s: %r", method, exc, error=exc)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc!r}")
        else:
            self._metrics.record_call(method, time.perf_counter() - start)
            return result
        raise AssertionError("context.abort returned")

    async def _draft(
        self,
        method: str,
        engine: DraftEngine,
        request: pb.DraftRequest,
        namespace: str,
        deadline_s: float | None = None,
    ) -> pb.DraftResponse:
        """``deadline_s`` (monotonic): the call's gRPC deadline; a stream's steps have none."""
        engine.check_admission(deadline_s)
        call = parse_draft_request(request, self._limits)
        ids = call.request_ids
        if namespace:  # the engine sees the client's ids under its own prefix
            call = replace(call, request_ids=[namespace + r for r in ids], client=namespace)
        answer = await engine.draft(call, deadline_s)
        self._metrics.record_batch(method, len(ids))
        return draft_response(ids, answer, request.step, packed=request.HasField("packed"))

    async def _finish(
        self, engine: DraftEngine, request: pb.FinishRequest, namespace: str
    ) -> pb.FinishResponse:
        items = parse_finish_request(request, self._limits)
        if namespace:
            items = [replace(i, request_id=namespace + i.request_id) for i in items]
        queued, unknown, durable = await engine.finish(items, request.wait_durable)
        unknown = [u.removeprefix(namespace) for u in unknown]
        return pb.FinishResponse(ingested=queued, unknown_request_ids=unknown, durable=durable)

    async def _ingest(
        self, engine: DraftEngine, request: pb.IngestRequest, _: str
    ) -> pb.IngestResponse:
        name, sequences = parse_ingest_request(request, self._limits)
        accepted, position = await engine.ingest(name, sequences)
        return pb.IngestResponse(accepted=accepted, wal_position=position)

    async def _service_info(
        self, engine: DraftEngine, _: pb.GetServiceInfoRequest, __: str
    ) -> pb.GetServiceInfoResponse:
        return service_info_response(self._version, self._limits, self._max_message_bytes)
