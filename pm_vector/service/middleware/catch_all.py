"""The innermost middleware: any exception the application's handlers left unhandled, answered as JSON."""

from __future__ import annotations

import logging

import psycopg

from ..errors import api_error_response, database_down, database_unavailable, error_response
from .send import tracking_send


class CatchAllMiddleware:
    """Answer any exception the app's handlers left unhandled as JSON, without re-raising it.

    Starlette's handler for ``Exception`` runs in its outermost middleware, which sends the answer
    and then re-raises: uvicorn then drops the keep-alive connection and the client's next request
    on it is reset. Installed innermost, this answers first: 503 with Retry-After while the
    database is down, 422 for a value PostgreSQL cannot hold (a NUL byte, an integer beyond 64
    bits), else 500 (logged)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        tracked = tracking_send(send)
        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:  # noqa: BLE001 - every failure gets an answer, the connection stays usable
            if tracked.started:
                raise

            if database_down(exc):
                resp = api_error_response(database_unavailable())
            elif isinstance(exc, (psycopg.DataError, RecursionError)):
                resp = error_response(422, "invalid_input", "a value in the request cannot be stored or read (a NUL "
                                      "byte, an integer beyond 64 bits, or nesting too deep); fix it and send again.")
            else:
                logging.getLogger("pm_vector.service").exception("internal error")
                resp = error_response(500, "internal_error", f"internal error ({type(exc).__name__}); the server log "
                                      "has details.")
            await resp(scope, receive, send)
