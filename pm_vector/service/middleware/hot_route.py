"""The hottest route, ``POST /collections/{name}/resolve``, answered without FastAPI's router.

FastAPI matches a request against each included router's routes in turn and solves the
endpoint's dependencies (its path parameter, its ``Request``, the one dependency
:func:`pm_vector.service.deps.resolve_context`) on every request: in-process, about a third of
a repeated location request's CPU. :class:`ResolveRoute`, the innermost middleware, answers that
one method and path itself with the route's own checks
(:func:`~pm_vector.service.deps.resolve_context`: 404, 415, 406, in that order) and its own body
(:func:`pm_vector.service.routers.resolve.answer`). The route stays declared on its router for
``/openapi.json``, and every other method or path goes on to FastAPI as before.

Errors are answered as the application's exception handlers answer them (looked up by the
exception's class, as Starlette's exception middleware does); an exception no handler takes (the
handler of ``Exception`` runs outermost, in Starlette's) goes on to
:class:`~.catch_all.CatchAllMiddleware`, as it did from the router.
"""

from __future__ import annotations

import re

from starlette.requests import Request

from ..deps import resolve_context
from ..routers.resolve import answer

#: the route's path (Starlette's ``{name}``: one segment, already percent-decoded in ``scope["path"]``)
RESOLVE_PATH = re.compile(r"/collections/(?P<name>[^/]+)/resolve")


def _handler(app, exc: Exception):
    """The application's handler of ``exc``'s class (the nearest in its MRO), or None; the handler
    of ``Exception`` is Starlette's outermost middleware's, not this one's (module doc)."""
    handlers = getattr(app, "exception_handlers", None) or {}
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None


class ResolveRoute:
    """ASGI middleware: ``POST /collections/{name}/resolve`` answered here (module doc)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        m = RESOLVE_PATH.fullmatch(scope.get("path") or "") if scope["type"] == "http" and \
            scope.get("method") == "POST" else None
        if m is None:
            return await self.app(scope, receive, send)
        request = Request(scope, receive, send)
        name = m.group("name")
        try:
            response = await answer(request, name, *await resolve_context(request, name))
        except Exception as exc:
            handler = _handler(scope.get("app"), exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)
