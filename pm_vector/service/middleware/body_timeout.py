"""ASGI middleware that bounds the time a request's body may take to arrive.

Without it a client that declares ``Content-Length: 1000`` and sends 8 bytes holds a connection
and a request task for as long as it likes (uvicorn's own timeouts cover idle keep-alive
connections, not a body that trickles in). :class:`BodyTimeoutMiddleware` gives the whole body
``timeout_s`` seconds from the moment the application first reads it; past that the request is
answered 408 ``request_timeout`` with ``Connection: close`` and nothing is processed or written.
"""

from __future__ import annotations

import asyncio

from ..errors import ApiError, api_error_response
from .send import tracking_send


class BodyTimeoutMiddleware:
    """Answer 408 when the request body is not complete ``timeout_s`` seconds after the app
    starts reading it (module doc)."""

    def __init__(self, app, timeout_s: float):
        if not timeout_s > 0:
            raise ValueError("timeout_s must be > 0")
        self.app, self.timeout_s = app, float(timeout_s)

    def _error(self) -> ApiError:
        return ApiError(408, "request_timeout", f"the request body did not arrive within {self.timeout_s:g} s; send "
                        "it at once (the operator sets PM_VECTOR_SERVICE_BODY_TIMEOUT_S).", {"Connection": "close"})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        complete = False
        timed_out = False

        async def timed_receive():
            nonlocal deadline, complete, timed_out
            if complete:  # after the body only http.disconnect can come: no limit
                return await receive()
            if deadline is None:
                deadline = loop.time() + self.timeout_s
            try:  # asyncio.timeout_at, not wait_for: no task made per message
                async with asyncio.timeout_at(deadline):
                    m = await receive()
            except TimeoutError:
                timed_out = True
                raise self._error() from None
            if m["type"] != "http.request" or not m.get("more_body", False):
                complete = True
            return m

        tracked = tracking_send(send)
        try:
            await self.app(scope, timed_receive, tracked)
        except ApiError as exc:
            if not timed_out or tracked.started:
                raise
            await api_error_response(exc)(scope, receive, send)
