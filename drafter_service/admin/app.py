"""The admin API's FastAPI application: routes, one JSON error shape for every failure,
authentication and the request size limit."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp

from drafter_service.admin import corpus_routes, routes, snapshot_routes
from drafter_service.admin.bearer_auth import DOCS_ASSETS_PATH, BearerAuth
from drafter_service.admin.body_limit import BodyLimit
from drafter_service.admin.http_errors import AdminError, error_response
from drafter_service.admin.routes import AdminContext
from drafter_service.admin.schemas import ErrorBody

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
_ERROR_STATUSES = {
    400: "malformed request (e.g. invalid JSON, a path outside the corpora directory)",
    401: "missing or wrong bearer token",
    403: "state-changing calls are disabled: no admin token is configured",
    404: "no such datastore, snapshot, corpus, job or route",
    409: "conflicts with the current state (read-only datastore, name in use, ...)",
    413: "request body too large",
    422: "a value does not validate (names, settings, fields)",
    503: "the datastores are not loaded (starting or stopping)",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in _ERROR_STATUSES.items()
}
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def create_app(context: AdminContext, token: str | None) -> ASGIApp:
    """The admin application over ``context`` (wrapped in auth and the size limit)."""
    # /docs: Swagger UI with its files served from this process (fastapi-offline's), so it
    # renders without internet access; no /redoc (it loads its script from a CDN).
    app = FastAPIOffline(
        title="drafter admin",
        summary="Operate a drafting service: datastores, snapshots, corpora, settings.",
        version="1",
        responses=ERROR_RESPONSES,
        redoc_url=None,
        static_url=DOCS_ASSETS_PATH,
    )
    app.state.admin = context
    app.include_router(routes.probes)
    app.include_router(routes.v1)
    app.include_router(snapshot_routes.router)
    app.include_router(corpus_routes.router)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    # Outermost first: authenticate before reading any body, then bound the body.
    return BearerAuth(BodyLimit(app, MAX_BODY_BYTES), token)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "bad_request", "the request body is not valid JSON")
    parts = []
    for e in errors[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()))
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return error_response(422, "invalid_request", "; ".join(parts) or "invalid request")


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    default = _HTTP_CODES.get(exc.status_code, "http_error")
    code = exc.code if isinstance(exc, AdminError) else default
    response = error_response(exc.status_code, code, str(exc.detail))
    response.headers.update(exc.headers or {})
    return response


async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
    log.exception("admin API: unexpected error", exc_info=exc)
    return error_response(500, "internal", f"internal error: {type(exc).__name__}")
