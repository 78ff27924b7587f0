"""The body-size limit: 413 before the application reads a body over it."""

from __future__ import annotations

from ..errors import ApiError, api_error_response, error_response
from .send import tracking_send


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413 before the app reads them (Content-Length)
    or as soon as the streamed body passes the limit (chunked)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, int(max_bytes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        msg = (f"request body is larger than this server's limit of {self.max_bytes:,} bytes; send fewer rows "
               "or ask the operator to raise PM_VECTOR_SERVICE_MAX_BODY_BYTES.")
        for name, value in scope.get("headers") or []:
            if name == b"content-length":
                try:
                    n = int(value)
                except ValueError:
                    bad = error_response(400, "bad_request", "invalid Content-Length header.")
                    return await bad(scope, receive, send)
                if n > self.max_bytes:
                    return await error_response(413, "payload_too_large", msg)(scope, receive, send)
        seen = 0
        too_big = False

        async def limited():
            nonlocal seen, too_big
            m = await receive()
            if m["type"] == "http.request":
                seen += len(m.get("body", b""))
                if seen > self.max_bytes:
                    too_big = True
                    raise ApiError(413, "payload_too_large", msg)
            return m

        tracked = tracking_send(send)
        try:
            await self.app(scope, limited, tracked)
        except ApiError as exc:
            if not too_big or tracked.started:
                raise
            await api_error_response(exc)(scope, receive, send)
