"""How the service answers errors: every refusal is an :class:`ApiError` and goes out as JSON
``{"error", "message"}`` with its status (:func:`error_response`; :func:`_status_of` maps
pm_vector's exceptions), a database that cannot be reached (:func:`database_down`) is a 503 with
``Retry-After`` (:func:`database_unavailable`), and anything unexpected a logged 500 in JSON
(the app module's doc lists the statuses). :func:`install_error_handlers` puts the handlers on
the application; the middleware (:mod:`pm_vector.service.middleware`) answers with the same
helpers before the application runs."""

from __future__ import annotations

import logging

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (AlignmentError, BudgetExceededError, FrameMismatchError, InvalidInputError, PMVectorError,
                      PrivacyParameterError)
from ..db import errors as dbe, kahm as _kahm
from ..db.kahm import NoKAHMModelError
from ..db.store.deletes import ItemNotFoundError
from .jobs import JobQueueFullError

#: seconds a client is told to wait when the database is unreachable
RETRY_AFTER_S = 5


class ApiError(Exception):
    """A refusal: ``status`` (4xx, or 5xx for what the operator must fix), ``error`` (a
    machine-readable kind), ``message`` (what to do about it) and extra response ``headers``."""

    def __init__(self, status: int, error: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.error, self.message, self.headers = status, error, message, headers


def error_response(status: int, error: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON answer ``{"error", "message"}`` of a refusal (also an ASGI app: the middleware
    send it themselves)."""
    return JSONResponse({"error": error, "message": message}, status_code=status, headers=headers)


def database_down(exc: BaseException) -> bool:
    """Is ``exc`` (or what caused it) the database being unreachable: a lost or refused
    connection, a server shutting down, no pooled connection in time?"""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, (psycopg.OperationalError, PoolTimeout)):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def database_unavailable() -> ApiError:
    """The 503 of a database that cannot be reached, with ``Retry-After``."""
    return ApiError(503, "database_unavailable", "the database is unreachable right now; retry after "
                    f"{RETRY_AFTER_S} s (the service reconnects by itself).", {"Retry-After": str(RETRY_AFTER_S)})


def api_error_response(exc: ApiError) -> JSONResponse:
    """The JSON answer of ``exc``."""
    return error_response(exc.status, exc.error, exc.message, exc.headers)


def _status_of(exc: PMVectorError) -> tuple[int, str]:
    if isinstance(exc, (dbe.CollectionNotFoundError, dbe.RunNotFoundError, dbe.NoAnchorSetError, ItemNotFoundError)):
        return 404, "not_found"
    if isinstance(exc, dbe.NoActiveRunError):
        return 409, "no_active_run"
    if isinstance(exc, dbe.CollectionBrokenError):  # names the collection and the reason; resync mends it
        return 409, "collection_broken"

    if isinstance(exc, NoKAHMModelError):
        return 409, "no_kahm_model"

    raw_dist = getattr(_kahm, "RawKAHMDistancesNotAllowedError", None)
    if raw_dist is not None and isinstance(exc, raw_dist):  # raw models' distances are a membership oracle
        return 403, "raw_distances_not_allowed"

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


def install_error_handlers(app: FastAPI, log: logging.Logger) -> None:
    """Register the service's exception handlers on ``app``."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return api_error_response(exc)

    @app.exception_handler(PMVectorError)
    async def _pm_error(request: Request, exc: PMVectorError):
        if database_down(exc):
            return api_error_response(database_unavailable())
        status, kind = _status_of(exc)
        return error_response(status, kind, str(exc), {"Retry-After": "30"} if status in (429, 503) else None)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        parts = []
        bad_json = [e for e in exc.errors() if e.get("type") == "json_invalid"]
        if bad_json:
            why = (bad_json[0].get("ctx") or {}).get("error", "")
            return error_response(400, "malformed_json",
                                  f"the request body is not valid JSON ({why}).".replace(" ()", ""))
        for e in exc.errors()[:5]:
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            parts.append(f"{loc or 'body'}: {e.get('msg')}")
        return error_response(422, "invalid_input", ("; ".join(parts) or "invalid request body") +
                              " (send a JSON object with Content-Type: application/json).")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
        return error_response(exc.status_code, kind, str(exc.detail))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        if database_down(exc):
            return api_error_response(database_unavailable())

        if isinstance(exc, psycopg.DataError):  # a value PostgreSQL cannot hold (NUL, out of range)
            return error_response(422, "invalid_input", "a value in the request is out of range for the database "
                                  "(NUL byte or integer beyond 64 bits); fix it and send again.")
        log.exception("internal error")
        return error_response(500, "internal_error",
                              f"internal error ({type(exc).__name__}); the server log has details.")

