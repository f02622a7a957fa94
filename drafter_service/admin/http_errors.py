"""The admin API's one error shape, ``{"error": {"code": ..., "message": ...}}``, and the
exception that routes raise to produce it."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse


class AdminError(HTTPException):
    """An error answered as ``status`` with a machine-readable ``code`` (and ``message``
    as its ``detail``): the app's one HTTPException handler answers it."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(status, message)
        self.code = code


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def not_found(what: str) -> AdminError:
    return AdminError(404, "not_found", what)


def conflict(message: str) -> AdminError:
    return AdminError(409, "conflict", message)


def bad_request(message: str) -> AdminError:
    return AdminError(400, "bad_request", message)
