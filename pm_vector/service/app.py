"""The FastAPI application of ``pm-vector serve``.

Endpoints (all but ``/health``, ``/openapi.json`` and ``/docs`` need an API key, sent as
``Authorization: Bearer pmv_...`` or ``X-API-Key: pmv_...``):

=======  =====================================  =====================================================
GET      /health                                status, version, the server's limits, database reachable?
GET      /collections                           the collections (name, dims, labels, sizes, active run)
GET      /collections/{name}                    one collection, with its active run
GET      /collections/{name}/anchor             the public anchor: ids, features, labels, dummy pool,
                                                frame info (AnchorFrame params, seed, anchor embedding)
POST     /collections/{name}/items              items by id; raw features only if the collection allows
POST     /collections/{name}/jobs               start an SMLQ embedding job (background thread) -> 202
GET      /jobs, /jobs/{job_id}                  jobs of this process: status, stage progress, result
POST     /collections/{name}/resolve            a PrivateMail request in, per-row k-NN results out
                                                (with the current KAHM model's class scores per item)
GET      /collections/{name}/kahm/models        the collection's stored KAHM models (no model bytes)
POST     /collections/{name}/kahm/distances     this collection as a party of federated classification:
                                                per class, the distance value of every query row
=======  =====================================  =====================================================

Refusals are JSON ``{"error", "message"}`` with a 4xx status and write nothing: 401 (no or
unknown key), 413 (body, rows or dimensions over the limits), 400 (malformed JSON, NaN/Infinity),
422 (wrong shapes or values), 404 (unknown collection, job, or no active run), 403 (raw features
not allowed), 409 (no active run yet, or no KAHM model for the kahm endpoints). While the
database is unreachable every endpoint that needs it answers 503 ``database_unavailable`` with
``Retry-After`` (and ``/health`` 503 ``degraded``); the pool reconnects by itself.
"""

from __future__ import annotations

import json
import threading
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__ as _version
from ..errors import AlignmentError, BudgetExceededError, InvalidInputError, PMVectorError, PrivacyParameterError
from ..client.query import FORMAT as QUERY_FORMAT
from . import schemas
from .settings import ServiceSettings


class ApiError(Exception):
    def __init__(self, status: int, error: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.error, self.message, self.headers = status, error, message, headers


def _status_of(exc: PMVectorError) -> tuple[int, str]:
    from ..db import errors as dbe

    if isinstance(exc, (dbe.CollectionNotFoundError, dbe.RunNotFoundError, dbe.NoAnchorSetError)):
        return 404, "not_found"
    if isinstance(exc, dbe.NoActiveRunError):
        return 409, "no_active_run"
    from ..db.kahm import NoKAHMModelError

    if isinstance(exc, NoKAHMModelError):
        return 409, "no_kahm_model"
    if isinstance(exc, dbe.RawFeaturesNotAllowedError):
        return 403, "raw_features_not_allowed"
    if isinstance(exc, dbe.DatabaseConfigError):
        return 503, "database_unavailable"
    if isinstance(exc, (InvalidInputError, AlignmentError, PrivacyParameterError)):
        return 422, "invalid_input"
    if isinstance(exc, BudgetExceededError):
        return 422, "budget_exceeded"
    return 400, "bad_request"


#: seconds a client is told to wait when the database is unreachable
RETRY_AFTER_S = 5


def _database_down(exc: BaseException) -> bool:
    """Is ``exc`` (or what caused it) the database being unreachable: a lost or refused
    connection, a server shutting down, no pooled connection in time?"""
    import psycopg
    from psycopg_pool import PoolTimeout

    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, (psycopg.OperationalError, PoolTimeout)):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _unavailable() -> JSONResponse:
    return _err(503, "database_unavailable", "the database is unreachable right now; retry after "
                f"{RETRY_AFTER_S} s (the service reconnects by itself).", {"Retry-After": str(RETRY_AFTER_S)})


