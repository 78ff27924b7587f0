"""The FastAPI application of ``pm-vector serve``.

Endpoints (all but ``/health``, ``/openapi.json`` and ``/docs`` need an API key, sent as
``Authorization: Bearer pmv_...`` or ``X-API-Key: pmv_...``; the key is checked, and its rate
limit applied, from the headers before any body is read). Role ``query`` (the default of
``pm-vector keys create``) may use the collection reads, the anchor, resolve and the KAHM
endpoints; items, jobs and keys need ``admin`` (403). A key limited to some collections sees
only those (404 for any other, and ``/collections`` lists only them):

=======  =====================================  =====================================================
GET      /health                                status, version, the server's limits, database reachable?
GET      /collections                           the collections (name, dims, labels, sizes, active run)
GET      /collections/{name}                    one collection, with its active run
GET      /collections/{name}/anchor             the public anchor: ids, features, labels, dummy pool,
                                                frame info (AnchorFrame params, seed, anchor embedding)
POST     /collections/{name}/items              items by id; raw features only if the collection allows
POST     /collections/{name}/jobs               start an SMLQ embedding job (background thread) -> 202
GET      /jobs, /jobs/{job_id}                  jobs (kept in the database): status, stage progress, result
GET      /keys                                  API keys (admin without a collection scope; no secrets)
POST     /collections/{name}/resolve            a request in, per-row candidates out: by default the
                                                compact answer (ids, product-code prefixes, payloads);
                                                full rows on request (raw features where allowed; the
                                                current KAHM model's class scores per item if private,
                                                or raw and the collection opted in)
GET      /collections/{name}/kahm/models        the collection's stored KAHM models (no model bytes)
POST     /collections/{name}/kahm/distances     this collection as a party of federated classification:
                                                per class, the distance value of every query row
=======  =====================================  =====================================================

Bodies are ``application/json`` or ``application/msgpack``; the collection, anchor, items, resolve
and KAHM answers are written as ``Accept`` asks, JSON by default (:mod:`pm_vector.service.media`).
Refusals are JSON ``{"error", "message"}`` with a 4xx status and write nothing: 401 (no or
unknown key), 413 (body, rows, dimensions or rows x k over the limits), 400 (malformed JSON or
msgpack, NaN/Infinity, too deep), 422 (wrong shapes or values, unknown fields), 415 (a body whose
Content-Type is neither application/json nor application/msgpack), 406 (an Accept that admits
neither), 404 (unknown collection,
job, or out of the key's scope), 403 (the key's role; raw features or raw KAHM distances not
allowed), 429 (rate limit, too many failed authentications from one address, or job queue full, with
Retry-After), 409 (no active run yet, or no
KAHM model for the kahm endpoints). While the database is unreachable every endpoint that needs
it answers 503 ``database_unavailable`` with ``Retry-After`` (and ``/health`` 503 ``degraded``);
the pool reconnects by itself. A 5xx is a bug: every bad input has its 4xx.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from .. import __version__ as _version
from . import schemas
from .body_timeout import BodyTimeoutMiddleware
from .errors import install_error_handlers
from .memory import LargeRequestGate, configure_malloc
from .middleware import AuthMiddleware, BodyLimitMiddleware, CatchAllMiddleware
from .settings import ServiceSettings
from .media import body_schema, body_type, negotiate, read_body, require_body_type, respond
from .validation import RETRY_AFTER_S, ApiError, check_distances_body, check_resolve_body


def _read_router(settings: ServiceSettings, pool):
    """The replicas resolves are read on: ``settings.read_urls``, else a running local cluster's."""
    from ..db.postgres.replicas import ReadRouter

    urls = [u.strip() for u in settings.read_urls.split(",") if u.strip()]
    if not urls:
        from ..db.postgres import cluster, server

        if server.external_url() is None and cluster.topology() is not None:
            urls = cluster.replica_urls()
    primary = getattr(pool, "url", None)
    if not urls or primary is None:
        return None
    return ReadRouter(primary, urls, max_lag_bytes=settings.max_replica_lag_bytes)


