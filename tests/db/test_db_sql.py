"""The SQL a user calls: pm_knn, pm_knn_batch (one statement, HNSW per query), views."""

from __future__ import annotations

import numpy as np
import pytest
from dbtest_helpers import data, make_embed_fn, projection
from pgvector import Vector


@pytest.fixture(scope="module")
def served(pm_home):
    """A collection of 2,000 items with an active run (k = 4), shared by this module."""
    import pm_vector.db as db

    name = "sql_served"
    db.drop_collection(name, missing_ok=True)
    db.create_collection(name, 8, [0, 1, 2, 3])
    X, y = data(2000, 8, 4, seed=3)
    ids = db.ingest(name, X, y, external_ids=[f"x{i}" for i in range(2000)])["item_ids"]
    db.register_anchor_set(name, X[:50], y[:50])
    run = db.run_embedding_job(name, {"k": 4}, 8, embed_fn=make_embed_fn())
    E = X.astype(np.float64) @ projection(8, 4, 8)
    yield {"name": name, "ids": ids, "y": y, "E": E, "run_id": run["run_id"]}
    db.drop_collection(name, missing_ok=True)


def test_pm_knn_sql(conn, served):
    q = served["E"][42]
    rows = conn.execute("SELECT rank, item_id, external_id, label, distance FROM pm_vector.pm_knn(%s, %s, 5)",
                        [served["name"], Vector(q.astype(np.float32))]).fetchall()
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0][1] == served["ids"][42] and rows[0][2] == "x42" and rows[0][3] == served["y"][42]
    assert rows[0][4] < 1e-5 and all(a[4] <= b[4] for a, b in zip(rows, rows[1:]))
    # a literal from psql works just as well
    lit = "[" + ",".join(f"{v:.6f}" for v in q) + "]"
    rows2 = conn.execute("SELECT item_id FROM pm_vector.pm_knn(%s, %s::vector, 5)", [served["name"], lit]).fetchall()
    assert [r[0] for r in rows2] == [r[1] for r in rows]
    # the caller's hnsw.ef_search is untouched afterwards
    conn.execute("BEGIN")
    conn.execute("SET LOCAL hnsw.ef_search = 77")
    conn.execute("SELECT count(*) FROM pm_vector.pm_knn(%s, %s, 200)", [served["name"], Vector(q.astype(np.float32))])
    assert conn.execute("SHOW hnsw.ef_search").fetchone()[0] == "77"
    conn.execute("COMMIT")


def test_pm_knn_batch_one_statement(conn, served):
    qs = served["E"][[5, 6, 7, 8]].astype(np.float32)
    rows = conn.execute("SELECT query_index, rank, item_id, distance FROM pm_vector.pm_knn_batch(%s, %s::vector[], 3)",
                        [served["name"], [Vector(v) for v in qs]]).fetchall()
    assert len(rows) == 12
    assert [(r[0], r[1]) for r in rows] == [(i, j) for i in range(1, 5) for j in range(1, 4)]
    for i in range(4):
        assert rows[3 * i][2] == served["ids"][5 + i]  # each query's nearest item is itself
    # the same as one pm_knn per query
    for i in range(4):
        single = conn.execute("SELECT item_id FROM pm_vector.pm_knn(%s, %s, 3)",
                              [served["name"], Vector(qs[i])]).fetchall()
        assert [r[2] for r in rows[3 * i:3 * i + 3]] == [r[0] for r in single]
    assert conn.execute("SELECT count(*) FROM pm_vector.pm_knn_batch(%s, '{}'::vector[], 3)",
                        [served["name"]]).fetchone()[0] == 0
    # a table of query rows, answered in one statement
    conn.execute("CREATE TEMP TABLE my_queries (id int, q vector(4))")
    for i, v in enumerate(qs):
        conn.execute("INSERT INTO my_queries VALUES (%s, %s)", [i, Vector(v)])
    n = conn.execute("SELECT count(*) FROM pm_vector.pm_knn_batch(%s, ARRAY(SELECT q FROM my_queries ORDER BY id), 2)",
                     [served["name"]]).fetchone()[0]
    assert n == 8


