"""The service's start-up and shut-down (:func:`lifespan`): what fills the
:class:`~pm_vector.service.state.ServiceState` and what runs beside the requests.

Start-up, in order: the shared connection pool (unless the application was given one), the job
manager (jobs of a stopped service marked interrupted, stale runs cleaned up), the database role
of query keys and their own login pool, the read replicas' router, the key cache (auth on), and
request-log pruning (:func:`prune_once`, a loop on the event loop) and the sync of attached tables
(:class:`~pm_vector.service.sync_worker.SyncWorker`: a thread and connections of its own, one
syncing process per database). Shut-down undoes them in reverse.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from contextlib import asynccontextmanager

import psycopg
from fastapi.concurrency import run_in_threadpool

from .settings import ServiceSettings
from .state import ServiceState
from ..db.core.abandoned import cleanup_stale_runs
from ..db.postgres import cluster, server
from ..db.postgres.replicas import ReadRouter
from ..db.store.retention import prune_request_log
from .db import ServicePool, query_login, with_login
from .jobs import JobManager
from .keycache import KeyCache
from .sync_worker import SyncWorker, lower_request_priority

log = logging.getLogger("pm_vector.service")


def _read_router(settings: ServiceSettings, pool):
    """The replicas resolves are read on: ``settings.read_urls``, else a running local cluster's."""
    urls = [u.strip() for u in settings.read_urls.split(",") if u.strip()]
    if not urls:
        if server.external_url() is None and cluster.topology() is not None:
            urls = cluster.replica_urls()
    primary = getattr(pool, "url", None)
    if not urls or primary is None:
        return None
    return ReadRouter(primary, urls, max_lag_bytes=settings.max_replica_lag_bytes)


def _query_role(settings: ServiceSettings, state: ServiceState) -> str | None:
    """The role a query key's resolve runs as (read + request-log insert only), or None: the
    shared pool's sessions cannot ``SET ROLE`` to it (warned)."""
    try:
        ok = state.pool.usable_role(settings.query_db_role)
    except Exception:  # noqa: BLE001 - a pool without it (tests' fakes) or a database down: no switch
        ok = False
    if not ok and settings.query_db_role:
        log.warning("PostgreSQL role %r not usable: query keys resolve as the service user", settings.query_db_role)
    return settings.query_db_role if ok else None


def _query_pool(settings: ServiceSettings, state: ServiceState):
    """(login, pool) of query keys' resolves: the pool logs in as a member of the query role, so
    no SQL on it can become the service user; (None, None) when there is no such login (the
    migrating user could not create roles, or the database refused the login: warned, and query
    keys use ``SET ROLE`` on the shared pool)."""
    if not settings.query_db_url and not state.query_role:
        return None, None
    try:
        login = query_login(state.pool, settings.query_db_url)
        if settings.query_db_url:
            url = settings.query_db_url
        elif login is None:
            log.warning("no query login role (the migrating user may not create roles): query keys resolve "
                        "under SET ROLE %s, which SQL can reset", settings.query_db_role)
            return None, None
        else:
            url = with_login(state.pool.url, *login)
        return login, ServicePool(url, min_size=0, max_size=settings.pool_max)
    except Exception as exc:  # noqa: BLE001 - refused login, pg_hba, a fake pool: fall back, say so
        if settings.query_db_url:
            raise
        log.warning("query keys' login role could not connect (%s): they resolve under SET ROLE %s",
                    type(exc).__name__, settings.query_db_role)
        return None, None


def _make_jobs(settings: ServiceSettings, state: ServiceState):
    """The job manager; jobs a stopped service left are marked interrupted, and the runs they
    left 'running' failed."""
    url = getattr(state.pool, "url", None)
    jm = JobManager(state.pool.connection, settings.job_workers, settings.max_queued_jobs,
                    lock_connection=(lambda: psycopg.connect(url, autocommit=True)) if url else None)
    n = jm.recover()
    if n:
        log.warning("%d job(s) of a stopped service marked interrupted", n)
    try:  # and the runs such jobs left 'running' (no session holds their lock) become failed

        cleanup_stale_runs()
    except Exception as exc:  # noqa: BLE001 - best effort; `pm-vector db cleanup` does it too
        log.warning("stale-run cleanup at start-up failed (%s)", type(exc).__name__)
    return jm


