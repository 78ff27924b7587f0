"""``GET /collections/{name}/sync`` (admin keys): an attached table's sync status -- the changes
queued and the oldest one's wait -- as ``pm_vector.db.sync_status`` reads it; 403 for a query key,
404 for an unknown collection, 409 ``not_attached`` for a collection that is not an attached table;
back to nothing queued once the service's worker has applied the changes."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import httpx
import numpy as np
import psycopg


def _vec(v):
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


def _h(rec):
    return {"Authorization": f"Bearer {rec['key']}"}


def test_the_sync_status_route(service, svc_admin_key, svc_key, pm_home):
    from pm_vector import db
    from pm_vector.db import postgres
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 4)).astype(np.float32)
    t, name, plain = "sdocs_" + uuid.uuid4().hex[:8], "synced_" + uuid.uuid4().hex[:8], "plain_" + uuid.uuid4().hex[:8]
    conn = psycopg.connect(postgres.database_url(), autocommit=True)
    locker = psycopg.connect(postgres.database_url())
    try:
        conn.execute(f"CREATE TABLE public.{t} (id bigint PRIMARY KEY, embedding vector(4), category int)")
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO public.{t} VALUES (%s, %s::vector, %s)",
                            [(i + 1, _vec(X[i]), i % 2) for i in range(25)])
        db.attach_table(name, table=f"public.{t}", id_column="id", vector_column="embedding", label_column="category")
        db.create_collection(plain, 4, [0, 1])
        # the collection row locked as a sync batch locks it: the service's worker (every second) waits,
        # so the changes stay queued while the route is asked
        locker.execute("SELECT 1 FROM pm_vector.collections WHERE name = %s FOR NO KEY UPDATE", [name])
        conn.execute(f"INSERT INTO public.{t} VALUES (26, %s::vector, 1)", [_vec(X[25])])
        conn.execute(f"UPDATE public.{t} SET embedding = %s::vector WHERE id = 3", [_vec(X[26])])
        conn.execute(f"DELETE FROM public.{t} WHERE id IN (4, 5)")
        time.sleep(0.5)
        oldest = conn.execute("SELECT min(queued_at) FROM pm_vector.attach_changes a JOIN pm_vector.collections c "
                              "ON c.id = a.collection_id WHERE c.name = %s", [name]).fetchone()[0]
        with httpx.Client(base_url=service.url, timeout=30) as c:
            r = c.get(f"/collections/{name}/sync", headers=_h(svc_admin_key))
            assert r.status_code == 200, r.text
            got = r.json()
            assert set(got) == {"collection", "source_table", "queued", "oldest_queued_at", "lag_s", "rejected",
                                "broken", "broken_at", "pending_purge", "purge_age_s"}  # (+ the delta's purge)
            assert got["pending_purge"] == 0 and got["purge_age_s"] is None
            assert got["broken"] is None and got["broken_at"] is None
            assert got["collection"] == name and got["source_table"].split(".")[-1] == t
            assert got["queued"] == 4  # an insert, an update, two deletes
            assert dt.datetime.fromisoformat(got["oldest_queued_at"]) == oldest
            assert 0.5 <= got["lag_s"] < 60
            # a query key may not see it; an unknown collection is 404, a plain one 409
            r = c.get(f"/collections/{name}/sync", headers=_h(svc_key))
            assert r.status_code == 403 and r.json()["error"] == "forbidden" and "--role admin" in r.json()["message"]
            r = c.get("/collections/no_such_collection_x/sync", headers=_h(svc_admin_key))
            assert r.status_code == 404 and r.json()["error"] == "not_found"
            assert "no_such_collection_x" in r.json()["message"]
            r = c.get(f"/collections/{plain}/sync", headers=_h(svc_admin_key))
            assert r.status_code == 409 and r.json()["error"] == "not_attached"
            assert "is not attached to a table" in r.json()["message"]
            assert c.get(f"/collections/{name}/sync").status_code == 401
            # the lock released, a service's sync worker applies the queue: nothing queued, no lag
            locker.rollback()
            with ServiceThread(ServiceSettings(pool_max=2, request_log_retention_days=0, sync_interval_s=1)):
                t0 = time.monotonic()
                while True:
                    got = c.get(f"/collections/{name}/sync", headers=_h(svc_admin_key)).json()
                    if got["queued"] == 0 or time.monotonic() - t0 > 60:
                        break
                    time.sleep(0.3)
            assert (got["queued"], got["oldest_queued_at"], got["lag_s"]) == (0, None, None), got
            assert db.collection_info(name)["n_items"] == 25 - 2 + 1
    finally:
        locker.close()
        db.drop_collection(name, missing_ok=True)
        db.drop_collection(plain, missing_ok=True)
        conn.execute(f"DROP TABLE IF EXISTS public.{t}")
        conn.close()
