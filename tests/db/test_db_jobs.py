"""Embedding runs: write, index, switch; failures keep the previous run; new items; k-NN results."""

from __future__ import annotations

import numpy as np
import pytest
from dbtest_helpers import data, make_embed_fn, make_extend_fn, projection

from pm_vector.errors import InvalidInputError


def _setup(db, name, n=400, d=6, k_labels=3, seed=0, anchors=40, **kw):
    db.create_collection(name, d, list(range(k_labels)), **kw)
    X, y = data(n, d, k_labels, seed)
    ids = db.ingest(name, X, y, external_ids=[f"i{j}" for j in range(n)])["item_ids"]
    A, ya = data(anchors, d, k_labels, seed + 100)
    db.register_anchor_set(name, A, ya)
    return X, y, ids, A, ya


def _tables(conn, run_id):
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
                        [f"pm_vector.run_{run_id}_items", f"pm_vector.run_{run_id}_anchors"]).fetchone()


def test_job_writes_indexes_and_switches(db, cname, conn):
    X, y, ids, A, ya = _setup(db, cname)
    stages = []
    info = db.run_embedding_job(cname, {"k": 3}, 11, progress=lambda s, d, n: stages.append(s),
                                embed_fn=make_embed_fn(), write_batch_size=150)
    assert info["status"] == "succeeded" and info["is_active"] and info["embedding_dim"] == 3
    assert info["n_items"] == 400 and info["n_anchors"] == 40 and info["items_missing"] == 0
    assert info["params"] == {"k": 3} and info["seed"] == 11 and info["previous_run_id"] is None
    # the job's stages, and their parts (class_rows.graph_s, index.run_s, ...) under the stage's name
    assert {t for t in info["timings"] if "." not in t} == {"load_s", "embed_s", "write_s", "class_rows_s", "index_s",
                                                            "switch_s"}
    assert all(t.split(".")[0] in ("class_rows", "index", "switch") for t in info["timings"] if "." in t)
    assert {"class_rows.graph_s", "class_rows.codes_s", "index.run_s", "switch.lock_s"} <= set(info["timings"])
    assert stages[0] == "load" and stages[-1] == "switch" and {"embed", "write", "index"} <= set(stages)
    rid = info["run_id"]
    assert db.collection_info(cname)["active_run_id"] == rid
    # stored embeddings are exactly embed_fn's output (float32), keyed by item id / anchor position
    P = projection(6, 3, 11)
    rows = dict(conn.execute(f"SELECT item_id, embedding FROM pm_vector.run_{rid}_items").fetchall())
    got = np.stack([rows[int(i)].to_numpy() for i in ids])
    np.testing.assert_allclose(got, (X.astype(np.float64) @ P).astype(np.float32), rtol=1e-6)
    arows = conn.execute(f"SELECT position, embedding FROM pm_vector.run_{rid}_anchors ORDER BY position").fetchall()
    np.testing.assert_allclose(np.stack([r[1].to_numpy() for r in arows]), A.astype(np.float64) @ P, rtol=1e-5)
    idx = conn.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = 'pm_vector' AND tablename = %s "
                       "AND indexdef LIKE '%%hnsw%%'", [f"run_{rid}_items"]).fetchone()[0]
    assert "vector_l2_ops" in idx and "m='16'" in idx


