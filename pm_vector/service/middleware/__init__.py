"""The service's ASGI middleware: what is refused, or bounded, before an endpoint runs.

Outermost first (:func:`install` adds them in this order):

=================  ============================================================================
authentication     :class:`~.authentication.AuthMiddleware`: the API key and its rate limit,
                   from the headers, before anything reads the body (401, 429)
body_limit         :class:`~.body_limit.BodyLimitMiddleware`: 413 for a body over the limit
body_timeout       :class:`~.body_timeout.BodyTimeoutMiddleware`: 408 for a body that trickles in
large_requests     :class:`~.large_requests.LargeRequestGate`: a bounded number of large bodies
                   handled at once (reads the body under the limit and the timeout, then waits)
catch_all          :class:`~.catch_all.CatchAllMiddleware`: any exception the handlers left,
                   answered as JSON (inside the others, so that none reaches Starlette's, which
                   drops the connection)
hot_route          :class:`~.hot_route.ResolveRoute`: ``POST /collections/{name}/resolve``, the
                   hottest route, answered without FastAPI's router and dependency solving (its
                   checks and body are the route's own)
=================  ============================================================================

They answer with the helpers of :mod:`pm_vector.service.errors`, and those that answer an
error raised while the application runs wrap ``send`` with :func:`.send.tracking_send` (once
the response has started, the error is re-raised instead). The header block's own timeout is
uvicorn's protocol, :mod:`pm_vector.service.header_timeout`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .authentication import AuthMiddleware
from .body_limit import BodyLimitMiddleware
from .body_timeout import BodyTimeoutMiddleware
from .catch_all import CatchAllMiddleware
from .hot_route import ResolveRoute
from .large_requests import LargeRequestGate
from ..auth import RateLimiter

if TYPE_CHECKING:
    from fastapi import FastAPI

    from ..auth import FailedAuthLimiter
    from ..settings import ServiceSettings
    from ..state import ServiceState


def install(app: FastAPI, settings: ServiceSettings, state: ServiceState, failures: FailedAuthLimiter) -> None:
    """Add the middleware to ``app`` in their order (module doc). ``failures``: the failed
    authentications per address (this process's and those the others announce)."""
    # added last = runs first
    app.add_middleware(ResolveRoute)
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(LargeRequestGate, threshold_bytes=settings.large_request_bytes,
                       slots=settings.max_large_requests)
    app.add_middleware(BodyTimeoutMiddleware, timeout_s=settings.body_timeout_s)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, settings=settings, state=state, limiter=RateLimiter(settings.rate_per_minute),
                       failures=failures)
