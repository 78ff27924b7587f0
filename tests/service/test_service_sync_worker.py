"""The service's worker drains attached tables' change queues (issue 26, item 3): with
``sync_interval_s`` a row inserted into, changed in or deleted from the user's table reaches the
items and the answers without ``pm-vector sync``, each change applied once."""

from __future__ import annotations

import time
import uuid

import numpy as np
import psycopg


def _vec(v):
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


def _items(conn, name):
    return {r[0]: r[1] for r in conn.execute(
        "SELECT i.external_id, i.id FROM pm_vector.items i JOIN pm_vector.collections c ON c.id = i.collection_id "
        "WHERE c.name = %s", [name]).fetchall()}


def _wait(cond, timeout=60.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError("the worker did not apply the change in time")


def test_the_worker_applies_an_attached_tables_changes(pm_home, svc_split):
    from pm_vector import db
    from pm_vector.db import postgres
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    X, y = svc_split.server
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    t, name = "wdocs_" + uuid.uuid4().hex[:8], "attached_" + uuid.uuid4().hex[:8]
    conn = psycopg.connect(postgres.database_url(), autocommit=True)
    try:
        conn.execute(f"CREATE TABLE public.{t} (id bigint PRIMARY KEY, embedding vector, category int)")
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO public.{t} VALUES (%s, %s::vector, %s)",
                            [(i + 1, _vec(X[i]), int(y[i])) for i in range(len(X))])
        db.attach_table(name, table=f"public.{t}", id_column="id", vector_column="embedding",
                        label_column="category", dim=X.shape[1])
        Xa, ya = svc_split.anchor
        db.register_anchor_set(name, Xa, ya)
        Xd, yd = svc_split.dummy
        db.register_anchor_set(name, Xd, yd, role="dummy")
        db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
        with ServiceThread(ServiceSettings(pool_max=2, request_log_retention_days=0, sync_interval_s=1)):
            conn.execute(f"INSERT INTO public.{t} VALUES (900001, %s::vector, %s)", [_vec(X[3]), int(y[3])])
            conn.execute(f"DELETE FROM public.{t} WHERE id = 5")
            _wait(lambda: "900001" in _items(conn, name) and "5" not in _items(conn, name))
            rid = db.collection_info(name)["active_run_id"]
            new = _items(conn, name)["900001"]
            assert conn.execute(f"SELECT count(*) FROM pm_vector.run_{rid}_items WHERE item_id = %s",
                                [new]).fetchone()[0] == 1  # placed in the active run
            _wait(lambda: conn.execute("SELECT count(*) FROM pm_vector.attach_changes").fetchone()[0] == 0)
            assert len(_items(conn, name)) == len(X)  # one in, one out: each change applied once
    finally:
        db.drop_collection(name, missing_ok=True)
        conn.execute(f"DROP TABLE IF EXISTS public.{t}")
        conn.close()