def test_knn_matches_exact_search(db, cname):
    X, y, ids, *_ = _setup(db, cname, n=500)
    info = db.run_embedding_job(cname, {"k": 4}, 3, embed_fn=make_embed_fn())
    E = X.astype(np.float64) @ projection(6, 4, 3)
    q = E[17] + 0.01
    res = db.knn(cname, q, 10)
    exact = np.argsort(np.linalg.norm(E - q, axis=1))[:10]
    assert res["item_ids"][0] == ids[17]
    assert len(set(res["item_ids"].tolist()) & set(ids[exact].tolist())) >= 9  # HNSW is approximate
    np.testing.assert_array_equal(res["labels"], y[np.searchsorted(ids, res["item_ids"])])
    assert np.all(np.diff(res["distances"]) >= 0)
    assert res["external_ids"][0] == "i17"
    # batch = the same answers, one row set per query
    Q = E[[1, 2, 3]] + 0.001
    b = db.knn_batch(cname, Q, 5)
    assert b["item_ids"].shape == (3, 5) and b["counts"].tolist() == [5, 5, 5]
    for j in range(3):
        np.testing.assert_array_equal(b["item_ids"][j], db.knn(cname, Q[j], 5)["item_ids"])
    # k above the default hnsw.ef_search (40) still returns k rows
    assert len(db.knn(cname, q, 120)["item_ids"]) == 120
    assert info["run_id"] == db.collection_info(cname)["active_run_id"]


def test_knn_errors(db, cname, conn):
    db.create_collection(cname, 4, [0, 1])
    with pytest.raises(db.NoActiveRunError, match="no active embedding run"):
        db.knn(cname, np.zeros(3), 5)
    with pytest.raises(db.CollectionNotFoundError, match="unknown collection"):
        db.knn(cname + "x", np.zeros(3), 5)
    X, y = data(50, 4, 2)
    db.ingest(cname, X, y)
    db.register_anchor_set(cname, X[:10], y[:10])
    db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())
    with pytest.raises(db.DimensionMismatchError, match="has 4 dimensions.*embeds in 3"):
        db.knn(cname, np.zeros(4), 5)
    import psycopg

    with pytest.raises(psycopg.Error, match="query 2 has 2 dimensions") as ei:
        conn.execute("SELECT * FROM pm_vector.pm_knn_batch(%s, ARRAY['[0,0,0]'::vector, '[0,0]'::vector], 5)",
                     [cname])
    assert ei.value.sqlstate == "PM003"
    with pytest.raises(db.DimensionMismatchError, match="query 1 has 2 dimensions"):
        db.knn_batch(cname, np.zeros((2, 2)), 5)
    with pytest.raises(InvalidInputError, match="k must be between 1 and 1000"):
        db.knn(cname, np.zeros(3), 0)
    with pytest.raises(InvalidInputError, match="NaN"):
        db.knn(cname, np.array([0, np.nan, 0]), 3)
    # fewer items than k: padded
    b = db.knn_batch(cname, np.zeros((2, 3)), 60)
    assert b["counts"].tolist() == [50, 50] and np.all(b["item_ids"][:, 50:] == -1)


def test_failed_job_keeps_previous_run(db, cname, conn):
    _setup(db, cname)
    first = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())
    before = db.knn(cname, np.ones(3), 5)

    def broken(*args):
        raise RuntimeError("embedding exploded")

    with pytest.raises(db.EmbeddingJobError, match="embedding exploded") as ei:
        db.run_embedding_job(cname, {"k": 3}, 2, embed_fn=broken)
    failed = db.run_info(ei.value.run_id)
    assert failed["status"] == "failed" and "embedding exploded" in failed["error"] and not failed["is_active"]
    assert failed["has_tables"] is False

    def bad_shape(ax, ay, ix, iy, p, s, pr):
        return ax @ np.ones((6, 3)), ix[:-1] @ np.ones((6, 3))

    def nan_out(ax, ay, ix, iy, p, s, pr):
        e = ix @ np.ones((6, 3))
        e[0, 0] = np.nan
        return ax @ np.ones((6, 3)), e

    def dim_mismatch(ax, ay, ix, iy, p, s, pr):
        return ax @ np.ones((6, 3)), ix @ np.ones((6, 2))

    for fn, msg in ((bad_shape, "rows, expected 400"), (nan_out, "NaN"), (dim_mismatch, "columns, but"),
                    (lambda *a: None, "must return")):
        with pytest.raises(db.EmbeddingJobError, match=msg) as ei:
            db.run_embedding_job(cname, {"k": 3}, 2, embed_fn=fn)
        assert db.run_info(ei.value.run_id)["status"] == "failed"
    assert db.collection_info(cname)["active_run_id"] == first["run_id"]
    after = db.knn(cname, np.ones(3), 5)
    np.testing.assert_array_equal(before["item_ids"], after["item_ids"])
    statuses = [r["status"] for r in db.list_runs(cname)]
    assert statuses.count("succeeded") == 1 and statuses.count("failed") == 5
    # no run tables are left behind by the failures
    names = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'pm_vector' "
                                        "AND tablename LIKE 'run\\_%%'").fetchall()}
    for r in db.list_runs(cname):
        assert (f"run_{r['run_id']}_items" in names) == (r["status"] == "succeeded")