def _err(status: int, error: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "message": message}, status_code=status, headers=headers)


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
                    return await _err(400, "bad_request", "invalid Content-Length header.")(scope, receive, send)
                if n > self.max_bytes:
                    return await _err(413, "payload_too_large", msg)(scope, receive, send)
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

        started = False

        async def tracking_send(m):
            nonlocal started
            if m["type"] == "http.response.start":
                started = True
            await send(m)

        try:
            await self.app(scope, limited, tracking_send)
        except ApiError as exc:
            if not too_big or started:
                raise
            await _err(exc.status, exc.error, exc.message)(scope, receive, send)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed (JSON has no NaN/Infinity; the request must be finite numbers)")


def parse_json(body: bytes) -> Any:
    if not body:
        raise ApiError(400, "malformed_json", "the request body is empty; send a JSON object.")
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise ApiError(400, "malformed_json", "the request body is not UTF-8 JSON.") from None
    except json.JSONDecodeError as e:
        raise ApiError(400, "malformed_json", f"the request body is not valid JSON: {e.msg} at line {e.lineno} "
                                              f"column {e.colno}.") from None
    except ValueError as e:
        raise ApiError(400, "malformed_json", f"the request body is not valid JSON: {e}.") from None


def check_matrix(rows: Any, what: str, settings: ServiceSettings) -> None:
    """A JSON matrix: a non-empty list of equally long, non-empty rows of numbers, within the
    server's row and dimension limits (413 above them, 422 otherwise)."""
    if not isinstance(rows, list) or not rows or not all(isinstance(row, list) for row in rows):
        raise ApiError(422, "invalid_input", f"{what} must be a non-empty list of rows (lists of numbers).")
    if len(rows) > settings.max_rows:
        raise ApiError(413, "too_many_rows", f"{what} has {len(rows):,} rows; this server accepts at most "
                                             f"{settings.max_rows:,}.")
    width = len(rows[0])
    if width > settings.max_dim:
        raise ApiError(413, "too_many_dimensions", f"{what} has {width} columns; this server accepts at most "
                                                   f"{settings.max_dim}.")
    if width == 0:
        raise ApiError(422, "invalid_input", f"{what} row 0 is empty.")
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ApiError(422, "invalid_input", f"{what} row {i} has {len(row)} values, row 0 has {width}; every "
                                                 "row must have the same length.")
        for v in row:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ApiError(422, "invalid_input", f"{what} row {i} holds {v!r}; only numbers are allowed.")
            if isinstance(v, int) and abs(v) > 1e300:  # would not convert to float64
                raise ApiError(422, "invalid_input", f"{what} row {i} holds an integer too large for a float.")


def check_resolve_body(d: Any, settings: ServiceSettings, name: str):
    """Validate a resolve body; returns ``(request, k, include_features, include_codes)`` or raises ApiError."""
    from ..client.request import PrivateMailRequest

    if not isinstance(d, dict):
        raise ApiError(422, "invalid_input", "the body must be a JSON object {\"request\": {...}, \"k\": 8}.")
    unknown = sorted(set(d) - {"request", "k", "include_features", "include_codes"})
    if unknown:
        raise ApiError(422, "invalid_input", f"unknown field(s) {unknown}; the body has 'request', 'k', "
                                             "'include_features', 'include_codes'.")
    k = d.get("k", 8)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= settings.max_k:
        raise ApiError(422, "invalid_input", f"k must be an integer in 1..{settings.max_k}, got {k!r}.")
    inc = d.get("include_features", False)
    if not isinstance(inc, bool):
        raise ApiError(422, "invalid_input", "include_features must be true or false.")
    codes = d.get("include_codes", False)
    if not isinstance(codes, bool):
        raise ApiError(422, "invalid_input", "include_codes must be true or false.")
    r = d.get("request")
    if not isinstance(r, dict):
        raise ApiError(422, "invalid_input", "'request' must be a request object (QueryRequest.to_dict(), or "
                                             "PrivateMailRequest.to_dict() for the paper's protocol).")
    if r.get("format") == QUERY_FORMAT:
        return check_query_request(r, settings, name), k, inc, codes
    if codes:
        raise ApiError(422, "invalid_input", "include_codes applies to class-rows requests (format "
                                             f"{QUERY_FORMAT!r}).")
    emb = r.get("embedding")
    check_matrix(emb, "request.embedding", settings)
    if r.get("collection") not in (None, name):
        raise ApiError(422, "invalid_input", f"the request was built for collection {r.get('collection')!r}, "
                                             f"not {name!r}.")
    nq = r.get("n_query_rows")
    if isinstance(nq, bool) or not isinstance(nq, int) or not 1 <= nq <= len(emb):
        raise ApiError(422, "invalid_input", f"request.n_query_rows must be an integer in 1..{len(emb)}, got {nq!r}.")
    try:
        req = PrivateMailRequest.from_dict(r)
    except (InvalidInputError, TypeError, ValueError) as exc:
        raise ApiError(422, "invalid_input", f"invalid PrivateMail request: {exc}") from None
    return req, k, inc, False


