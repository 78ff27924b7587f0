"""Class-rows requests (format "pm_vector.class-rows/1") in PostgreSQL: the per-run frames, prior,
graph, hubs and published compact codes built by the embedding job; pm_vector.pm_shortlist against
the in-memory PosteriorShortlist; resolve() end to end (codes and KAHM class scores in the same
statement); the plan; bad input; kill safety."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from pmtest_plans import reads_by_index

EPSILONS = (1.0, 4.0, 16.0)
N_REQ = 20
KP = 64


@pytest.fixture(scope="module")
def served(pm_home):
    """digits: server 800 / anchor 300 / dummy 150 / query 100; an AnchorFrame run with class rows;
    the in-memory PosteriorShortlist fit on the same (float32 as stored) data."""
    import pm_vector.db as db
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.manifold.class_frames import ClassFrames
    from pm_vector.shortlist import PosteriorShortlist

    ds = load_dataset("digits")
    sp = split_dataset(ds, 800, 300, 150, 100, seed=0)
    name = "cr_served"
    db.drop_collection(name, missing_ok=True)
    db.create_collection(name, ds.dim, ds.classes.tolist(), allow_raw_features=True)
    Xs, ys = sp.server
    ids = db.ingest(name, Xs, ys, external_ids=[f"d{i}" for i in range(len(ys))],
                    payloads=[{"n": i} for i in range(len(ys))])["item_ids"]
    db.register_anchor_set(name, *sp.anchor)
    db.register_anchor_set(name, *sp.dummy, role="dummy")
    run = db.run_embedding_job(name, {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn)
    X32 = np.asarray(Xs, dtype=np.float32).astype(np.float64)
    Xa = np.asarray(sp.anchor[0], dtype=np.float32).astype(np.float64)
    frames = ClassFrames(4, 0.9).fit(Xa, sp.anchor[1])
    ps = PosteriorShortlist(16, 1024).fit(frames, X32, ys)
    yield {"name": name, "split": sp, "ids": np.asarray(ids), "run": run, "frames": frames, "ps": ps, "X": X32,
           "y": np.asarray(ys)}
    db.drop_collection(name, missing_ok=True)


def _client(served, eps, seed=0, shortlist=KP):
    from pm_vector.client.query import PrivateKNN
    from pm_vector.privacy import secure_generator

    Xd, yd = served["split"].dummy
    c = PrivateKNN(served["frames"], np.asarray(Xd, np.float32).astype(np.float64), yd, epsilon=eps,
                   shortlist=shortlist, collection=served["name"])
    return c._inject_generator(secure_generator(seed))


def _requests(served, eps, n=N_REQ, seed=0):
    c = _client(served, eps, seed)
    Xq, yq = served["split"].query
    return [c.request(np.asarray(Xq[i], np.float32).astype(np.float64), int(yq[i])) for i in range(n)]


def _log_count(conn) -> int:
    return conn.execute("SELECT count(*) FROM pm_vector.request_log").fetchone()[0]


def _sql_shortlist(conn, name, req, kp=None, max_prior=None):
    rows = conn.execute("SELECT row_index, rank, item_id, score FROM pm_vector.pm_shortlist(%s, %s::float8[], "
                        "%s::float8[], %s, %s)",
                        [name, req.rows.tolist(), list(req.sigmas), kp or req.shortlist, max_prior]).fetchall()
    out: dict[int, list] = {}
    for r in rows:
        out.setdefault(r[0] - 1, []).append((r[2], r[3]))
    return out


def test_the_job_stores_frames_prior_graph_and_hubs(served, conn):
    from pm_vector.client.query import frames_digest
    from pm_vector.db.resolve.resolution import class_frames, public_anchor

    rid = served["run"]["run_id"]
    print("job timings (s):", served["run"]["timings"])
    doc, fr = conn.execute("SELECT class_rows, class_frames FROM pm_vector.embedding_runs WHERE id = %s",
                           [rid]).fetchone()
    assert doc["status"] == "ready" and doc["n_components"] == 4 and doc["clip_quantile"] == 0.9
    from pm_vector.shortlist import MAX_PRIOR, MIN_WEIGHT

    assert doc["graph_degree"] == 16 and doc["max_prior"] == MAX_PRIOR and doc["min_weight"] == MIN_WEIGHT
    assert doc["classes"] == list(range(10)) and sum(doc["class_sizes"]) == 800
    assert doc["frames_digest"] == frames_digest(served["frames"])
    cf = class_frames(served["name"])
    np.testing.assert_allclose(cf.components_, served["frames"].components_, atol=1e-12)
    pa, info = public_anchor(served["name"])
    assert info["class_frames"] == fr and info["class_rows"]["frames_digest"] == doc["frames_digest"]
    assert pa.dummy_features.shape == (150, 64)
    # a client built from the published data alone gets answers
    from pm_vector.client.query import PrivateKNN
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.manifold.class_frames import ClassFrames

    pub = ClassFrames.from_dict(info["class_frames"])
    assert frames_digest(pub) == doc["frames_digest"]
    client = PrivateKNN(pub, pa.dummy_features, pa.dummy_labels, epsilon=4.0, shortlist=16)
    Xq, yq = served["split"].query
    req, secret = client.request(Xq[0], int(yq[0]))
    assert not req.seeded
    res = resolve(served["name"], req, log=False)
    assert len(res["rows"]) == 10 and all(len(r["item_ids"]) == 16 for r in res["rows"])
    n_prior = conn.execute(f"SELECT count(*) FROM pm_vector.run_{rid}_prior").fetchone()[0]
    n_nb = conn.execute(f"SELECT count(*) FROM pm_vector.run_{rid}_neighbors").fetchone()[0]
    assert n_prior == 800 and n_nb == 800 * 16
    # the graph and the hubs are the in-memory ones
    ps, ids = served["ps"], served["ids"]
    pos = {int(v): i for i, v in enumerate(ids)}
    nb = conn.execute(f"SELECT item_id, array_agg(neighbor_id ORDER BY neighbor_id) FROM pm_vector.run_{rid}_neighbors "
                      "GROUP BY item_id").fetchall()
    for iid, lst in nb[:100]:
        assert sorted(pos[v] for v in lst) == sorted(ps.neighbors_[pos[iid]].tolist())
    hubs = conn.execute(f"SELECT label, item_id, hub FROM pm_vector.run_{rid}_hubs").fetchall()
    for lab, iid, h in hubs[:500]:
        assert ps.hubs_[int(lab)][pos[iid]] == h
    assert sum(h for _, _, h in hubs) == 800 * 16


@pytest.mark.parametrize("eps", EPSILONS)
def test_sql_shortlist_equals_the_in_memory_one(served, conn, eps):
    ps, ids = served["ps"], served["ids"]
    worst = total = 0
    for req, _ in _requests(served, eps):
        sql = _sql_shortlist(conn, served["name"], req)
        mem = ps.shortlist(req, KP)
        assert sorted(sql) == list(range(10))
        for c in range(10):
            got = [v for v, _ in sql[c]]
            assert len(got) == KP
            want = ids[mem[c]].tolist()
            diff = len(set(got) ^ set(want)) // 2
            if diff:  # only where scores tie at the boundary
                s = ps.scores(req.rows[c], req.sigmas[c], req.classes[c])
                kth = np.sort(s)[::-1][KP - 1]
                pos = {int(v): i for i, v in enumerate(ids)}
                for v in set(got) ^ set(want):
                    assert np.isclose(s[pos[v]], kth, rtol=1e-9, atol=1e-300)
            worst = max(worst, diff)
            total += diff
            # scores are the in-memory scores
            s = ps.scores(req.rows[c], req.sigmas[c], req.classes[c])
            pos = {int(v): i for i, v in enumerate(ids)}
            np.testing.assert_allclose([sc for _, sc in sql[c]], [s[pos[v]] for v, _ in sql[c]], rtol=1e-9,
                                       atol=1e-300)
    print(f"eps {eps}: {total} boundary swaps in {N_REQ * 10} rows (worst row {worst})")
    assert worst <= 2
    # the vector[] overload (float32 rows): the same shortlists up to float32 rounding
    from pgvector import Vector

    req, _ = _requests(served, eps, n=1)[0]
    v = conn.execute("SELECT row_index, item_id FROM pm_vector.pm_shortlist(%s, %s::vector[], %s::float8[], %s)",
                     [served["name"], [Vector(r) for r in req.rows.astype(np.float32)], list(req.sigmas),
                      KP]).fetchall()
    ref = _sql_shortlist(conn, served["name"], req)
    for c in range(10):
        got = {iid for ri, iid in v if ri == c + 1}
        assert len(got & {iid for iid, _ in ref[c]}) >= KP - 2



def _true_knn(served, x, k=8):
    d = ((served["X"] - x) ** 2).sum(1)
    return set(served["ids"][np.argsort(d, kind="stable")[:k]].tolist())


class _Counting:
    """A connection proxy counting statements: those returning the rows' candidates with their
    items (``shortlist_statements``) and the prior k-NN statements (``knn_statements``)."""

    def __init__(self, conn):
        self._conn = conn
        self.statements = 0
        self.shortlist_statements = 0
        self.knn_statements = 0

    def execute(self, query, *a, **kw):
        self.statements += 1
        if "WHERE it.id = s.item_id" in str(query):
            self.shortlist_statements += 1
        if "coords <->" in str(query):
            self.knn_statements += 1
        return self._conn.execute(query, *a, **kw)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_resolve_one_statement_and_recall_after_rerank_equals_in_memory(served, conn):
    from pm_vector.client.query import PrivateKNN
    from pm_vector.db import connect, list_requests
    from pm_vector.db.resolve.resolution import resolve

    ps, ids = served["ps"], served["ids"]
    Xq, _ = served["split"].query
    before = _log_count(conn)
    c = _Counting(connect())
    rec_db, rec_mem, ms = [], [], []
    n = 0
    try:
        for eps in EPSILONS:
            for i, (req, secret) in enumerate(_requests(served, eps)):
                x = np.asarray(Xq[i], np.float32).astype(np.float64)
                text = req.to_json() if i % 2 else req  # JSON text and objects
                t = time.perf_counter()
                res = resolve(served["name"], text, include_features=True, conn=c)
                ms.append((time.perf_counter() - t) * 1e3)
                n += 1
                assert res["format"] == "pm_vector.class-rows/1" and res["k_prime"] == KP
                assert res["n_query_rows"] == 10 and len(res["rows"]) == 10
                for row in res["rows"]:  # every row carries its candidates' features
                    assert row["features"].shape == (KP, 64) and len(row["payloads"]) == KP
                real = secret.pick(res["rows"])
                top = PrivateKNN.rerank(x, real["item_ids"], real["features"], 8)
                truth = _true_knn(served, x)
                rec_db.append(len(truth & set(np.asarray(top).tolist())) / 8)
                cand = mem = ps.shortlist(req, KP)[secret.real_row]
                mem = PrivateKNN.rerank(x, ids[cand], served["X"][cand], 8)
                rec_mem.append(len(truth & set(np.asarray(mem).tolist())) / 8)
                pos = {int(v): j for j, v in enumerate(ids)}
                assert real["payloads"] == [{"n": pos[v]} for v in real["item_ids"]]
                assert real["external_ids"] == [f"d{pos[v]}" for v in real["item_ids"]]
    finally:
        c.close()
    assert c.shortlist_statements == n  # one statement per request returns all rows' candidates
    assert c.knn_statements <= n  # and at most one finds every row's prior (none: every class retained whole)
    assert _log_count(conn) == before + n
    log = list_requests(served["name"], limit=1)[0]
    assert log["row_count"] == 10 * KP and log["request"]["format"] == "pm_vector.class-rows/1"
    assert "x" not in log["request"] and "label" not in log["request"]
    print(f"nn_recall@8 db {np.mean(rec_db):.4f} memory {np.mean(rec_mem):.4f}; resolve p50 "
          f"{np.median(ms):.1f} ms p95 {np.percentile(ms, 95):.1f} ms")
    assert abs(np.mean(rec_db) - np.mean(rec_mem)) <= 1 / (8 * n) + 1e-12
    assert np.mean(rec_db) > 0.3


def test_explain_resolution_of_a_class_rows_request(served):
    from pm_vector.db.resolve.resolution import explain_resolution

    req, _ = _requests(served, 4.0, n=1)[0]
    plans = explain_resolution(served["name"], req.to_json())
    # the candidates are read by primary key; the classes fit in max_prior: no prior search
    assert reads_by_index("\n".join(plans["statement"]), "items_pkey") and plans["prior_knn"] == []
    inner = "\n".join(plans["shortlist"])
    rid = served["run"]["run_id"]
    # a run built after migration 0009: neighbour lists come with the prior rows, the graph table is not read
    assert f"run_{rid}_prior_0" in inner and "unnest" in inner and f"run_{rid}_neighbors" not in inner


@pytest.fixture(scope="module")
def big(pm_home):
    """A collection with classes larger than max_prior (64): the prior is read through the HNSW index."""
    import pm_vector.db as db
    from pm_vector.manifold.class_frames import ClassFrames
    from pm_vector.shortlist import PosteriorShortlist

    rng = np.random.default_rng(5)
    n, dim = 6000, 12
    y = rng.integers(0, 3, n)
    X = (rng.normal(size=(n, dim)) + 3.0 * np.eye(dim)[y]).astype(np.float32)
    name = "cr_big"
    db.drop_collection(name, missing_ok=True)
    db.create_collection(name, dim, [0, 1, 2], allow_raw_features=True)
    ids = db.ingest(name, X, y)["item_ids"]
    db.register_anchor_set(name, X[:300], y[:300])
    db.register_anchor_set(name, X[300:400], y[300:400], role="dummy")
    from dbtest_helpers import make_embed_fn

    run = db.run_embedding_job(name, {"k": 3}, 1, embed_fn=make_embed_fn(), class_rows={"max_prior": 64})
    frames = ClassFrames(4, 0.9).fit(X[:300].astype(np.float64), y[:300])
    ps = PosteriorShortlist(16, 64).fit(frames, X.astype(np.float64), y)
    yield {"name": name, "X": X, "y": y, "ids": np.asarray(ids), "run": run, "frames": frames, "ps": ps}
    db.drop_collection(name, missing_ok=True)


def test_explain_class_restricted_prior_scan_uses_the_hnsw_index(big, conn):
    from pm_vector.client.query import PrivateKNN
    from pm_vector.privacy import secure_generator

    c = PrivateKNN(big["frames"], big["X"][300:400].astype(np.float64), big["y"][300:400], epsilon=8.0,
                   shortlist=32)._inject_generator(secure_generator(1))
    req, _ = c.request(big["X"][500].astype(np.float64), int(big["y"][500]))
    lines = [r[0] for r in conn.execute(
        "SELECT * FROM pm_vector.pm_shortlist_explain(%s, %s::float8[], %s::float8[], %s)",
        [big["name"], req.rows.tolist(), list(req.sigmas), 32]).fetchall()]
    plan = "\n".join(lines)
    rid = big["run"]["run_id"]
    # the class-restricted, distance-ordered scan of the prior: each class partition's HNSW index
    for k in range(3):
        assert f"Index Scan using run_{rid}_prior_{k}_coords_idx on run_{rid}_prior_{k}" in plan, plan
    assert "Order By: (coords <-> q.zv)" in plan
    # and the answer follows the in-memory one (HNSW: approximate retained sets, so overlap)
    sql = _sql_shortlist(conn, big["name"], req, kp=32)
    mem = big["ps"].shortlist(req, 32)
    overlap = [len(set(v for v, _ in sql[r]) & set(big["ids"][mem[r]].tolist())) / 32 for r in range(3)]
    print("overlap with the in-memory shortlist (HNSW prior)", overlap)
    assert np.mean(overlap) >= 0.8
    # more retained prior items than hnsw.ef_search can give (1000): the iterative scan reads on
    from pm_vector.shortlist import PosteriorShortlist

    ps = PosteriorShortlist(16, 1500).fit(big["frames"], big["X"].astype(np.float64), big["y"])
    assert min(np.bincount(big["y"])) > 1500
    sql = _sql_shortlist(conn, big["name"], req, kp=32, max_prior=1500)
    mem = ps.shortlist(req, 32)
    overlap = [len(set(v for v, _ in sql[r]) & set(big["ids"][mem[r]].tolist())) / 32 for r in range(3)]
    print("overlap, max_prior 1500", overlap)
    assert np.mean(overlap) >= 0.8
    # the mechanism: with pm_prepare_prior_search's settings the class's HNSW scan returns all 1500
    z = "[" + ",".join(map(str, req.rows[0])) + "]"
    q = (f"SELECT count(*) FROM (SELECT item_id FROM pm_vector.run_{rid}_prior_0 "
         f"ORDER BY coords <-> '{z}'::vector LIMIT 1500) AS s")
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL enable_sort = off")
        conn.execute("SELECT pm_vector.pm_prepare_prior_search(1500)")
        assert "Index Scan using" in "\n".join(r[0] for r in conn.execute("EXPLAIN " + q).fetchall())
        assert conn.execute(q).fetchone()[0] == 1500
        conn.execute("SET LOCAL hnsw.iterative_scan = off")
        assert conn.execute(q).fetchone()[0] <= 1000


def test_bad_class_rows_requests_are_refused_clearly_and_nothing_is_logged(served, db, conn, cname):
    from pm_vector.db.errors import FramesDigestMismatchError
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.errors import RequestError
    from pm_vector.errors import InvalidInputError

    name = served["name"]
    req, _ = _requests(served, 4.0, n=1)[0]
    d = req.to_dict()
    before = _log_count(conn)

    def refused(exc, match, request, collection=name, **kw):
        with pytest.raises(exc, match=match):
            resolve(collection, request, **kw)
        assert _log_count(conn) == before

    refused(FramesDigestMismatchError, "Fetch the current public anchor", {**d, "frames_digest": "0" * 32})
    refused(RequestError, "needs exactly 10 rows, one per class",
            {**d, "rows": d["rows"][:9], "classes": d["classes"][:9], "sigmas": d["sigmas"][:9],
             **({"grid": d["grid"][:9]} if d.get("grid") is not None else {})})  # the release's grid, per row
    refused(RequestError, "needs exactly 10 rows", {**d, "classes": d["classes"][::-1]})
    bad = json.loads(req.to_json())
    bad["rows"][2][1] = float("nan")
    refused(InvalidInputError, "NaN or infinite", json.dumps(bad))
    obj = type(req).from_dict(d)
    obj.rows[0, 0] = np.inf
    refused(RequestError, "NaN or infinite values .first at row 0", obj)
    refused(InvalidInputError, "shortlist must be a positive integer", {**d, "shortlist": 0})
    refused(InvalidInputError, "k' .* must be an integer in 1..1000", req, shortlist=0)
    refused(InvalidInputError, "k' .* must be an integer in 1..1000", {**d, "shortlist": 5000})
    refused(RequestError, "sigmas must be 10 finite numbers > 0", {**d, "sigmas": [0.0] * 10})
    refused(RequestError, "built for collection 'elsewhere'", {**d, "collection": "elsewhere"})
    refused(db.DimensionMismatchError, "3 coordinates", {**d, "rows": [r[:3] for r in d["rows"]]})
    refused(db.CollectionNotFoundError, "unknown collection", req, "no_such_collection")
    # SQL called directly: clear errors too
    import psycopg

    with pytest.raises(psycopg.Error, match="rows must be a 10 x 4 array"):
        conn.execute("SELECT * FROM pm_vector.pm_shortlist(%s, %s::float8[], %s::float8[], 8)",
                     [name, d["rows"][:9], d["sigmas"]])
    with pytest.raises(psycopg.Error, match="k_prime must be between 1 and 1000"):
        conn.execute("SELECT * FROM pm_vector.pm_shortlist(%s, %s::float8[], %s::float8[], 0)",
                     [name, d["rows"], d["sigmas"]])
    with pytest.raises(psycopg.Error, match="NaN"):
        conn.execute("SELECT * FROM pm_vector.pm_shortlist(%s, %s::float8[], %s::float8[], 8)",
                     [name, [[float("nan")] * 4] + d["rows"][1:], d["sigmas"]])
    # a run without class rows (an anchor set with a 1-row class): a clear error naming the fix
    from dbtest_helpers import data, make_embed_fn

    X, y = data(80, 5, 3)
    db.create_collection(cname, 5, [0, 1, 2])
    db.ingest(cname, X, y)
    Xa, ya = X[:10].copy(), np.array([0] * 5 + [1] * 4 + [2])
    db.register_anchor_set(cname, Xa, ya)
    db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())
    from pm_vector.db.errors import ClassRowsUnavailableError
    from pm_vector.db.resolve.resolution import class_frames

    with pytest.raises(ClassRowsUnavailableError, match="class 2 has 1 anchor row.*new embedding job"):
        class_frames(cname)
    with pytest.raises(psycopg.Error, match="has no class rows .class 2 has 1 anchor row"):
        conn.execute("SELECT * FROM pm_vector.pm_shortlist(%s, %s::float8[], %s::float8[], 8)",
                     [cname, d["rows"][:3], d["sigmas"][:3]]).fetchall()
    refused(ClassRowsUnavailableError, "has no class rows .class 2 has 1 anchor row.*new embedding job",
            {**d, "collection": None}, cname)
    assert conn.execute("SELECT count(*) FROM pm_vector.request_log WHERE status = 'error'").fetchone()[0] == 0


def test_a_failed_job_leaves_the_previous_runs_class_rows_serving(served, db, conn):
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.db.resolve.resolution import resolve

    name = served["name"]
    reqs = _requests(served, 4.0, n=3)
    before = [resolve(name, r, log=False)["rows"] for r, _ in reqs]
    rid = served["run"]["run_id"]

    def fail_at_index(stage, done, total):
        if stage == "index":
            raise RuntimeError("disk on fire")

    with pytest.raises(db.EmbeddingJobError, match="disk on fire") as ei:
        db.run_embedding_job(name, {"n_components": 8}, 4, progress=fail_at_index, embed_fn=anchor_frame_embed_fn)
    failed = ei.value.run_id
    for kind in ("items", "prior", "neighbors", "hubs", "codes"):
        assert conn.execute("SELECT to_regclass(%s)", [f"pm_vector.run_{failed}_{kind}"]).fetchone()[0] is None
    assert conn.execute(f"SELECT count(*) FROM pg_class WHERE relname LIKE 'run_{failed}_prior%%'").fetchone()[0] == 0
    assert db.collection_info(name)["active_run_id"] == rid
    after = [resolve(name, r, log=False)["rows"] for r, _ in reqs]
    assert [[r["item_ids"] for r in a] for a in after] == [[r["item_ids"] for r in b] for b in before]


KILL_CHILD = """
import sys, time, numpy as np
import pm_vector.db as db

