"""resolve() of class-rows requests: every row's prior found by one pgvector k-NN statement, ranked
on the run's graph held in memory (pm_vector.db.resolve.run_graph, pm_vector.shortlist.rank_retained).
Its answers against the SQL function pm_shortlist on the same run and the same index (classes
larger and smaller than max_prior, min_weight on and off); the graph read again after new items;
older-layout runs answered by pm_shortlist; the plan."""

from __future__ import annotations

import numpy as np
import pytest
from pmtest_plans import reads_by_index

KP = 32


def _make(db, cname, n=3000, dim=10, max_prior=64, min_weight=0.0, seed=5):
    """Three classes of ~1000 items (searched through their HNSW index when max_prior < 1000)."""
    from dbtest_helpers import make_embed_fn

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    X = (rng.normal(size=(n, dim)) + 2.5 * np.eye(dim)[y]).astype(np.float32)
    db.create_collection(cname, dim, [0, 1, 2], settings={"delta": False})  # (rows extended in the write)
    ids = np.asarray(db.ingest(cname, X, y, external_ids=[f"e{i}" for i in range(n)],
                               payloads=[{"i": i} for i in range(n)])["item_ids"])
    db.register_anchor_set(cname, X[:300], y[:300])
    db.register_anchor_set(cname, X[300:400], y[300:400], role="dummy")
    run = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn(),
                               class_rows={"max_prior": max_prior, "min_weight": min_weight})
    return X, y, ids, int(run["run_id"])


def _requests(cname, X, y, eps_list=(1.0, 8.0, 64.0, 1024.0), n=6, seed=0):
    from pm_vector.client.query import PrivateKNN
    from pm_vector.db.resolve.resolution import class_frames
    from pm_vector.privacy import secure_generator

    frames = class_frames(cname)
    out = []
    for eps in eps_list:
        c = PrivateKNN(frames, X[300:400].astype(np.float64), y[300:400], epsilon=eps, shortlist=KP,
                       collection=cname)._inject_generator(secure_generator(seed))
        for j in range(n):
            out.append(c.request(X[1000 + 37 * j].astype(np.float64), int(y[1000 + 37 * j]))[0])
    return out


def _sql(conn, cname, req):
    res = conn.execute("SELECT row_index, item_id, score FROM pm_vector.pm_shortlist(%s, %s::float8[], "
                       "%s::float8[], %s)", [cname, req.rows.tolist(), list(req.sigmas), KP]).fetchall()
    conn.rollback()
    out: dict[int, tuple[list, list]] = {}
    for r, i, s in res:
        out.setdefault(r - 1, ([], []))
        out[r - 1][0].append(int(i))
        out[r - 1][1].append(float(s))
    return out


def _compare(res, sql):
    """Same candidates in the same order; scores equal to 1e-12 (relative). Returns the number of
    rows compared."""
    for r, row in enumerate(res["rows"]):
        ids, sc = sql[r]
        assert row["item_ids"] == ids, (r, row["item_ids"][:5], ids[:5])
        np.testing.assert_allclose(row["scores"], sc, rtol=1e-12, atol=1e-300)
    return len(res["rows"])


@pytest.mark.parametrize("max_prior,min_weight", [(64, 0.0), (64, 0.01), (4096, 0.0)])
def test_resolve_equals_the_sql_function(db, cname, conn, max_prior, min_weight):
    """Searched classes (max_prior 64 < ~1000 items: the HNSW scan), min_weight on, and classes
    retained whole (max_prior 4096: no k-NN statement)."""
    from pm_vector.db.resolve import run_graph
    from pm_vector.db.resolve.resolution import resolve

    X, y, ids, rid = _make(db, cname, max_prior=max_prior, min_weight=min_weight)
    n_rows = 0
    for req in _requests(cname, X, y):
        res = resolve(cname, req, log=False)
        assert set(res["timings_ms"]) >= {"prior_knn", "score", "fetch"}  # the in-memory ranking served it
        n_rows += _compare(res, _sql(conn, cname, req))
        pos = {int(v): j for j, v in enumerate(ids)}
        for row in res["rows"]:  # the items' own fields come with every candidate
            assert row["external_ids"] == [f"e{pos[v]}" for v in row["item_ids"]]
            assert row["payloads"] == [{"i": pos[v]} for v in row["item_ids"]]
            assert row["labels"] == [int(y[pos[v]]) for v in row["item_ids"]]
    assert n_rows == 24 * 3
    assert any(k[3] == rid for k in run_graph._cache)  # read once, kept


