"""Authentication and rate limiting, from the headers, before anything reads the body."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fastapi.concurrency import run_in_threadpool

from ..errors import ApiError, api_error_response, database_down, database_unavailable, error_response
from ..auth import hash_key, verify_key, well_formed

if TYPE_CHECKING:
    from ..state import ServiceState


#: paths anyone may read (no key): liveness and the API's description
PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


class AuthMiddleware:
    """Authenticate (and rate-limit) every request but :data:`PUBLIC_PATHS` from its headers before
    anything reads the body: an unauthenticated 14 MB body costs no parsing. The key's record goes
    to ``request.state.api_key`` (None when auth is off).

    Failed authentications are limited per client address (``failures``, a
    :class:`~pm_vector.service.auth.FailedAuthLimiter`): over the limit, a key the key cache does
    not hold gets 429 with Retry-After before any lookup; a key the database refused a moment ago
    is refused from the key cache's negative entries, without a lookup. ``state.key_lookups``
    counts the lookups made."""

    def __init__(self, app, settings, state: ServiceState, limiter, failures=None):
        self.app, self.settings, self.state, self.limiter = app, settings, state, limiter
        self.failures = failures

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path") or ""
        if "\x00" in path:  # psycopg refuses NUL in text: no name can hold one
            nul = error_response(404, "not_found", "no such resource (the path holds a NUL byte).")
            return await nul(scope, receive, send)
        st = scope.setdefault("state", {})
        st["api_key"] = None
        if not self.settings.auth or path in PUBLIC_PATHS:
            return await self.app(scope, receive, send)
        try:
            rec = await self._authenticate(scope)
        except ApiError as exc:
            return await api_error_response(exc)(scope, receive, send)
        st["api_key"] = rec
        return await self.app(scope, receive, send)

    async def _authenticate(self, scope) -> dict:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        h = headers.get("authorization") or ""
        key = h[7:].strip() if h.lower().startswith("bearer ") else (headers.get("x-api-key") or "").strip()
        address = (scope.get("client") or ("unknown",))[0]
        unauthorized = ApiError(401, "unauthorized", "unknown or revoked API key.", {"WWW-Authenticate": "Bearer"})
        if not key:
            unauthorized = ApiError(401, "unauthorized", "no API key; send `Authorization: Bearer <key>` (create one "
                                    "with `pm-vector keys create --name NAME`).", {"WWW-Authenticate": "Bearer"})
        pool = self.state.pool
        cache = self.state.keycache
        digest = hash_key(key) if cache is not None and key else None
        rec = cache.lookup(digest) if digest is not None else None
        if rec is None:
            self._check_failures(address)  # 429 before any lookup once the address is over its limit
            if not well_formed(key) or (digest is not None and cache.failed(digest)):
                await self._fail(address)
                raise unauthorized
        generation = cache.generation() if cache is not None and rec is None else 0

        def verify():
            with pool.connection() as conn:
                return verify_key(conn, key)

        try:
            if rec is None:
                self.state.key_lookups += 1  # on the event loop: an exact count
                rec = await run_in_threadpool(verify)
                if cache is not None:
                    if rec is not None:
                        cache.store(digest, rec, generation)
                    else:
                        cache.store_failed(digest, generation)
        except Exception as exc:  # noqa: BLE001 - a database down is a 503, anything else a 500 in JSON
            if database_down(exc):
                raise database_unavailable() from None
            raise ApiError(500, "internal_error", f"internal error ({type(exc).__name__}) while checking the key; "
                                                  "the server log has details.") from None
        if rec is None:
            await self._fail(address)
            raise unauthorized
        if self.limiter is not None:
            wait = self.limiter.take(rec["id"], rec.get("rate_per_minute"))
            if wait > 0:
                raise ApiError(429, "rate_limited", f"this key's rate limit is reached; retry after {math.ceil(wait)} "
                               "s (ask the operator for a higher rate_per_minute).",
                               {"Retry-After": str(max(1, math.ceil(wait)))})
        return rec

    def _check_failures(self, address: str) -> None:
        wait = self.failures.wait(address) if self.failures is not None else 0.0
        if wait > 0:
            raise ApiError(429, "too_many_failed_authentications", "too many failed authentications from this "
                           f"address; retry after {math.ceil(wait)} s with a valid API key.",
                           {"Retry-After": str(max(1, math.ceil(wait)))})

    async def _fail(self, address: str) -> None:
        """Count a failed authentication here, and announce it to the other service processes
        (the key cache's channel: they count it too)."""
        if self.failures is None or self.failures.per_minute <= 0:
            return
        self.failures.fail(address)
        cache, pool = self.state.keycache, self.state.pool
        if cache is None or pool is None:
            return

        def announce():
            with pool.connection() as conn:
                cache.announce_failure(conn, address)

        try:
            await run_in_threadpool(announce)
        except Exception:  # noqa: BLE001 - the local count stands; the others miss one failure
            pass