def prune_once(settings: ServiceSettings, state: ServiceState) -> int:
    """Delete the request-log rows older than the retention; returns how many."""
    with state.pool.connection() as conn:
        return prune_request_log(conn, older_than=dt.timedelta(days=settings.request_log_retention_days))


async def _pruner(settings: ServiceSettings, state: ServiceState) -> None:
    # a service that answers requests must not grow its log without bound
    while True:
        try:
            n = await run_in_threadpool(prune_once, settings, state)
            if n:
                log.info("pruned %d request-log row(s)", n)
        except Exception as exc:  # noqa: BLE001 - a database outage must not stop the loop
            log.warning("request-log prune failed (%s); retrying in %d s", type(exc).__name__,
                        settings.prune_interval_s)
        await asyncio.sleep(settings.prune_interval_s)


def _sync_worker(settings: ServiceSettings, state: ServiceState):
    """The attached tables' sync worker, started (None: ``sync_interval_s`` 0, or a pool without a
    URL, as the tests' fakes)."""
    url = getattr(state.pool, "url", None)
    if settings.sync_interval_s <= 0 or not url:
        return None
    state.syncer = SyncWorker(url, settings.sync_interval_s, health=getattr(state.pool, "health", None),
                              background_cpus=settings.background_cpus, merge_cpus=settings.merge_cpus,
                              sync_nice=settings.sync_nice).start()
    # (below the sync process, which runs sync_nice below the worker's thread that makes it; request_nice 0:
    # nothing lowered, as for a service in a thread of its host's process: pm_vector.service.runner)
    lower_request_priority(settings.request_nice + settings.sync_nice if settings.request_nice else 0,
                           state.syncer.native_id)
    return state.syncer


async def _start(app, settings: ServiceSettings, state: ServiceState, failures) -> bool:
    """Fill ``state`` (module doc); returns whether the pool was made here (and is closed here)."""
    own = state.pool is None
    if own:
        state.pool = await run_in_threadpool(ServicePool, min_size=settings.pool_min, max_size=settings.pool_max)
    state.jobs = app.state.jobs = await run_in_threadpool(_make_jobs, settings, state)
    state.query_role = await run_in_threadpool(_query_role, settings, state)
    # query keys' own login role and pool (migration 0017, or query_db_url): no SET ROLE to escape
    state.query_login, state.query_pool = await run_in_threadpool(_query_pool, settings, state)
    state.router = _read_router(settings, state.pool)
    if settings.auth and getattr(state.pool, "url", None):
        cache = KeyCache(state.pool.url, failed_ttl=settings.failed_key_ttl_s, on_auth_failure=failures.fail)
        state.keycache = await run_in_threadpool(cache.start)
    return own


async def _stop(state: ServiceState, own: bool) -> None:
    if state.keycache is not None:
        cache, state.keycache = state.keycache, None
        await run_in_threadpool(cache.close)
    state.jobs.shutdown()
    for p in state.read_pools.values():
        p.close()
    if state.query_pool is not None:
        pool, state.query_pool = state.query_pool, None
        pool.close()
    if own:
        state.pool.close()


def lifespan(settings: ServiceSettings, state: ServiceState, failures):
    """The application's lifespan: start-up fills ``state``, the background loops run while it
    serves, shut-down closes what start-up opened. ``failures``: the
    :class:`~pm_vector.service.auth.FailedAuthLimiter` the key cache reports other processes'
    failed authentications to."""

    @asynccontextmanager
    async def run(app):
        own = await _start(app, settings, state, failures)
        tasks = [asyncio.create_task(_pruner(settings, state))] if settings.request_log_retention_days > 0 else []
        syncer = _sync_worker(settings, state)
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            if syncer is not None:
                await run_in_threadpool(syncer.stop)
            await _stop(state, own)

    return run
