"""Request body size limit (413) as an ASGI middleware: refuses a declared
``Content-Length`` over the limit before reading anything; a body sent without one
(chunked) is read here, at most up to the limit, and handed on from memory."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from drafter_service.admin.http_errors import error_response


class BodyLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        too_large = error_response(
            413, "payload_too_large", f"request body over the limit of {limit} bytes"
        )
        headers = dict(scope["headers"])
        if b"content-length" in headers:
            try:
                declared = int(headers[b"content-length"])
            except ValueError:
                declared = -1
            if declared < 0:
                await error_response(400, "bad_request", "invalid Content-Length")(
                    scope, receive, send
                )
            elif declared > limit:
                await too_large(scope, receive, send)
            else:  # the server never delivers more than the declared length
                await self.app(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client gone
                return
            body += message.get("body", b"")
            if len(body) > limit:
                await too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        unread: list[Message] = [{"type": "http.request", "body": bytes(body), "more_body": False}]

        async def replay() -> Message:  # the body, then what the client sends (http.disconnect)
            return unread.pop() if unread else await receive()

        await self.app(scope, replay, send)
