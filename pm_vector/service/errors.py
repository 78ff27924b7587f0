"""How the service answers errors: every refusal is JSON ``{"error", "message"}`` with its
status (:func:`_status_of` maps pm_vector's exceptions), a database that cannot be reached is a
503 with ``Retry-After``, and anything unexpected a logged 500 in JSON (the app module's doc
lists the statuses)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (AlignmentError, BudgetExceededError, FrameMismatchError, InvalidInputError, PMVectorError,
                      PrivacyParameterError)
from .validation import RETRY_AFTER_S, ApiError, _database_down, _err


def _status_of(exc: PMVectorError) -> tuple[int, str]:
    from ..db import errors as dbe

    from ..db.store.erase import ItemNotFoundError

    if isinstance(exc, (dbe.CollectionNotFoundError, dbe.RunNotFoundError, dbe.NoAnchorSetError, ItemNotFoundError)):
        return 404, "not_found"
    if isinstance(exc, dbe.NoActiveRunError):
        return 409, "no_active_run"
    from ..db.kahm import NoKAHMModelError

    if isinstance(exc, NoKAHMModelError):
        return 409, "no_kahm_model"
    from ..db import kahm as _kahm

    raw_dist = getattr(_kahm, "RawKAHMDistancesNotAllowedError", None)
    if raw_dist is not None and isinstance(exc, raw_dist):  # raw models' distances are a membership oracle
        return 403, "raw_distances_not_allowed"
    from .jobs import JobQueueFullError

    if isinstance(exc, JobQueueFullError):
        return 429, "job_queue_full"
    if isinstance(exc, dbe.RawFeaturesNotAllowedError):
        return 403, "raw_features_not_allowed"
    if isinstance(exc, dbe.CellsUnavailableError):  # the run lacks its cells: an operator's job restores them
        return 503, "cells_unavailable"
    if isinstance(exc, dbe.ShardUnavailableError):  # names the shard; nothing written: retry later
        return 503, "shard_unavailable"
    if isinstance(exc, dbe.DatabaseConfigError):
        return 503, "database_unavailable"
    if isinstance(exc, FrameMismatchError):  # the run's own frame cannot be rebuilt: not the request's fault
        return 400, "bad_request"
    if isinstance(exc, (InvalidInputError, AlignmentError, PrivacyParameterError)):
        return 422, "invalid_input"
    if isinstance(exc, BudgetExceededError):
        return 422, "budget_exceeded"
    return 400, "bad_request"


def _unavailable() -> JSONResponse:
    return _err(503, "database_unavailable", "the database is unreachable right now; retry after "
                f"{RETRY_AFTER_S} s (the service reconnects by itself).", {"Retry-After": str(RETRY_AFTER_S)})


def install_error_handlers(app: FastAPI, log: logging.Logger) -> None:
    """Register the service's exception handlers on ``app``."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return _err(exc.status, exc.error, exc.message, exc.headers)

    @app.exception_handler(PMVectorError)
    async def _pm_error(request: Request, exc: PMVectorError):
        if _database_down(exc):
            return _unavailable()
        status, kind = _status_of(exc)
        return _err(status, kind, str(exc), {"Retry-After": "30"} if status in (429, 503) else None)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        parts = []
        bad_json = [e for e in exc.errors() if e.get("type") == "json_invalid"]
        if bad_json:
            why = (bad_json[0].get("ctx") or {}).get("error", "")
            return _err(400, "malformed_json", f"the request body is not valid JSON ({why}).".replace(" ()", ""))
        for e in exc.errors()[:5]:
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            parts.append(f"{loc or 'body'}: {e.get('msg')}")
        return _err(422, "invalid_input", ("; ".join(parts) or "invalid request body") +
                    " (send a JSON object with Content-Type: application/json).")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
        return _err(exc.status_code, kind, str(exc.detail))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        if _database_down(exc):
            return _unavailable()
        import psycopg

        if isinstance(exc, psycopg.DataError):  # a value PostgreSQL cannot hold (NUL, out of range)
            return _err(422, "invalid_input", "a value in the request is out of range for the database (NUL byte "
                                              "or integer beyond 64 bits); fix it and send again.")
        log.exception("internal error")
        return _err(500, "internal_error", f"internal error ({type(exc).__name__}); the server log has details.")