def create_app(settings: ServiceSettings | None = None, *, pool=None) -> FastAPI:
    """The application. ``pool``: a :class:`~pm_vector.service.db.ServicePool` (made at start-up if None)."""
    from .auth import FailedAuthLimiter, RateLimiter, in_scope
    from .jobs import JobManager, check_params, check_seed

    settings = settings or ServiceSettings.from_env()
    configure_malloc()  # large requests' arrays go back to the system when freed (service/memory.py)
    state: dict[str, Any] = {"pool": pool, "jobs": None, "query_role": None, "router": None, "read_pools": {}}
    resolve_slots = threading.BoundedSemaphore(max(1, settings.pool_max))
    read_pools_lock = threading.Lock()
    log = logging.getLogger("pm_vector.service")

    def prune_once() -> int:
        from ..db.store.retention import prune_request_log

        with state["pool"].connection() as conn:
            return prune_request_log(conn, older_than=dt.timedelta(days=settings.request_log_retention_days))

    async def pruner():
        # a service that answers requests must not grow its log without bound
        while True:
            try:
                n = await run_in_threadpool(prune_once)
                if n:
                    log.info("pruned %d request-log row(s)", n)
            except Exception as exc:  # noqa: BLE001 - a database outage must not stop the loop
                log.warning("request-log prune failed (%s); retrying in %d s", type(exc).__name__,
                            settings.prune_interval_s)
            await asyncio.sleep(settings.prune_interval_s)

    @asynccontextmanager
    async def lifespan(app):
        own = False
        if state["pool"] is None:
            from .db import ServicePool

            state["pool"] = await run_in_threadpool(ServicePool, min_size=settings.pool_min,
                                                    max_size=settings.pool_max)
            own = True

        def make_jobs():
            import psycopg

            url = getattr(state["pool"], "url", None)
            jm = JobManager(state["pool"].connection, settings.job_workers, settings.max_queued_jobs,
                            lock_connection=(lambda: psycopg.connect(url, autocommit=True)) if url else None)
            n = jm.recover()
            if n:
                log.warning("%d job(s) of a stopped service marked interrupted", n)
            try:  # and the runs such jobs left 'running' (no session holds their lock) become failed
                from ..db.store._common import cleanup_stale_runs

                cleanup_stale_runs()
            except Exception as exc:  # noqa: BLE001 - best effort; `pm-vector db cleanup` does it too
                log.warning("stale-run cleanup at start-up failed (%s)", type(exc).__name__)
            return jm

        state["jobs"] = app.state.jobs = await run_in_threadpool(make_jobs)
        try:  # the role a query key's resolve runs as: read + request-log insert only
            ok = await run_in_threadpool(state["pool"].usable_role, settings.query_db_role)
        except Exception:  # noqa: BLE001 - a pool without it (tests' fakes) or a database down: no switch
            ok = False
        state["query_role"] = settings.query_db_role if ok else None
        if not ok and settings.query_db_role:
            log.warning("PostgreSQL role %r not usable: query keys resolve as the service user",
                        settings.query_db_role)
        state["router"] = _read_router(settings, state["pool"])
        if settings.auth and getattr(state["pool"], "url", None):
            from .keycache import KeyCache

            state["keycache"] = await run_in_threadpool(KeyCache(state["pool"].url,
                                                                 failed_ttl=settings.failed_key_ttl_s).start)
        task = asyncio.create_task(pruner()) if settings.request_log_retention_days > 0 else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
            if state.get("keycache") is not None:
                await run_in_threadpool(state.pop("keycache").close)
            state["jobs"].shutdown()
            for p in state["read_pools"].values():
                p.close()
            if own:
                state["pool"].close()

    app = FastAPI(title="pm_vector", version=_version, lifespan=lifespan,
                  description="Differentially private nearest-neighbour search (PrivateMail) over PostgreSQL/pgvector. "
                              "Authenticate with `Authorization: Bearer <API key>` (`pm-vector keys create`).",
                  responses={401: {"model": schemas.ErrorBody}, 413: {"model": schemas.ErrorBody},
                             422: {"model": schemas.ErrorBody}, 429: {"model": schemas.ErrorBody}})
    app.state.settings = settings
    app.state.service_state = state
    app.state.prune_once = prune_once
    # added last = runs first: the key is checked before the body limit or anything reads the body;
    # the catch-all is innermost, so that no error reaches Starlette's (which drops the connection)
    # (order of the others: body limit, large-request gate, body timeout -- the timeout counts once
    # a request holds its slot)
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(BodyTimeoutMiddleware, timeout_s=settings.body_timeout_s)
    app.add_middleware(LargeRequestGate, threshold_bytes=settings.large_request_bytes,
                       slots=settings.max_large_requests)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, settings=settings, state=state, limiter=RateLimiter(settings.rate_per_minute),
                       failures=FailedAuthLimiter(settings.auth_failures_per_minute))

    install_error_handlers(app, log)

    def key_of(request: Request) -> dict[str, Any] | None:
        return getattr(request.state, "api_key", None)

    # async: plain checks run on the event loop (a def dependency costs a hop to a worker thread)
    async def require_admin(request: Request) -> None:
        rec = key_of(request)
        if rec is not None and rec.get("role") != "admin":
            raise ApiError(403, "forbidden", f"this key's role is {rec.get('role')!r}: it may read collections and "
                                             "anchors and resolve requests; this needs an admin key "
                                             "(`pm-vector keys create --role admin`).")

    async def require_scope(name: str, request: Request) -> None:
        from ..db.store._names import _NAME

        if not _NAME.fullmatch(name) or not in_scope(key_of(request), name):  # out of scope looks absent
            raise ApiError(404, "not_found", f"no collection {name!r} (for this key); `GET /collections` lists "
                                             "the ones it may use.")

    auth = [Depends(require_scope)]
    admin = [Depends(require_admin)]
    admin_scoped = [Depends(require_admin), Depends(require_scope)]
    json_body = [Depends(require_body_type)]  # 415 for a body of another type, before it is read
    neg = [Depends(negotiate)]  # the answer's media type (406 when Accept admits none), before any work

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
                "active_embedding_dim", "active_since", "n_anchors", "n_dummies", "created_at", "uuid")
        out = {k: c.get(k) for k in keep}
        if out["allow_raw_features"] is None:
            out["allow_raw_features"] = bool((c.get("settings") or {}).get("allow_raw_features", False))
        out["description"] = (c.get("settings") or {}).get("description")
        return out

    @app.get("/collections", dependencies=neg, tags=["collections"])
    def collections(request: Request):
        """The collections this key may use."""
        from .. import db

        rec = key_of(request)
        return respond(request, {"collections": [_public_collection(c) for c in db.list_collections()
                                                 if in_scope(rec, c["name"])]})

    @app.get("/collections/{name}", dependencies=auth + neg, tags=["collections"])
    def describe(name: str, request: Request):
        """One collection and its active embedding run."""
        from .. import db

        c = _public_collection(db.collection_info(name))
        run = None
        if c["active_run_id"] is not None:
            r = db.run_info(c["active_run_id"])
            run = {k: r.get(k) for k in ("run_id", "status", "params", "seed", "embedding_dim", "n_items",
                                        "n_anchors", "anchor_set_id", "finished_at", "duration")}
        return respond(request, {**c, "active_run": run})

    @app.get("/collections/{name}/anchor", dependencies=auth + neg, response_model=schemas.AnchorDocument,
             tags=["collections"])
    def anchor(name: str, request: Request):
        """The public anchor set (ids, features, labels), the dummy pool and the active run's frame info.

        Everything here is public by construction: the client rebuilds the AnchorFrame from it."""
        from .documents import anchor_document

        return respond(request, anchor_document(name))

    def _model(cls, media: str, body: bytes):
        import pydantic

        try:
            return cls.model_validate(read_body(media, body, settings))
        except pydantic.ValidationError as exc:
            parts = [f"{'.'.join(map(str, e.get('loc', ()))) or 'body'}: {e.get('msg')}" for e in exc.errors()[:5]]
            raise ApiError(422, "invalid_input", "; ".join(parts)) from None

    def _items_sync(name: str, media: str, body: bytes):
        from .. import db
        from .documents import _plain

        b = _model(schemas.ItemsBody, media, body)
        if len(b.ids) > settings.max_ids:
            raise ApiError(413, "too_many_ids", f"{len(b.ids):,} ids; at most {settings.max_ids:,} per call.")
        return _plain(db.fetch_items(name, b.ids, include_features=b.include_features))

    @app.post("/collections/{name}/items", dependencies=admin_scoped + json_body + neg, tags=["collections"],
              openapi_extra=body_schema("ItemsBody"))
    async def items(name: str, request: Request):
        """Items by id (admin keys): external ids, labels, payloads; raw ``features`` only if the collection
        allows it (403).

        Fetching by id tells the server which items you look at: to re-rank a private query's answer use
        ``include_features`` on resolve instead, which returns the features of every row's neighbours."""
        body = await request.body()
        return respond(request, await run_in_threadpool(_items_sync, name, body_type(request), body))

    def _start_job_sync(name: str, media: str, body: bytes, key_id: int | None):
        b = _model(schemas.JobBody, media, body)
        params = check_params(b.params, min_components=settings.job_min_components)
        return state["jobs"].start(name, params, check_seed(b.seed), key_id=key_id)

    @app.post("/collections/{name}/jobs", dependencies=admin_scoped + json_body, status_code=202, response_model=schemas.Job,
              tags=["jobs"], openapi_extra=body_schema("JobBody"))
    async def start_job(name: str, request: Request):
        """Start an SMLQ embedding job (AnchorFrame fit + out-of-sample extension) in the background
        (admin keys; parameters bounded, at most ``max_queued_jobs`` queued or running: 429)."""
        body = await request.body()
        rec = key_of(request)
        job = await run_in_threadpool(_start_job_sync, name, body_type(request), body, rec["id"] if rec else None)
        return JSONResponse(job, status_code=202)

    def _visible_job(request: Request, job: dict[str, Any]) -> bool:
        return in_scope(key_of(request), job["collection"])

    @app.get("/jobs", dependencies=admin, tags=["jobs"])
    def list_jobs(request: Request):
        """The newest jobs (of the key's collections), kept across restarts."""
        rec = key_of(request)
        return {"jobs": state["jobs"].list(None if rec is None else rec.get("collections"))}

    @app.get("/jobs/{job_id}", dependencies=admin, response_model=schemas.Job, tags=["jobs"])
    def get_job(job_id: str, request: Request):
        """A job's status (queued, running, succeeded, failed, interrupted), stage progress (load, embed,
        write, index, switch) and result."""
        try:
            job = state["jobs"].get(job_id)
        except KeyError:
            job = None
        if job is None or not _visible_job(request, job):
            raise ApiError(404, "not_found", f"no job {job_id[:40]!r}; `GET /jobs` lists them.")
        return job

    @app.get("/keys", dependencies=admin, tags=["keys"])
    def keys(request: Request):
        """The API keys (id, name, prefix, role, scope, rate; never the secrets): admin keys without a
        collection scope only."""
        from .auth import list_keys

        rec = key_of(request)
        if rec is not None and rec.get("collections") is not None:
            raise ApiError(403, "forbidden", "a key limited to some collections cannot list keys; use an admin key "
                                             "without --collection.")
        with state["pool"].connection() as conn:
            return {"keys": list_keys(conn=conn)}

    def _resolve_on_replica(name, req, k, inc, answer, db_role, conn):
        """The answer read on a replica in rotation (log written on ``conn``), or None: read on the
        primary (no replica, a paper request, or the replica failed: it leaves the rotation)."""
        from ..client.query import QueryRequest
        from ..client.request import CellRequest

        router = state["router"]
        if router is None or not isinstance(req, (QueryRequest, CellRequest)):  # the paper's: on the primary
            return None
        url = router.pick()
        if url is None:
            return None
        import psycopg

        from ..db.errors import DatabaseConfigError
        from ..db.postgres import redact
        from .db import ServicePool
        from .documents import resolve_document

        try:
            with read_pools_lock:  # one pool per replica, made on its first read
                pool = state["read_pools"].get(url)
                if pool is None:
                    pool = state["read_pools"][url] = ServicePool(url, min_size=0, max_size=settings.pool_max)
            with pool.connection_as(db_role) as rconn:
                return resolve_document(name, req, k=k, include_features=inc, conn=conn, read_conn=rconn,
                                        max_query_rows=min(settings.max_rows, 1000), answer=answer)
        except (psycopg.OperationalError, DatabaseConfigError) as exc:
            router.mark_failed(url, type(exc).__name__)
            log.warning("replica %s left the rotation (%s); reading on the primary", redact(url), type(exc).__name__)
            return None

    def _resolve_sync(name: str, media: str, body: bytes, key_role: str | None) -> dict[str, Any]:
        req, k, inc, answer = check_resolve_body(read_body(media, body, settings), settings, name)
        from .documents import resolve_document

        db_role = state.get("query_role") if key_role == "query" else None
        import psycopg

        try:
            with resolve_slots, state["pool"].connection_as(db_role) as conn:
                res = _resolve_on_replica(name, req, k, inc, answer, db_role, conn)
                if res is None:
                    res = resolve_document(name, req, k=k, include_features=inc, conn=conn,
                                           max_query_rows=min(settings.max_rows, 1000), answer=answer)
        except psycopg.errors.InsufficientPrivilege:
            if db_role is None:
                raise
            log.error("role %s may not read a table of %s (made by another database user?)", db_role, name)
            raise ApiError(500, "database_role_misconfigured", f"the service's database role {db_role} may not read "
                           "this collection's tables; the operator should run `GRANT SELECT ON ALL TABLES IN SCHEMA "
                           f"pm_vector TO {db_role}` (or set PM_VECTOR_SERVICE_QUERY_DB_ROLE=\"\").") from None
        return res

    @app.post("/collections/{name}/resolve", dependencies=auth + json_body + neg, response_model=schemas.ResolveResponse,
              tags=["resolve"], openapi_extra=body_schema("ResolveBody"))
    async def resolve_endpoint(name: str, request: Request):
        """Resolve a request: one entry of ``rows`` per request row; only the client knows which row is real.

        The body is ``{"request": QueryRequest / CellRequest / PrivateMailRequest .to_dict(), "k": 8,
        "answer": "compact" | "features" | "full", "code_bytes": b}``. The compact answer (default of
        class-rows and cell requests) carries every row's candidate ids and product-code prefixes (and
        payloads when there are any): :func:`pm_vector.service.documents.resolve_document`; ``"features"`` the
        full rows with raw features (collections that allow them; ``"include_features": true`` says the
        same)."""
        body = await request.body()
        rec = key_of(request)
        res = await run_in_threadpool(_resolve_sync, name, body_type(request), body, rec and rec.get("role"))
        return respond(request, res)

    @app.get("/collections/{name}/kahm/models", dependencies=auth + neg, response_model=schemas.KAHMModels,
             tags=["kahm"])
    def kahm_models(name: str, request: Request):
        """The collection's stored KAHM models, newest first (``is_current``: the one that serves)."""
        from ..db.kahm.roles import list_kahm_models
        from .documents import _plain

        return respond(request, _plain({"collection": name, "models": list_kahm_models(name)}))

    def _distances_sync(name: str, media: str, body: bytes) -> dict[str, Any]:
        X, mid = check_distances_body(read_body(media, body, settings), settings)
        from ..db.kahm.roles import party_distances
        from .documents import _plain

        with resolve_slots:
            return _plain(party_distances(name, X, model_id=mid))

    @app.post("/collections/{name}/kahm/distances", dependencies=auth + json_body + neg,
              response_model=schemas.PartyDistances,
              tags=["kahm"], openapi_extra=body_schema("DistancesBody"))
    async def kahm_distances(name: str, request: Request):
        """This collection as a party of federated classification (the KAHM paper's eq 104).

        The body is ``{"features": [[...], ...], "model_id": null}``; the answer holds, for every class
        the party's model knows, the distance value (Definition 6) of each query row -- no items, no
        model. Distances of a raw (non-private) model are refused (403) unless the collection opts in.
        JSON object keys are strings: ``distances`` is ``{"<class>": [one per row]}``, and a
        distance that is infinite (the class cannot model the row) is ``null``.
        :meth:`pm_vector.client.http.Client.kahm_distances` turns it back into
        :func:`pm_vector.db.kahm.roles.party_distances`' shape (int keys, numpy arrays, inf)."""
        body = await request.body()
        return respond(request, await run_in_threadpool(_distances_sync, name, body_type(request), body))

    # make the self-parsed bodies part of the schema although the endpoints parse them themselves
    _orig_openapi = app.openapi

    def openapi():
        if app.openapi_schema:
            return app.openapi_schema
        s = _orig_openapi()
        comps = s.setdefault("components", {}).setdefault("schemas", {})
        for m in (schemas.ResolveBody, schemas.PrivateMailRequestBody, schemas.DistancesBody, schemas.ItemsBody,
                  schemas.JobBody):
            js = m.model_json_schema(ref_template="#/components/schemas/{model}")
            for k, v in js.pop("$defs", {}).items():
                comps.setdefault(k, v)
            comps.setdefault(m.__name__, js)
        app.openapi_schema = s
        return s

    app.openapi = openapi  # type: ignore[method-assign]
    return app