name = sys.argv[1]

def embed(ax, ay, ix, iy, params, seed, progress):
    P = np.random.default_rng(seed).normal(size=(ax.shape[1], 3))
    return ax.astype(np.float64) @ P, ix.astype(np.float64) @ P

def progress(s, done, total):
    if s == "index":
        print("READY", done, total, flush=True)
        time.sleep(300)

db.run_embedding_job(name, {"k": 3}, 99, progress=progress, embed_fn=embed)
print("FINISHED", flush=True)
"""


def test_a_sigkilled_job_leaves_the_previous_class_rows_serving(db, cname, conn):
    import os
    import signal

    from dbtest_helpers import data, make_embed_fn, start_child, wait_ready

    from pm_vector.client.query import PrivateKNN
    from pm_vector.db.resolve.resolution import class_frames, resolve
    from pm_vector.privacy import secure_generator

    X, y = data(900, 6, seed=4)
    db.create_collection(cname, 6, [0, 1, 2])
    db.ingest(cname, X, y)
    db.register_anchor_set(cname, X[:60], y[:60])
    db.register_anchor_set(cname, X[60:90], y[60:90], role="dummy")
    first = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())["run_id"]
    client = PrivateKNN(class_frames(cname), X[60:90], y[60:90], epsilon=4.0, shortlist=16)
    client._inject_generator(secure_generator(3))
    req, _ = client.request(X[200].astype(np.float64), int(y[200]))
    before = [r["item_ids"] for r in resolve(cname, req, log=False)["rows"]]

    child = start_child(KILL_CHILD, cname)
    try:
        wait_ready(child)
        run_id = [r for r in db.list_runs(cname) if r["status"] == "running"][0]["run_id"]
        # the killed job's class rows were written (before the index stage) ...
        assert conn.execute(f"SELECT count(*) FROM pm_vector.run_{run_id}_prior").fetchone()[0] == 900
        assert conn.execute(f"SELECT count(*) FROM pm_vector.run_{run_id}_codes").fetchone()[0] == 900
        # ... and nothing serves them: the previous run answers
        assert [r["item_ids"] for r in resolve(cname, req, log=False)["rows"]] == before
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    deadline = time.monotonic() + 15
    while db.run_info(run_id)["worker_alive"] is not False and time.monotonic() < deadline:
        time.sleep(0.1)
    assert db.collection_info(cname)["active_run_id"] == first
    assert [r["item_ids"] for r in resolve(cname, req, log=False)["rows"]] == before
    assert db.cleanup_stale_runs(cname) == [run_id]
    for kind in ("prior", "neighbors", "hubs", "codes"):
        assert conn.execute("SELECT to_regclass(%s)", [f"pm_vector.run_{run_id}_{kind}"]).fetchone()[0] is None
    assert [r["item_ids"] for r in resolve(cname, req, log=False)["rows"]] == before


def test_embed_new_items_extends_prior_graph_and_hubs(db, cname, conn):
    from dbtest_helpers import data, make_embed_fn, make_extend_fn

    from pm_vector.db.resolve.resolution import class_frames

    X, y = data(400, 6, seed=7)
    db.create_collection(cname, 6, [0, 1, 2], settings={"delta": False})  # (rows extended in the write)
    db.ingest(cname, X[:300], y[:300])
    db.register_anchor_set(cname, X[:60], y[:60])
    rid = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())["run_id"]
    doc0 = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    new_ids = db.ingest(cname, X[300:], y[300:])["item_ids"]
    assert db.embed_new_items(cname, make_extend_fn()) == {"run_id": rid, "n_new": 100}
    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    assert sum(doc["class_sizes"]) == 400 and sum(doc0["class_sizes"]) == 300
    assert conn.execute(f"SELECT count(*) FROM pm_vector.run_{rid}_prior").fetchone()[0] == 400
    assert conn.execute(f"SELECT count(*) FROM pm_vector.run_{rid}_neighbors").fetchone()[0] == 400 * 16
    assert conn.execute(f"SELECT sum(hub) FROM pm_vector.run_{rid}_hubs").fetchone()[0] == 400 * 16
    # a new item's own neighbours are its 16 nearest among all 400 items
    ids = np.asarray(conn.execute("SELECT i.id FROM pm_vector.items i JOIN pm_vector.collections c ON c.id = "
                                  "i.collection_id WHERE c.name = %s ORDER BY i.id", [cname]).fetchall())[:, 0]
    j = 350
    d = ((X.astype(np.float64) - X[j]) ** 2).sum(1)
    d[j] = np.inf
    want = set(ids[np.argsort(d)[:16]].tolist())
    got = {r[0] for r in conn.execute(f"SELECT neighbor_id FROM pm_vector.run_{rid}_neighbors WHERE item_id = %s",
                                      [int(new_ids[j - 300])]).fetchall()}
    assert got == want
    coords = conn.execute(f"SELECT coords8 FROM pm_vector.run_{rid}_prior WHERE item_id = %s",
                          [int(new_ids[j - 300])]).fetchone()[0]
    np.testing.assert_allclose(coords, class_frames(cname).clipped(X[j:j + 1].astype(np.float64), [y[j]])[0],
                               atol=1e-12)
    # ... and its code: the run's published product codes (fit on the 60 anchor rows alone) of its features
    from pm_vector.protocol.published_codes import unpack

    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    assert doc["codes"]["status"] == "ready" and doc["codes"]["stage_bytes"] == [16, 32]
    assert doc["codes"]["widths"] == [16, 32]  # 6-d features: no table of 64 bytes or more
    pc = unpack(conn.execute("SELECT public_projection FROM pm_vector.embedding_runs WHERE id = %s",
                             [rid]).fetchone()[0], doc["codes"]["digest"])
    stored = dict(conn.execute(f"SELECT item_id, code FROM pm_vector.run_{rid}_codes").fetchall())
    assert len(stored) == 400
    X64 = X.astype(np.float32).astype(np.float64)
    want = pc.encode(X64)
    for pos_, iid in enumerate(ids):  # old items and new ones alike
        np.testing.assert_array_equal(np.frombuffer(bytes(stored[int(iid)]), np.uint8), want[pos_])


# ----------------------------------------------------------------------------- published codes, KAHM

def _recall(top, truth) -> float:
    return len(truth & set(np.asarray(top).tolist())) / 8


@pytest.fixture(scope="module")
def coded(pm_home, served):
    """The same digits split in a collection that does NOT hand out raw features (codes only)."""
    import pm_vector.db as db
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    sp = served["split"]
    name = "cr_coded"
    db.drop_collection(name, missing_ok=True)
    db.create_collection(name, 64, list(range(10)), allow_raw_features=False)
    Xs, ys = sp.server
    ids = db.ingest(name, Xs, ys)["item_ids"]
    db.register_anchor_set(name, *sp.anchor)
    db.register_anchor_set(name, *sp.dummy, role="dummy")
    run = db.run_embedding_job(name, {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn)
    yield {"name": name, "ids": np.asarray(ids), "run": run}
    db.drop_collection(name, missing_ok=True)


def test_codes_round_trip_through_the_database(served, conn):
    """The job fits the product codes on the public anchor alone, stores every item's code (bytea)
    equal to ProductCodes.encode of its features, publishes the codes with the anchor under a
    digest; a compact answer's codes decode to the items' reconstructions, every row alike."""
    from pm_vector.protocol.published_codes import unpack
    from pm_vector.db.resolve.resolution import public_anchor, resolve
    from pm_vector.errors import RequestError
    from pm_vector.manifold.codes import ProductCodes

    rid = served["run"]["run_id"]
    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    assert {k: doc["codes"][k] for k in ("status", "code_bytes", "n_stages", "stage_bytes", "widths")} == {
        "status": "ready", "code_bytes": 32, "n_stages": 2, "stage_bytes": [16, 32], "widths": [16, 32, 64]}
    pa, info = public_anchor(served["name"])
    pc = unpack(info["product_codes"], doc["codes"]["digest"])
    # the published codes are those fit on the public anchor set alone (float32 as stored)
    ref = ProductCodes(32, 2, (64,)).fit(np.asarray(served["split"].anchor[0], np.float32).astype(np.float64))
    assert ref.digest() == pc.digest() == doc["codes"]["digest"]
    np.testing.assert_allclose(pc.mean_, pa.features.mean(0), atol=1e-6)  # public data only
    with pytest.raises(Exception, match="digest"):  # a document that is not the published one
        unpack(info["product_codes"], "0" * 64)
    stored = dict(conn.execute(f"SELECT item_id, code FROM pm_vector.run_{rid}_codes").fetchall())
    assert len(stored) == 800
    want = pc.encode(served["X"])
    pos = {int(v): i for i, v in enumerate(served["ids"])}
    for iid, code in stored.items():
        np.testing.assert_array_equal(np.frombuffer(bytes(code), np.uint8), want[pos[iid]])
    for req, _ in _requests(served, 4.0, n=3):
        full = resolve(served["name"], req, include_features=True, code_bytes=64, log=False)
        assert full["codes"] == {"bytes": 64, "digest": pc.digest()} and full["answer"] == "full"
        for row in full["rows"]:  # EVERY row carries its candidates' codes: those of the features sent with them
            assert row["codes"].shape == (KP, 64) and row["codes"].dtype == np.uint8
            np.testing.assert_array_equal(row["codes"], pc.select(pc.encode(row["features"].astype(np.float64)), 64))
        compact = resolve(served["name"], req, compact=True, log=False)
        assert compact["answer"] == "compact" and compact["codes"]["bytes"] == 32  # the residual code unless asked
        short = resolve(served["name"], req, compact=True, code_bytes=16, log=False)
        for row, frow, srow in zip(compact["rows"], full["rows"], short["rows"]):
            # ids, codes and (this collection stores some) payloads; nothing else
            assert set(row) == {"row", "item_ids", "codes", "payloads"}
            assert row["item_ids"].dtype == np.uint32 and row["item_ids"].tolist() == frow["item_ids"]
            assert row["payloads"] == frow["payloads"]
            X_rows = served["X"][[pos[int(v)] for v in row["item_ids"]]]
            np.testing.assert_allclose(pc.decode(row["codes"]), pc.decode(pc.select(pc.encode(X_rows), 32)), atol=1e-12)
            np.testing.assert_array_equal(srow["codes"], row["codes"][:, :16])  # a stage prefix
        plain = resolve(served["name"], req, log=False)
        assert [r["item_ids"] for r in plain["rows"]] == [r["item_ids"] for r in full["rows"]]
        assert plain["codes"] is None and "codes" not in plain["rows"][0]
    with pytest.raises(RequestError, match=r"published code widths \[16, 32, 64\]"):
        resolve(served["name"], req, compact=True, code_bytes=40, log=False)
    with pytest.raises(Exception, match="no raw features"):
        resolve(served["name"], req, compact=True, include_features=True, log=False)


def test_rerank_by_codes_recall_is_close_to_raw_features(served, conn):
    """nn_recall@8 of the real row's k'=64 candidates re-ranked by their product codes (64 B and
    the 32 B stage prefix, asymmetric distances) vs by raw features, on the same answers (digits
    800/300/150/100)."""
    from pm_vector.protocol.published_codes import unpack
    from pm_vector.client.query import PrivateKNN
    from pm_vector.db.resolve.resolution import public_anchor, resolve

    info = public_anchor(served["name"])[1]
    pc = unpack(info["product_codes"], info["class_rows"]["codes"]["digest"])
    Xq, _ = served["split"].query
    rec_f, rec_64, rec_32 = {}, {}, {}
    for eps in EPSILONS:
        rf, r64, r32 = [], [], []
        for i, (req, secret) in enumerate(_requests(served, eps, n=100)):
            x = np.asarray(Xq[i], np.float32).astype(np.float64)
            res = resolve(served["name"], req, include_features=True, code_bytes=64, log=False)
            real = secret.pick(res["rows"])
            real32 = secret.pick(resolve(served["name"], req, code_bytes=32, log=False)["rows"])
            assert real32["item_ids"] == real["item_ids"]
            truth = _true_knn(served, x)
            rf.append(_recall(PrivateKNN.rerank(x, real["item_ids"], real["features"], 8), truth))
            r64.append(_recall(PrivateKNN.rerank_codes(x, real["item_ids"], real["codes"], pc, 8), truth))
            r32.append(_recall(PrivateKNN.rerank_codes(x, real["item_ids"], real32["codes"], pc, 8), truth))
        rec_f[eps], rec_64[eps], rec_32[eps] = float(np.mean(rf)), float(np.mean(r64)), float(np.mean(r32))
    print("nn_recall@8 re-ranked by features", rec_f, "by 64-B codes", rec_64, "by 32-B prefix", rec_32,
          f"candidate bytes per row: codes {KP * 64} / {KP * 32}, features {KP * 64 * 4} (float32)")
    for eps in EPSILONS:
        assert abs(rec_64[eps] - rec_f[eps]) <= 0.05, (eps, rec_64[eps], rec_f[eps])
        assert rec_32[eps] <= rec_64[eps] + 0.02


def test_codes_without_raw_features(served, coded, conn):
    import pm_vector.db as db
    from pm_vector.db.resolve.resolution import resolve

    name = coded["name"]
    req, _ = _requests(served, 4.0, n=1)[0]
    d = {**req.to_dict(), "collection": name}
    with pytest.raises(db.RawFeaturesNotAllowedError, match="allow_raw_features"):
        resolve(name, d, include_features=True, code_bytes=64, log=False)
    c = _Counting(db.connect())
    try:
        res = resolve(name, d, compact=True, conn=c)
    finally:
        c.close()
    assert c.shortlist_statements == 1
    ref = resolve(served["name"], req, compact=True, log=False)
    for row, rrow in zip(res["rows"], ref["rows"]):
        # no raw features; this collection stores no payloads: ids and codes only
        assert set(row) == {"row", "item_ids", "codes"} and row["codes"].shape == (KP, 32)
        np.testing.assert_array_equal(row["codes"], rrow["codes"])  # the same data: the same codes
    with pytest.raises(Exception, match="apply to class-rows and cell requests"):
        from pm_vector.client import PrivateMail
        from pm_vector.db.resolve.resolution import client_frame, public_anchor

        pa, info = public_anchor(name)
        pm_req, _ = PrivateMail(client_frame(name, pa, info), epsilon=1.0, _rng=0).request(
            served["split"].query[0][0], int(served["split"].query[1][0]), pa, collection=name)
        resolve(name, pm_req, compact=True, log=False)


def test_class_rows_answers_carry_kahm_class_scores(served, coded, conn):
    import pm_vector.db as db
    from pm_vector.db.kahm.roles import fit_kahm_models
    from pm_vector.db.resolve.resolution import explain_resolution, resolve

    name = coded["name"]
    req, _ = _requests(served, 4.0, n=1)[0]
    d = {**req.to_dict(), "collection": name}
    before = resolve(name, d, log=False)
    assert before["kahm"] is None and "class_scores" not in before["rows"][0]
    mid = fit_kahm_models(name, n_components=5, n_layers=2)["model_id"]
    stored = {int(i): (int(p), np.asarray(sc, np.float64)) for i, p, sc in conn.execute(
        "SELECT item_id, predicted, scores FROM pm_vector.kahm_item_scores WHERE model_id = %s", [mid]).fetchall()}
    assert len(stored) == 800
    # a raw model's outputs leave the database only where the collection opted in (as /kahm/distances)
    withheld = resolve(name, d, code_bytes=64, log=False)
    assert withheld["kahm"] is None and "class_scores" not in withheld["rows"][0]
    assert "kahm_item_scores" not in "\n".join(explain_resolution(name, d)["statement"])
    for opt_in in (name, served["name"]):
        conn.execute("UPDATE pm_vector.collections SET settings = jsonb_set(coalesce(settings, '{}'::jsonb), "
                     "'{kahm}', '{\"raw_distances\": true}') WHERE name = %s", [opt_in])
    conn.commit()
    c = _Counting(db.connect())
    try:
        res = resolve(name, d, code_bytes=64, conn=c, log=False)
    finally:
        c.close()
    assert c.shortlist_statements == 1  # codes and scores in the one statement
    assert res["kahm"] == {"model_id": mid, "classes": list(range(10))}
    for row, brow in zip(res["rows"], before["rows"]):  # every candidate of every row
        assert row["item_ids"] == brow["item_ids"] and row["codes"].shape == (KP, 64)
        assert len(row["predicted"]) == len(row["class_scores"]) == KP
        for iid, p, sc in zip(row["item_ids"], row["predicted"], row["class_scores"]):
            assert p == stored[iid][0]
            np.testing.assert_allclose(sc, stored[iid][1], rtol=1e-7)
    # with raw features on a collection that allows them, the columns shift: scores still the item's
    # (the last test of the module using `served`: its model stays until the collection is dropped)
    fit_kahm_models(served["name"], n_components=5, n_layers=2)
    both = resolve(served["name"], req, include_features=True, code_bytes=64, log=False)
    mid2 = both["kahm"]["model_id"]
    st2 = {int(i): int(p) for i, p in conn.execute(
        "SELECT item_id, predicted FROM pm_vector.kahm_item_scores WHERE model_id = %s", [mid2]).fetchall()}
    for row in both["rows"]:
        assert row["predicted"] == [st2[i] for i in row["item_ids"]]
        assert row["features"].shape == (KP, 64) and row["codes"].shape == (KP, 64)
    off = resolve(name, d, class_scores=False, log=False)
    assert off["kahm"] is None and "predicted" not in off["rows"][0]
    plan = "\n".join(explain_resolution(name, d)["statement"])
    assert "kahm_item_scores" in plan


def test_code_size_is_a_validated_collection_setting():
    from pm_vector.db.runs.class_rows import params
    from pm_vector.errors import InvalidInputError

    assert {k: params()[k] for k in ("code_bytes", "code_stages", "code_widths")} == {
        "code_bytes": 32, "code_stages": 2, "code_widths": (64, 96, 128, 160, 192, 256)}
    assert params({"class_rows": {"code_bytes": 16, "code_stages": 1}})["code_bytes"] == 16
    assert params({"class_rows": {"code_widths": [128, 64]}})["code_widths"] == (64, 128)
    for bad, msg in (({"code_bytes": 4}, r"code_bytes .* must be in 8\.\.256"),
                     ({"code_bytes": 264}, r"must be in 8\.\.256"),
                     ({"code_bytes": 48, "code_stages": 5}, "positive divisor of code_bytes"),
                     ({"code_bytes": "64"}, "must be an integer"),
                     ({"code_widths": [32]}, r"code_widths .* in \(32, 256\]"),
                     ({"code_widths": [64, 64]}, "distinct"),
                     ({"code_widths": [300]}, r"\(32, 256\]"),
                     ({"code_widths": "64"}, "code_widths")):
        with pytest.raises(InvalidInputError, match=msg):
            params({"class_rows": bad})
