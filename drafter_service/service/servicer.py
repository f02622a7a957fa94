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

from drafter_service.service.call_errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    ServiceError,
    Unavailable,
)
from drafter_service.service.draft_engine import DraftEngine, Prefetch
from drafter_service.service.drafter_metrics import DrafterMetrics
from drafter_service.service.grpc_auth import ClientAuth, Unauthenticated
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
from drafter_service.service.wire import Undecodable, UndecodableRefusals
from sssd.drafter.v1 import drafter_pb2 as pb
from sssd.drafter.v1 import drafter_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")
M = TypeVar("M")

_CODES: dict[type[ServiceError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    NotFound: grpc.StatusCode.NOT_FOUND,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
}


def _result(task: asyncio.Task[Prefetch | None]) -> Prefetch | None:
    """A finished pre-drafting task's pre-drafts; None if unfinished or failed (logged)."""
    if not task.done() or task.cancelled():
        return None
    error = task.exception()
    if error is not None:
        log.warning("pre-drafting failed: %r", error)
        return None
    return task.result()


def status_code(error: ServiceError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in _CODES:
            return _CODES[cls]
    return grpc.StatusCode.INTERNAL


class DrafterServicer(pb_grpc.DrafterServiceServicer):
    """drafter.v1.DrafterService. Answers UNAVAILABLE until :meth:`attach`."""

    def __init__(
        self,
        version: str,
        max_message_bytes: int,
        metrics: DrafterMetrics | None = None,
        auth: ClientAuth | None = None,
    ) -> None:
        self._auth = auth or ClientAuth()
        self._undecodable = UndecodableRefusals()
        self._version = version
        self._max_message_bytes = max_message_bytes
        self._metrics = DrafterMetrics(version) if metrics is None else metrics
        self._engine: DraftEngine | None = None

    def attach(self, engine: DraftEngine) -> None:
        self._engine = engine

    async def Draft(
        self, request: pb.DraftRequest | Undecodable, context: Any
    ) -> pb.DraftResponse:
        return await self._guard("Draft", context, request, partial(self._draft, "Draft"))

    async def DraftStream(
        self, request_iterator: AsyncIterator[pb.DraftRequest | Undecodable], context: Any
    ) -> AsyncIterator[pb.DraftResponse]:
        # One step at a time, in order; a refused message ends the stream with its code.
        # With pre-drafting, a step's pre-drafts are computed once its answer is sent,
        # while the next message is awaited: they are sent if ready first, and dropped if
        # the next step arrives before them (the client could not have used them).
        step = partial(self._draft_step, "DraftStream")
        messages = aiter(request_iterator)
        prefetch: asyncio.Task[Prefetch | None] | None = None
        receive: asyncio.Future[pb.DraftRequest | Undecodable | None] | None = None
        try:
            while True:
                if prefetch is None:  # the usual path: no task per message
                    request = await anext(messages, None)
                else:
                    receive = asyncio.ensure_future(anext(messages, None))
                    await asyncio.wait({receive, prefetch}, return_when=asyncio.FIRST_COMPLETED)
                    ready = None if receive.done() else _result(prefetch)
                    prefetch.cancel()
                    prefetch = None
                    if ready is not None and self._engine is not None:
                        yield ready.response
                        self._engine.keep_predrafts(ready)
                    request = await receive
                    receive = None
                if request is None:
                    return
                response, after = await self._guard("DraftStream", context, request, step)
                yield response
                if after is not None:
                    prefetch = asyncio.ensure_future(after())
        finally:
            for task in (prefetch, receive):
                if task is not None:
                    task.cancel()

    async def Finish(
        self, request: pb.FinishRequest | Undecodable, context: Any
    ) -> pb.FinishResponse:
        return await self._guard("Finish", context, request, self._finish)

    async def Ingest(
        self, request: pb.IngestRequest | Undecodable, context: Any
    ) -> pb.IngestResponse:
        return await self._guard("Ingest", context, request, self._ingest)

    async def GetServiceInfo(
        self, request: pb.GetServiceInfoRequest | Undecodable, context: Any
    ) -> pb.GetServiceInfoResponse:
        return await self._guard("GetServiceInfo", context, request, self._service_info)

    async def _guard(
        self,
        method: str,
        context: Any,
        request: M | Undecodable,
        call: Callable[[DraftEngine, M, str], Awaitable[T]],
    ) -> T:
        """Runs ``call`` with the engine; a refusal becomes its status code, a bug INTERNAL.
        Counts failures by code and times the answered ones (metrics)."""
        start = time.perf_counter()
        try:
            namespace = self._auth.namespace(context)  # first: strangers learn nothing
            if isinstance(request, Undecodable):
                raise self._undecodable.refuse(request)
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
            log.exception("internal error")
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc!r}")
        else:
            self._metrics.record_call(method, time.perf_counter() - start)
            return result
        raise AssertionError("context.abort returned")

    async def _draft(
        self, method: str, engine: DraftEngine, request: pb.DraftRequest, namespace: str
    ) -> pb.DraftResponse:
        response, _ = await self._draft_step(method, engine, request, namespace)
        return response

    async def _draft_step(
        self, method: str, engine: DraftEngine, request: pb.DraftRequest, namespace: str
    ) -> tuple[pb.DraftResponse, Callable[[], Awaitable[Prefetch | None]] | None]:
        """The step's answer, and (when it asks for pre-drafts) what computes them."""
        call = parse_draft_request(request, engine.limits)
        ids = call.request_ids
        if namespace:  # the engine sees the client's ids under its own prefix
            call = replace(call, request_ids=[namespace + r for r in ids])
            answer = replace(await engine.draft(call), request_ids=ids)
        else:
            answer = await engine.draft(call)
        self._metrics.record_batch(method, len(answer.request_ids))
        response = draft_response(answer, request.step, packed=request.HasField("packed"))
        after = partial(engine.predraft, call, request.step, ids) if call.prefetch_fan_out else None
        return response, after

    async def _finish(
        self, engine: DraftEngine, request: pb.FinishRequest, namespace: str
    ) -> pb.FinishResponse:
        items = parse_finish_request(request, engine.limits)
        if namespace:
            items = [replace(i, request_id=namespace + i.request_id) for i in items]
        queued, unknown, durable = await engine.finish(items, request.wait_durable)
        unknown = [u.removeprefix(namespace) for u in unknown]
        return pb.FinishResponse(ingested=queued, unknown_request_ids=unknown, durable=durable)

    async def _ingest(
        self, engine: DraftEngine, request: pb.IngestRequest, _: str
    ) -> pb.IngestResponse:
        name, sequences = parse_ingest_request(request, engine.limits)
        accepted, position = await engine.ingest(name, sequences)
        return pb.IngestResponse(accepted=accepted, wal_position=position)

    async def _service_info(
        self, engine: DraftEngine, _: pb.GetServiceInfoRequest, __: str
    ) -> pb.GetServiceInfoResponse:
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