def test_explain_shows_hnsw_index_per_query(conn, served):
    """EXPLAIN of the statement pm_knn_batch runs: one HNSW index scan per query row (LATERAL)."""
    qs = [Vector(v) for v in served["E"][:3].astype(np.float32)]
    plan = "\n".join(r[0] for r in conn.execute(
        "SELECT * FROM pm_vector.pm_knn_batch_explain(%s, %s::vector[], 5)", [served["name"], qs]).fetchall())
    rid = served["run_id"]
    assert f"Index Scan using run_{rid}_items_hnsw on run_{rid}_items" in plan
    assert "Order By: (embedding <-> q.vec)" in plan
    assert "Nested Loop" in plan and "Function Scan on unnest q" in plan
    # no query row scans the run's items: each is an HNSW index scan (the join that adds the items'
    # columns may scan pm_vector.items when the planner finds it small, as in a test database)
    assert f"Seq Scan on run_{rid}_items" not in plan and "Sort Key: ((e.embedding" not in plan.split("Limit")[-1]


def test_auto_explain_of_the_real_call(served):
    """The plan of the statement executed inside pm_knn_batch itself (auto_explain, nested statements;
    loading it needs the superuser: pm_vector's own role is none)."""
    import psycopg

    from pm_vector.db.postgres import admin_url, configure

    conn = psycopg.connect(admin_url(), autocommit=True)
    configure(conn)
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET auto_explain.log_level = 'notice'")
    qs = [Vector(v) for v in served["E"][10:14].astype(np.float32)]
    rows = conn.execute("SELECT * FROM pm_vector.pm_knn_batch(%s, %s::vector[], 4)", [served["name"], qs]).fetchall()
    conn.execute("SET auto_explain.log_min_duration = -1")
    assert len(rows) == 16
    inner = [n for n in notices if "CROSS JOIN LATERAL" in n]
    assert inner, notices
    rid = served["run_id"]
    assert f"Index Scan using run_{rid}_items_hnsw" in inner[0]
    assert "Order By: (embedding <-> q.vec)" in inner[0]
    conn.close()


def test_sql_errors(conn, served):
    import psycopg

    with pytest.raises(psycopg.Error, match="unknown collection 'nope'") as ei:
        conn.execute("SELECT * FROM pm_vector.pm_knn('nope', '[1,2,3,4]', 3)")
    assert ei.value.sqlstate == "PM001"
    with pytest.raises(psycopg.Error, match="has 3 dimensions") as ei:
        conn.execute("SELECT * FROM pm_vector.pm_knn(%s, '[1,2,3]', 3)", [served["name"]])
    assert ei.value.sqlstate == "PM003"
    with pytest.raises(psycopg.Error, match="k must be between 1 and 1000"):
        conn.execute("SELECT * FROM pm_vector.pm_knn(%s, '[1,2,3,4]', 1001)", [served["name"]])
    with pytest.raises(psycopg.Error, match="query 2 is NULL"):
        conn.execute("SELECT * FROM pm_vector.pm_knn_batch(%s, ARRAY['[1,2,3,4]'::vector, NULL], 3)",
                     [served["name"]])


def test_views(conn, served):
    c = conn.execute("SELECT name, feature_dim, metric, n_items, active_run_id, active_embedding_dim, n_anchors "
                     "FROM pm_vector.pm_collections WHERE name = %s", [served["name"]]).fetchone()
    assert c == (served["name"], 8, "l2", 2000, served["run_id"], 4, 50)
    r = conn.execute("SELECT collection, status, is_active, embedding_dim, n_items, has_tables, worker_alive "
                     "FROM pm_vector.pm_runs WHERE run_id = %s", [served["run_id"]]).fetchone()
    assert r == (served["name"], "succeeded", True, 4, 2000, True, None)
    a = conn.execute("SELECT role, n_rows, is_current FROM pm_vector.pm_anchor_sets WHERE collection = %s",
                     [served["name"]]).fetchall()
    assert a == [("anchor", 50, True)]
    assert conn.execute("SELECT count(*) FROM pm_vector.pm_requests").fetchone()[0] >= 0