def check_query_request(r: dict, settings: ServiceSettings, name: str):
    """Validate a pm_vector request (one noised row per class); returns a QueryRequest or raises ApiError."""
    from ..client.query import QueryRequest

    check_matrix(r.get("rows"), "request.rows", settings)
    if r.get("collection") not in (None, name):
        raise ApiError(422, "invalid_input", f"the request was built for collection {r.get('collection')!r}, "
                                             f"not {name!r}.")
    kp = r.get("shortlist")
    if isinstance(kp, bool) or not isinstance(kp, int) or not 1 <= kp <= settings.max_shortlist:
        raise ApiError(422, "invalid_input", f"request.shortlist (k') must be an integer in 1..{settings.max_shortlist}, "
                                             f"got {kp!r}.")
    try:
        return QueryRequest.from_dict(r)
    except (InvalidInputError, TypeError, ValueError) as exc:
        raise ApiError(422, "invalid_input", f"invalid pm_vector request: {exc}") from None


def check_distances_body(d: Any, settings: ServiceSettings) -> tuple[list[list[float]], int | None]:
    """Validate a ``/kahm/distances`` body; returns ``(features rows, model_id)`` or raises ApiError.
    The feature dimension is checked against the collection by :func:`pm_vector.db.kahm.party_distances`."""
    if not isinstance(d, dict):
        raise ApiError(422, "invalid_input", "the body must be a JSON object {\"features\": [[...], ...]}.")
    unknown = sorted(set(d) - {"features", "model_id"})
    if unknown:
        raise ApiError(422, "invalid_input", f"unknown field(s) {unknown}; the body has 'features' and 'model_id'.")
    mid = d.get("model_id")
    if mid is not None and (isinstance(mid, bool) or not isinstance(mid, int) or mid < 1):
        raise ApiError(422, "invalid_input", f"model_id must be a positive integer or null, got {mid!r}.")
    X = d.get("features")
    check_matrix(X, "features", settings)
    return X, mid


