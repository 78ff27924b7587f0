"""A run's HNSW index on its items holds the items it was built with (migration 0029,
``sql/0029_index_upto.sql``): the items placed after it (the delta's new items, a merge's catch-up)
are not inserted into it by the write; ``pm_knn`` / ``pm_knn_batch`` scan them exactly beside the
index, so they answer as the exact nearest; the next merge indexes them; the migration goes down
and up."""

from __future__ import annotations

import numpy as np
from test_db_erase import _collection


def _state(conn, rid):
    upto = conn.execute("SELECT index_upto FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    idx = conn.execute("SELECT pg_get_indexdef(to_regclass(%s))", [f"pm_vector.run_{rid}_items_hnsw"]).fetchone()[0]
    ids = [r[0] for r in conn.execute(f"SELECT item_id FROM pm_vector.run_{rid}_items ORDER BY 1").fetchall()]
    return upto, idx, ids


def _exact(conn, rid, q, k):
    """The k nearest live items of the run by l2, ties by id (numpy over the table's rows)."""
    rows = conn.execute(f"SELECT e.item_id, e.embedding::text FROM pm_vector.run_{rid}_items e "
                        "JOIN pm_vector.items i ON i.id = e.item_id ORDER BY 1").fetchall()
    ids = np.asarray([r[0] for r in rows])
    E = np.asarray([np.fromstring(r[1].strip("[]"), sep=",") for r in rows])
    d = np.linalg.norm(E - np.fromstring(q.strip("[]"), sep=","), axis=1)
    return ids[np.lexsort((ids, d))[:k]].tolist()


def test_new_items_stay_out_of_the_index_and_are_found_exactly(db, cname, conn):
    from dbtest_helpers import make_embed_fn, make_extend_fn

    X, y, ids, rid = _collection(db, cname, n=400, delta=True)
    upto, idx, run_ids = _state(conn, rid)
    assert upto == max(run_ids) == int(ids.max())
    assert idx.endswith(f"WHERE (item_id <= '{upto}'::bigint)") or idx.endswith(f"WHERE (item_id <= {upto})"), idx
    rng = np.random.default_rng(7)
    Xn = (X[:25] + 0.05 * rng.normal(size=X[:25].shape)).astype(np.float32)
    new = np.asarray(db.ingest(cname, Xn, y[:25], embed_fn_extend=make_extend_fn())["item_ids"])
    upto2, idx2, run_ids2 = _state(conn, rid)
    assert (upto2, idx2) == (upto, idx) and set(new.tolist()) <= set(run_ids2) and new.min() > upto
    emb = dict(conn.execute(f"SELECT item_id, embedding::text FROM pm_vector.run_{rid}_items WHERE item_id = ANY(%s)",
                            [new.tolist() + ids[:5].tolist()]).fetchall())
    # each new item (above the index) and each old one (in it) is its own nearest, at distance 0
    for i in new.tolist()[:8] + ids[:5].tolist():
        got = conn.execute("SELECT rank, item_id, distance FROM pm_vector.pm_knn(%s, %s::vector, 10, 400)",
                           [cname, emb[i]]).fetchall()
        assert got[0][:2] == (1, i) and got[0][2] < 1e-6, (i, got[:2])
        assert [r[1] for r in got] == _exact(conn, rid, emb[i], 10)
    qs = [emb[i] for i in new.tolist()[:4]]
    rows = conn.execute("SELECT query_index, rank, item_id FROM pm_vector.pm_knn_batch(%s, %s::vector[], 3, 400)",
                        [cname, qs]).fetchall()
    assert [(r[0], r[2]) for r in rows if r[1] == 1] == [(j + 1, i) for j, i in enumerate(new.tolist()[:4])]
    # the plan: the items above the index by the primary key's range (the index's own use at a size
    # where the planner takes it: tests/db/test_db_sql.py, tests/db/test_resolution.py)
    plan = "\n".join(r[0] for r in conn.execute("SELECT * FROM pm_vector.pm_knn_batch_explain(%s, %s::vector[], 5)",
                                                [cname, qs]).fetchall())
    assert f"Index Cond: (item_id > '{upto}'::bigint)" in plan, plan
    # the merge indexes them
    out = db.merge(cname, embed_fn=make_embed_fn(), embed_fn_extend=make_extend_fn())
    upto3, idx3, run_ids3 = _state(conn, out["run_id"])
    assert upto3 == max(run_ids3) >= int(new.max()) and f"<= '{upto3}'" in idx3 or f"<= {upto3})" in idx3


def test_the_migration_goes_down_and_up(fresh_url):
    """0029's downgrade drops index_upto and gives back the statement of before (a run built partial
    answers alike, by scanning its items); the upgrade makes them again."""
    import psycopg
    from alembic import command

    from pm_vector.db import postgres
    from pm_vector.db.postgres.migrate import alembic_config, upgrade_to_head

    with psycopg.connect(fresh_url, autocommit=True) as c:
        postgres.ensure_pgvector(c)
    upgrade_to_head(fresh_url)

    def shape():
        with psycopg.connect(fresh_url) as c:
            col = c.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = 'pm_vector.embedding_runs'::regclass "
                            "AND attname = 'index_upto' AND NOT attisdropped").fetchone()[0]
            src = c.execute("SELECT prosrc FROM pg_proc WHERE oid = "
                            "'pm_vector.pm_knn_sql(bigint,text,text,boolean)'::regprocedure").fetchone()[0]
            return col, "index_upto" in src

    assert shape() == (1, True)
    command.downgrade(alembic_config(fresh_url), "0028_cluster_query")
    assert shape() == (0, False)
    upgrade_to_head(fresh_url)
    assert shape() == (1, True)
