"""Bearer-token authentication of the admin API, as an ASGI middleware: before routing
and body parsing, so an unauthenticated caller learns nothing and sends no body.

* Changes (any method but GET/HEAD/OPTIONS) and a snapshot's files (the datastore's whole
  content) always need the token; with none configured they are refused 403.
* With a token configured, reads need it too, except the probes and the API description
  (``/openapi.json``, ``/docs`` and its assets: no server state).
* A missing or wrong token is 401 with ``WWW-Authenticate``; compared in constant time.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from drafter_service.admin.http_errors import error_response
from drafter_service.service.admin_token import TOKEN_ENV

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect"})
DOCS_ASSETS_PATH = "/docs/assets"  # Swagger UI's files (static, the package's own copies)
REALM = 'Bearer realm="drafter-admin"'
NO_TOKEN_MESSAGE = (
    "admin calls that change state or read a snapshot's files are disabled: no admin "
    "token is configured; set "
    f"--admin-token-file (DRAFTER_ADMIN_TOKEN_FILE) or the {TOKEN_ENV} environment variable"
)


class BearerAuth:
    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._token = token.encode("utf-8") if token is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        mutating = scope["method"] not in READ_METHODS or _content(scope["path"])
        if not mutating and (self._token is None or _public(scope["path"])):
            await self.app(scope, receive, send)
            return
        if self._token is None:
            await error_response(403, "admin_disabled", NO_TOKEN_MESSAGE)(scope, receive, send)
            return
        presented = _bearer(scope)
        if presented is None or not hmac.compare_digest(presented, self._token):
            message = (
                "missing bearer token (Authorization: Bearer <token>)"
                if presented is None
                else "invalid bearer token"
            )
            response = error_response(401, "unauthenticated", message)
            response.headers["WWW-Authenticate"] = REALM
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _content(path: str) -> bool:
    """Whether ``path`` reads a snapshot's files (the datastore's content)."""
    parts = path.split("/")
    return len(parts) >= 7 and parts[1:3] == ["v1", "datastores"] and parts[4] == "snapshots" \
        and parts[6] == "files"  # fmt: skip


def _public(path: str) -> bool:
    """Whether ``path`` is readable without the token (no ``..``: the prefix is no way out)."""
    if path in PUBLIC_PATHS:
        return True
    return path.startswith(DOCS_ASSETS_PATH + "/") and ".." not in path.split("/")


def _bearer(scope: Scope) -> bytes | None:
    """The token of the ``Authorization: Bearer <token>`` header, or None."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, credentials = value.partition(b" ")
            if scheme.lower() == b"bearer" and credentials.strip():
                return bytes(credentials.strip())
            return None
    return None