def create_app(settings: ServiceSettings | None = None, *, pool=None) -> FastAPI:
    """The application. ``pool``: a :class:`~pm_vector.service.db.ServicePool` (made at start-up if None)."""
    from .jobs import JobManager, check_params

    settings = settings or ServiceSettings.from_env()
    state: dict[str, Any] = {"pool": pool}
    jobs = JobManager(settings.job_workers)
    resolve_slots = threading.BoundedSemaphore(max(1, settings.pool_max))

    @asynccontextmanager
    async def lifespan(app):
        own = False
        if state["pool"] is None:
            from .db import ServicePool

            state["pool"] = await run_in_threadpool(ServicePool, min_size=settings.pool_min,
                                                    max_size=settings.pool_max)
            own = True
        try:
            yield
        finally:
            jobs.shutdown()
            if own:
                state["pool"].close()

    app = FastAPI(title="pm_vector", version=_version, lifespan=lifespan,
                  description="Differentially private nearest-neighbour search (PrivateMail) over PostgreSQL/pgvector. "
                              "Authenticate with `Authorization: Bearer <API key>` (`pm-vector keys create`).",
                  responses={401: {"model": schemas.ErrorBody}, 413: {"model": schemas.ErrorBody},
                             422: {"model": schemas.ErrorBody}})
    app.state.settings = settings
    app.state.jobs = jobs
    app.state.service_state = state
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return _err(exc.status, exc.error, exc.message, exc.headers)

    @app.exception_handler(PMVectorError)
    async def _pm_error(request: Request, exc: PMVectorError):
        if _database_down(exc):
            return _unavailable()
        status, kind = _status_of(exc)
        return _err(status, kind, str(exc))

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
        return _err(500, "internal_error", f"internal error ({type(exc).__name__}); the server log has details.")

    def require_key(request: Request) -> dict[str, Any] | None:
        if not settings.auth:
            return None
        h = request.headers.get("authorization") or ""
        key = h[7:].strip() if h.lower().startswith("bearer ") else (request.headers.get("x-api-key") or "").strip()
        if not key:
            raise ApiError(401, "unauthorized", "no API key; send `Authorization: Bearer <key>` (create one with "
                                                "`pm-vector keys create --name NAME`).", {"WWW-Authenticate": "Bearer"})
        from .auth import verify_key

        with state["pool"].connection() as conn:
            rec = verify_key(conn, key)
        if rec is None:
            raise ApiError(401, "unauthorized", "unknown or revoked API key.", {"WWW-Authenticate": "Bearer"})
        return rec

    auth = [Depends(require_key)]

    @app.get("/health", response_model=schemas.Health, tags=["service"],
             responses={503: {"model": schemas.Health}})
    def health():
        """Liveness, version, limits and whether the database answers (no key needed): 200 with
        ``database: "ok"``, or 503 with ``status: "degraded"``, ``database: "unreachable"`` and
        Retry-After while it does not."""
        why = state["pool"].ping() if state["pool"] is not None else "no connection pool"
        body = {"status": "ok" if why is None else "degraded", "version": _version,
                "database": "ok" if why is None else "unreachable", "limits": settings.public()}
        if why is None:
            return body
        return JSONResponse({**body, "database_error": why}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_S)})

    def _public_collection(c: dict[str, Any]) -> dict[str, Any]:
        keep = ("name", "feature_dim", "metric", "labels", "allow_raw_features", "n_items", "active_run_id",
                "active_embedding_dim", "active_since", "n_anchors", "n_dummies", "created_at")
        out = {k: c.get(k) for k in keep}
        if out["allow_raw_features"] is None:
            out["allow_raw_features"] = bool((c.get("settings") or {}).get("allow_raw_features", False))
        out["description"] = (c.get("settings") or {}).get("description")
        return out

    @app.get("/collections", dependencies=auth, tags=["collections"])
    def collections():
        """All collections."""
        from .. import db

        return {"collections": [_public_collection(c) for c in db.list_collections()]}

    @app.get("/collections/{name}", dependencies=auth, tags=["collections"])
    def describe(name: str):
        """One collection and its active embedding run."""
        from .. import db

        c = _public_collection(db.collection_info(name))
        run = None
        if c["active_run_id"] is not None:
            r = db.run_info(c["active_run_id"])
            run = {k: r.get(k) for k in ("run_id", "status", "params", "seed", "embedding_dim", "n_items",
                                        "n_anchors", "anchor_set_id", "finished_at", "duration")}
        return {**c, "active_run": run}

    @app.get("/collections/{name}/anchor", dependencies=auth, response_model=schemas.AnchorDocument,
             tags=["collections"])
    def anchor(name: str):
        """The public anchor set (ids, features, labels), the dummy pool and the active run's frame info.

        Everything here is public by construction: the client rebuilds the AnchorFrame from it."""
        from .documents import anchor_document

        return JSONResponse(anchor_document(name))

    @app.post("/collections/{name}/items", dependencies=auth, tags=["collections"])
    def items(name: str, body: schemas.ItemsBody):
        """Items by id (external ids, labels, payloads); raw ``features`` only if the collection allows it (403).

        Fetching by id tells the server which items you look at: to re-rank a private query's answer use
        ``include_features`` on resolve instead, which returns the features of every row's neighbours."""
        from .. import db
        from .documents import _plain

        if len(body.ids) > settings.max_ids:
            raise ApiError(413, "too_many_ids", f"{len(body.ids):,} ids; at most {settings.max_ids:,} per call.")
        return _plain(db.fetch_items(name, body.ids, include_features=body.include_features))

    @app.post("/collections/{name}/jobs", dependencies=auth, status_code=202, response_model=schemas.Job,
              tags=["jobs"])
    def start_job(name: str, body: schemas.JobBody):
        """Start an SMLQ embedding job (AnchorFrame fit + out-of-sample extension) in the background."""
        return jobs.start(name, check_params(body.params), body.seed)

    @app.get("/jobs", dependencies=auth, tags=["jobs"])
    def list_jobs():
        return {"jobs": jobs.list()}

    @app.get("/jobs/{job_id}", dependencies=auth, response_model=schemas.Job, tags=["jobs"])
    def get_job(job_id: str):
        """A job's status, stage progress (load, embed, write, index, switch) and result."""
        try:
            return jobs.get(job_id)
        except KeyError:
            raise ApiError(404, "not_found", f"no job {job_id!r} in this service process.") from None

    def _resolve_sync(name: str, body: bytes) -> dict[str, Any]:
        req, k, inc, codes = check_resolve_body(parse_json(body), settings, name)
        from .documents import resolve_document

        with resolve_slots, state["pool"].connection() as conn:
            res = resolve_document(name, req, k=k, include_features=inc, conn=conn,
                                   max_query_rows=min(settings.max_rows, 1000), include_codes=codes)
        if codes:  # each row's (k', m) codes as base64 of little-endian float16: 2 bytes per component
            import base64

            import numpy as np

            for row in res["rows"]:
                C = np.array([[np.nan if v is None else v for v in c] for c in row["codes"]], dtype="<f2")
                row["codes"] = base64.b64encode(C.tobytes()).decode("ascii")
        return res

    @app.post("/collections/{name}/resolve", dependencies=auth, response_model=schemas.ResolveResponse,
              tags=["resolve"], openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"$ref": "#/components/schemas/ResolveBody"}}}}})
    async def resolve_endpoint(name: str, request: Request):
        """Resolve a PrivateMail request: align its anchor rows on the active run's frame, k-NN every query row.

        The body is ``{"request": PrivateMailRequest.to_dict(), "k": 8, "include_features": false}``. The answer
        has one entry per query row; only the client knows which row is real."""
        body = await request.body()
        return JSONResponse(await run_in_threadpool(_resolve_sync, name, body))

    @app.get("/collections/{name}/kahm/models", dependencies=auth, response_model=schemas.KAHMModels,
             tags=["kahm"])
    def kahm_models(name: str):
        """The collection's stored KAHM models, newest first (``is_current``: the one that serves)."""
        from ..db.kahm import list_kahm_models
        from .documents import _plain

        return JSONResponse(_plain({"collection": name, "models": list_kahm_models(name)}))

    def _distances_sync(name: str, body: bytes) -> dict[str, Any]:
        X, mid = check_distances_body(parse_json(body), settings)
        from ..db.kahm import party_distances
        from .documents import _plain

        with resolve_slots:
            return _plain(party_distances(name, X, model_id=mid))

    @app.post("/collections/{name}/kahm/distances", dependencies=auth, response_model=schemas.PartyDistances,
              tags=["kahm"], openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"$ref": "#/components/schemas/DistancesBody"}}}}})
    async def kahm_distances(name: str, request: Request):
        """This collection as a party of federated classification (the KAHM paper's eq 104).

        The body is ``{"features": [[...], ...], "model_id": null}``; the answer holds, for every class
        the party's model knows, the distance value (Definition 6) of each query row -- no items, no
        model. JSON object keys are strings: ``distances`` is ``{"<class>": [one per row]}``, and a
        distance that is infinite (the class cannot model the row) is ``null``.
        :meth:`pm_vector.client.http.Client.kahm_distances` turns it back into
        :func:`pm_vector.db.kahm.party_distances`' shape (int keys, numpy arrays, inf)."""
        body = await request.body()
        return JSONResponse(await run_in_threadpool(_distances_sync, name, body))

    # make ResolveBody part of the schema although the endpoint parses the body itself
    _orig_openapi = app.openapi

    def openapi():
        if app.openapi_schema:
            return app.openapi_schema
        s = _orig_openapi()
        comps = s.setdefault("components", {}).setdefault("schemas", {})
        for m in (schemas.ResolveBody, schemas.PrivateMailRequestBody, schemas.DistancesBody):
            js = m.model_json_schema(ref_template="#/components/schemas/{model}")
            for k, v in js.pop("$defs", {}).items():
                comps.setdefault(k, v)
            comps.setdefault(m.__name__, js)
        app.openapi_schema = s
        return s

    app.openapi = openapi  # type: ignore[method-assign]
    return app