def test_new_items_make_the_graph_read_again(db, cname, conn):
    from dbtest_helpers import make_extend_fn

    from pm_vector.db.resolve import run_graph
    from pm_vector.db.resolve.resolution import resolve

    X, y, ids, rid = _make(db, cname, n=1500)
    reqs = _requests(cname, X, y, eps_list=(64.0,), n=3)
    for req in reqs:
        _compare(resolve(cname, req, log=False), _sql(conn, cname, req))
    before = {k for k in run_graph._cache if k[3] == rid}
    assert len(before) == 1 and next(iter(before))[5] == 0
    rng = np.random.default_rng(9)
    y_new = rng.integers(0, 3, 300)
    X_new = (rng.normal(size=(300, X.shape[1])) + 2.5 * np.eye(X.shape[1])[y_new]).astype(np.float32)
    db.ingest(cname, X_new, y_new)
    db.embed_new_items(cname, make_extend_fn())
    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    conn.rollback()
    assert doc["graph_version"] == 1
    for req in reqs:  # the new items' neighbour lists and the changed hub counts are ranked on
        _compare(resolve(cname, req, log=False), _sql(conn, cname, req))
    keys = {k for k in run_graph._cache if k[3] == rid}
    assert any(k[5] == 1 for k in keys)
    graph = next(run_graph._cache[k] for k in keys if k[5] == 1)
    assert graph.ids.size == 1800


def test_a_run_without_neighbour_lists_is_answered_by_the_sql_function(db, cname, conn):
    from pm_vector.db.resolve import run_graph
    from pm_vector.db.resolve.resolution import resolve

    X, y, ids, rid = _make(db, cname, n=1200)
    conn.execute(f"ALTER TABLE pm_vector.run_{rid}_prior DROP COLUMN nbrs, DROP COLUMN nhub")
    conn.commit()
    for req in _requests(cname, X, y, eps_list=(8.0,), n=2):
        res = resolve(cname, req, log=False)
        assert "prior_knn" not in res["timings_ms"]
        _compare(res, _sql(conn, cname, req))
    assert not any(k[3] == rid for k in run_graph._cache)


def test_explain_shows_the_prior_knn_through_each_class_index(db, cname):
    from pm_vector.db.resolve.resolution import explain_resolution

    X, y, ids, rid = _make(db, cname, n=6000)  # 2,000 items per class: the index, not a sort
    req = _requests(cname, X, y, eps_list=(8.0,), n=1)[0]
    plans = explain_resolution(cname, req.to_json())
    knn = "\n".join(plans["prior_knn"])
    for k in range(3):
        assert f"Index Scan using run_{rid}_prior_{k}_coords_idx on run_{rid}_prior_{k}" in knn, knn
    assert knn.count("Order By: (coords <-> ") == 3, knn
    assert reads_by_index("\n".join(plans["statement"]), "items_pkey")


def test_one_knn_statement_and_one_candidates_statement_per_request(db, cname):
    from test_db_class_rows import _Counting

    import pm_vector.db as pdb
    from pm_vector.db.resolve.resolution import resolve

    X, y, ids, rid = _make(db, cname, n=1500)  # max_prior 64 < 500 items per class: every row searched
    c = _Counting(pdb.connect())
    try:
        reqs = _requests(cname, X, y, eps_list=(8.0,), n=3)
        for req in reqs:
            resolve(cname, req, conn=c, log=False)
    finally:
        c.close()
    assert c.knn_statements == len(reqs) and c.shortlist_statements == len(reqs)


def test_graphs_are_kept_within_the_memory_budget(db, cname, monkeypatch):
    """Least recently used graphs leave first once the process's budget is passed; the newest
    always stays (a graph larger than the budget is still used)."""
    from pm_vector.db.postgres.config import ENV_RUN_GRAPH_CACHE_MB
    from pm_vector.db.resolve import run_graph
    from pm_vector.db.resolve.resolution import resolve

    run_graph.clear_cache()
    X, y, ids, rid1 = _make(db, cname, n=1200)
    req1 = _requests(cname, X, y, eps_list=(8.0,), n=1)[0]
    resolve(cname, req1, log=False)
    (g1,) = run_graph._cache.values()
    monkeypatch.setenv(ENV_RUN_GRAPH_CACHE_MB, str(1.5 * g1.nbytes / 2**20))  # room for one graph, not two
    other = cname + "_b"
    X2, y2, _, rid2 = _make(db, other, n=1200, seed=6)
    try:
        resolve(other, _requests(other, X2, y2, eps_list=(8.0,), n=1)[0], log=False)
        assert [k[3] for k in run_graph._cache] == [rid2]
        resolve(cname, req1, log=False)  # read again
        assert [k[3] for k in run_graph._cache] == [rid1]
        monkeypatch.setenv(ENV_RUN_GRAPH_CACHE_MB, "0")
        resolve(other, _requests(other, X2, y2, eps_list=(8.0,), n=1)[0], log=False)
        assert [k[3] for k in run_graph._cache] == [rid2]  # the newest stays whatever the budget
    finally:
        db.drop_collection(other, missing_ok=True)
