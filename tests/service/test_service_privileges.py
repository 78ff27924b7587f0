"""The service runs as no superuser (issue 35, finding 8): its pool, its job manager's lock session,
the attached tables' sync (on the pool's URL) and query keys' own pool all log in as roles that are
not superusers; in the embedded default the shared pool is the owner role ``pm_vector_owner``.
Before migration 0022 they all ran as ``postgres``."""

from __future__ import annotations

import psycopg

WHO = "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"


def test_service_pool_sync_and_jobs_are_no_superuser(svc_collection):
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings
    from pm_vector.service.sync_worker import sync_once

    st = ServiceSettings(max_rows=2000, max_dim=64, pool_max=2, request_log_retention_days=0, sync_interval_s=0)
    with ServiceThread(st) as svc:
        state = svc.app.state.service_state
        with state.pool.connection() as conn:
            owner, superuser = conn.execute(WHO).fetchone()
        assert superuser is False and owner == "pm_vector_owner"
        with state.query_pool.connection() as conn:  # query keys' own login
            assert conn.execute(WHO).fetchone()[1] is False
        # the job manager's lock session (held for the service's life)
        lock = state.jobs._lock_conn
        assert lock.execute(WHO).fetchone() == (owner, False)
        # the sync connects to the pool's URL: the same role
        with psycopg.connect(state.pool.url) as conn:
            assert conn.execute(WHO).fetchone() == (owner, False)
        # a pass as the sync process runs it, on the pool's URL: it reads the queue as the owner
        assert all(isinstance(n, int) for n in sync_once(state.pool.url).values())
        # every session of the service's own pool, as the server sees them
        pids = []
        for _ in range(2):
            with state.pool.connection() as conn:
                pids.append(conn.info.backend_pid)
        with psycopg.connect(state.pool.url) as conn:
            rows = conn.execute("SELECT a.usename, r.rolsuper FROM pg_stat_activity a JOIN pg_roles r "
                                "ON r.oid = a.usesysid WHERE a.pid = ANY(%s)", [pids]).fetchall()
        assert rows and all(r == (owner, False) for r in rows)