def test_job_bad_input_writes_no_run(db, cname, conn):
    db.create_collection(cname, 3, [0])
    n_runs = conn.execute("SELECT count(*) FROM pm_vector.embedding_runs").fetchone()[0]
    with pytest.raises(db.NoAnchorSetError):
        db.run_embedding_job(cname, {}, 1, embed_fn=make_embed_fn())
    with pytest.raises(db.CollectionNotFoundError):
        db.run_embedding_job(cname + "x", {}, 1, embed_fn=make_embed_fn())
    with pytest.raises(InvalidInputError, match="JSON"):
        db.run_embedding_job(cname, {"x": object()}, 1, embed_fn=make_embed_fn())
    with pytest.raises(InvalidInputError, match="seed"):
        db.run_embedding_job(cname, {}, 1.5, embed_fn=make_embed_fn())
    assert conn.execute("SELECT count(*) FROM pm_vector.embedding_runs").fetchone()[0] == n_runs
    db.register_anchor_set(cname, np.ones((2, 3)), [0, 0])
    with pytest.raises(db.EmbeddingJobError, match="no items"):
        db.run_embedding_job(cname, {}, 1, embed_fn=make_embed_fn())
    assert db.collection_info(cname)["active_run_id"] is None


def test_switch_and_retire_old_runs(db, cname, conn):
    _setup(db, cname, n=120, keep_previous_runs=1)
    r1 = db.run_embedding_job(cname, {"k": 2}, 1, embed_fn=make_embed_fn())["run_id"]
    r2 = db.run_embedding_job(cname, {"k": 3}, 2, embed_fn=make_embed_fn())
    assert r2["previous_run_id"] == r1 and r2["embedding_dim"] == 3
    assert _tables(conn, r1) == (True, True)  # kept as the one previous run
    r3 = db.run_embedding_job(cname, {"k": 5}, 3, embed_fn=make_embed_fn())["run_id"]
    assert _tables(conn, r1) == (False, False)  # retired
    assert _tables(conn, r2["run_id"]) == (True, True) and _tables(conn, r3) == (True, True)
    assert db.collection_info(cname)["active_embedding_dim"] == 5
    assert len(db.knn(cname, np.zeros(5), 3)["item_ids"]) == 3
    # the database refuses to activate a run that is not a succeeded run with tables
    import psycopg

    cid = db.collection_info(cname)["id"]
    with pytest.raises(psycopg.Error, match="cannot become the active run"):
        conn.execute("UPDATE pm_vector.collections SET active_run_id = %s WHERE id = %s", [r1, cid])
    with pytest.raises(psycopg.Error, match="status stays succeeded"):
        conn.execute("UPDATE pm_vector.embedding_runs SET status = 'failed' WHERE id = %s", [r3])
    assert db.collection_info(cname)["active_run_id"] == r3


def test_embed_new_items(db, cname):
    X, y, ids, *_ = _setup(db, cname, n=100)
    run = db.run_embedding_job(cname, {"k": 3}, 5, embed_fn=make_embed_fn())
    assert db.embed_new_items(cname, make_extend_fn()) == {"run_id": run["run_id"], "n_new": 0}
    Xn, yn = data(7, 6, seed=9)
    new_ids = db.ingest(cname, Xn, yn)["item_ids"]
    assert db.knn(cname, Xn[0].astype(np.float64) @ projection(6, 3, 5), 1)["item_ids"][0] != new_ids[0]
    out = db.embed_new_items(cname, make_extend_fn())
    assert out == {"run_id": run["run_id"], "n_new": 7}
    hit = db.knn(cname, Xn[0].astype(np.float64) @ projection(6, 3, 5), 1)
    assert hit["item_ids"][0] == new_ids[0]
    assert db.embed_new_items(cname, make_extend_fn())["n_new"] == 0
    db.ingest(cname, Xn[:1], yn[:1])
    with pytest.raises(db.EmbeddingJobError, match="rows, expected 1"):
        db.embed_new_items(cname, lambda *a: np.zeros((3, 3)))


