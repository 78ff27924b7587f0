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

This module makes the application: its state, start-up and shut-down (pool, jobs, key cache,
read replicas, request-log pruning), the middleware in its order, the error handlers, and the
OpenAPI document. The endpoints are one router per resource in :mod:`pm_vector.service.routers`,
and what they depend on (settings, state, the key's role and scope, media types) is in
:mod:`pm_vector.service.deps`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool

from .. import __version__ as _version
from . import schemas
from .body_timeout import BodyTimeoutMiddleware
from .errors import install_error_handlers
from .memory import LargeRequestGate, configure_malloc
from .middleware import AuthMiddleware, BodyLimitMiddleware, CatchAllMiddleware
from .routers import anchor, collections, erase, health, items, jobs, kahm, keys, resolve
from .settings import ServiceSettings

log = logging.getLogger("pm_vector.service")


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


def _query_pool(settings: ServiceSettings, state: dict[str, Any]):
    """(login, pool) of query keys' resolves: the pool logs in as a member of the query role, so
    no SQL on it can become the service user; (None, None) when there is no such login (the
    migrating user could not create roles, or the database refused the login: warned, and query
    keys use ``SET ROLE`` on the shared pool)."""
    from .db import ServicePool, query_login, with_login

    if not settings.query_db_url and not state.get("query_role"):
        return None, None
    try:
        login = query_login(state["pool"], settings.query_db_url)
        if settings.query_db_url:
            url = settings.query_db_url
        elif login is None:
            log.warning("no query login role (the migrating user may not create roles): query keys resolve "
                        "under SET ROLE %s, which SQL can reset", settings.query_db_role)
            return None, None
        else:
            url = with_login(state["pool"].url, *login)
        return login, ServicePool(url, min_size=0, max_size=settings.pool_max)
    except Exception as exc:  # noqa: BLE001 - refused login, pg_hba, a fake pool: fall back, say so
        if settings.query_db_url:
            raise
        log.warning("query keys' login role could not connect (%s): they resolve under SET ROLE %s",
                    type(exc).__name__, settings.query_db_role)
        return None, None


def create_app(settings: ServiceSettings | None = None, *, pool=None) -> FastAPI:
    """The application. ``pool``: a :class:`~pm_vector.service.db.ServicePool` (made at start-up if None)."""
    from .auth import FailedAuthLimiter, RateLimiter
    from .jobs import JobManager

    settings = settings or ServiceSettings.from_env()
    # failed authentications per address: this process's, and those the others announce (keycache.py)
    failures = FailedAuthLimiter(settings.auth_failures_per_minute)
    configure_malloc()  # large requests' arrays go back to the system when freed (service/memory.py)
    # the state the routers share (service/deps.py's StateDep); at most pool_max resolves at once
    state: dict[str, Any] = {"pool": pool, "jobs": None, "query_role": None, "query_pool": None, "query_login": None, "router": None,
                             "read_pools": {},
                             "resolve_slots": threading.BoundedSemaphore(max(1, settings.pool_max)),
                             "read_pools_lock": threading.Lock()}

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

    def sync_once() -> dict[str, Any]:
        from ..db.store.attach import sync_pending

        # on the pool's database URL: a sync never starts the embedded server (an outage stays an
        # outage); nothing while the pool knows the database is down, or for a pool without a URL
        pool = state["pool"]
        url = getattr(pool, "url", None)
        health = getattr(pool, "health", None)
        if not url or (health is not None and health.reason() is not None):
            return {}
        return sync_pending(url)

    async def syncer():
        # attached tables' changes reach the answers within about sync_interval_s plus a sync's time
        while True:
            await asyncio.sleep(settings.sync_interval_s)
            try:
                done = await run_in_threadpool(sync_once)
                for name, n in done.items():
                    if isinstance(n, str):
                        log.warning("sync of %s failed (%s); its queue waits for the next pass", name, n)
                    elif n:
                        log.info("synced %d change(s) of %s", n, name)
            except Exception as exc:  # noqa: BLE001 - a database outage must not stop the loop
                log.warning("attached-table sync failed (%s); retrying in %d s", type(exc).__name__,
                            settings.sync_interval_s)

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
        # query keys' own login role and pool (migration 0017, or query_db_url): no SET ROLE to escape
        state["query_login"], state["query_pool"] = await run_in_threadpool(_query_pool, settings, state)
        state["router"] = _read_router(settings, state["pool"])
        if settings.auth and getattr(state["pool"], "url", None):
            from .keycache import KeyCache

            cache = KeyCache(state["pool"].url, failed_ttl=settings.failed_key_ttl_s, on_auth_failure=failures.fail)
            state["keycache"] = await run_in_threadpool(cache.start)
        tasks = [asyncio.create_task(loop()) for loop, on in ((pruner, settings.request_log_retention_days > 0),
                                                              (syncer, settings.sync_interval_s > 0)) if on]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            if state.get("keycache") is not None:
                await run_in_threadpool(state.pop("keycache").close)
            state["jobs"].shutdown()
            for p in state["read_pools"].values():
                p.close()
            if state.get("query_pool") is not None:
                state.pop("query_pool").close()
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
    # (order of the others: body limit, body timeout, large-request gate -- the gate reads a large
    # body under the limit and the timeout, then waits for its slot)
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(LargeRequestGate, threshold_bytes=settings.large_request_bytes,
                       slots=settings.max_large_requests)
    app.add_middleware(BodyTimeoutMiddleware, timeout_s=settings.body_timeout_s)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, settings=settings, state=state, limiter=RateLimiter(settings.rate_per_minute),
                       failures=failures)

    install_error_handlers(app, log)
    # one router per resource (service/routers/), in the order of the OpenAPI document's paths
    for module in (health, collections, anchor, items, erase, jobs, keys, resolve, kahm):
        app.include_router(module.router)

    # make the self-parsed bodies part of the schema although the endpoints parse them themselves
    _orig_openapi = app.openapi

    def openapi():
        if app.openapi_schema:
            return app.openapi_schema
        s = _orig_openapi()
        comps = s.setdefault("components", {}).setdefault("schemas", {})
        for m in (schemas.ResolveBody, schemas.PrivateMailRequestBody, schemas.DistancesBody, schemas.ItemsBody,
                  schemas.DeleteItemsBody,
                  schemas.JobBody):
            js = m.model_json_schema(ref_template="#/components/schemas/{model}")
            for k, v in js.pop("$defs", {}).items():
                comps.setdefault(k, v)
            comps.setdefault(m.__name__, js)
        app.openapi_schema = s
        return s

    app.openapi = openapi  # type: ignore[method-assign]
    return app