def test_embed_new_items_needs_active_run(db, cname):
    db.create_collection(cname, 3, [0])
    with pytest.raises(db.NoActiveRunError):
        db.embed_new_items(cname, make_extend_fn())


def test_collections_of_different_dimensions_coexist(db, cname):
    other = cname + "_hd"
    try:
        _setup(db, cname, n=80, d=6)
        db.create_collection(other, 2500, [0, 1], metric="cosine")
        X2, y2 = data(60, 2500, 2, seed=5)
        db.ingest(other, X2, y2)
        db.register_anchor_set(other, X2[:8], y2[:8])
        a = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())
        b = db.run_embedding_job(other, {"k": 12}, 1, embed_fn=make_embed_fn())
        assert (a["embedding_dim"], b["embedding_dim"]) == (3, 12)
        assert len(db.knn(cname, np.ones(3), 4)["item_ids"]) == 4
        res = db.knn(other, X2[3].astype(np.float64) @ projection(2500, 12, 1), 4)
        assert res["item_ids"].shape == (4,) and res["distances"][0] < 1e-4  # cosine distance to itself
    finally:
        db.drop_collection(other, missing_ok=True)


def test_drop_collection_removes_run_tables(db, cname, conn):
    _setup(db, cname, n=60)
    rid = db.run_embedding_job(cname, {"k": 2}, 1, embed_fn=make_embed_fn())["run_id"]
    out = db.drop_collection(cname)
    assert out["n_items"] == 60 and out["n_runs"] == 1
    assert _tables(conn, rid) == (False, False)
    assert conn.execute("SELECT count(*) FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0] == 0


def test_with_the_real_anchor_frame(db, cname):
    """The job runner with pm_vector.manifold.AnchorFrame (digits), and its out-of-sample extension."""
    pytest.importorskip("pm_vector.manifold", reason="manifold package not importable")
    from sklearn.datasets import load_digits

    from pm_vector.db.runs.jobs import anchor_frame_embed_fn, anchor_frame_extend_fn

    X, y = load_digits(return_X_y=True)
    X = X / np.linalg.norm(X, axis=1, keepdims=True)
    db.create_collection(cname, 64, list(range(10)))
    db.register_anchor_set(cname, X[:120], y[:120])
    ids = db.ingest(cname, X[120:420], y[120:420])["item_ids"]
    run = db.run_embedding_job(cname, {"n_components": 4, "n_iter": 5}, 7, embed_fn=anchor_frame_embed_fn)
    assert run["embedding_dim"] == 4 and run["status"] == "succeeded"
    # items' nearest neighbours in the embedding mostly share their class
    emb = db.connect(autocommit=True)
    try:
        rows = dict(emb.execute(f"SELECT item_id, embedding FROM pm_vector.run_{run['run_id']}_items").fetchall())
    finally:
        emb.close()
    b = db.knn_batch(cname, np.stack([rows[int(i)].to_numpy() for i in ids[:50]]), 2)
    assert np.mean(b["labels"][:, 1] == y[120:170]) > 0.6  # 0.96 when written
    new = db.ingest(cname, X[420:430], y[420:430])["item_ids"]
    assert db.embed_new_items(cname, anchor_frame_extend_fn)["n_new"] == 10
    assert db.knn(cname, np.zeros(4), 400)["item_ids"].size == 310
    assert set(new.tolist()) <= set(db.knn(cname, np.zeros(4), 400)["item_ids"].tolist())
