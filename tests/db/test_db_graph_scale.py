"""The embedding job at scale: the approximate (faiss HNSW) neighbour graph above a size threshold,
its recall against the exact graph, a job forced onto it serving resolves through PostgreSQL, and
the streamed reading (binary COPY decoded in blocks) and batched hub counts giving the unbatched
results."""

from __future__ import annotations

import numpy as np
import pytest


def _clustered(n, dim, seed=0):
    from pm_vector.bench.latency import clustered

    return clustered(n, dim, 100, seed=seed)


def _recall(a, b) -> float:
    return float(np.mean([len(set(a[i].tolist()) & set(b[i].tolist())) / a.shape[1] for i in range(a.shape[0])]))


def test_the_graph_method_rule():
    from pm_vector.errors import InvalidInputError
    from pm_vector.neighbors import EXACT_MAX_ITEMS, graph_method

    assert graph_method(EXACT_MAX_ITEMS) == "exact" and graph_method(EXACT_MAX_ITEMS + 1) == "ivf"
    assert graph_method(5000, "auto", 4999) == "ivf" and graph_method(5000, "auto", 5000) == "exact"
    assert graph_method(10, "hnsw") == "hnsw" and graph_method(10**7, "exact") == "exact"
    assert graph_method(10, "ivf") == "ivf"
    with pytest.raises(InvalidInputError, match="graph method"):
        graph_method(10, "annoy")


@pytest.mark.parametrize("method", ["auto", "hnsw"])
def test_the_approximate_graph_recalls_the_exact_one(method):
    """Forced onto the approximate path at N = 5000 (threshold below N; auto: the blocked graph),
    the graph holds >= 95 % of every item's exact 16 nearest other items; below the threshold it is
    the exact graph itself."""
    from pm_vector.neighbors import knn_search, neighbor_graph

    X, _ = _clustered(5000, 32, seed=1)
    exact = neighbor_graph(X, 16, method="exact")
    # the exact path is the old computation: knn_search of g + 1, the row itself dropped
    ref = knn_search(X, X, 17)
    assert all(i not in exact[i] and set(exact[i]) <= set(ref[i]) for i in range(0, 5000, 97))
    np.testing.assert_array_equal(neighbor_graph(X, 16), exact)  # auto, 5000 <= threshold: exact
    approx = neighbor_graph(X, 16, method=method, exact_max_items=1000)  # above the threshold
    assert approx.shape == (5000, 16) and approx.dtype == np.int64
    assert not (approx == np.arange(5000)[:, None]).any()  # never the row itself
    assert all(len(set(r.tolist())) == 16 for r in approx)  # no repeats
    rec = _recall(approx, exact)
    print(f"{method} graph recall against exact, N = 5000, d = 32, g = 16: {rec:.4f}")
    assert rec >= 0.95


def test_hub_counts_in_batches_and_no_float64_copy(monkeypatch):
    """The shortlist's fit keeps float32 items as they are (the graph gets the same array, no copy)
    and its hub counts summed over batches of 7 rows equal the unbatched counts."""
    import pm_vector.shortlist as sl
    from pm_vector.manifold.class_frames import ClassFrames

    X, y = _clustered(600, 16, seed=2)
    y = y % 5
    frames = ClassFrames(3, 0.9).fit(X[:200].astype(np.float64), y[:200])
    seen = []
    real = sl.neighbor_graph

    def spy(Xg, g, **kw):
        seen.append((Xg.dtype, np.shares_memory(Xg, X)))
        return real(Xg, g, **kw)

    monkeypatch.setattr(sl, "neighbor_graph", spy)
    ps = sl.PosteriorShortlist(8).fit(frames, X, y)
    assert seen == [(np.float32, True)]
    monkeypatch.setattr(sl, "HUB_BATCH", 7)
    ps7 = sl.PosteriorShortlist(8).fit(frames, X, y)
    for c in frames.classes_:
        idx = np.flatnonzero(y == c)
        want = np.bincount(ps.neighbors_[idx].ravel(), minlength=600).astype(np.float64)
        np.testing.assert_array_equal(ps.hubs_[int(c)], want)
        np.testing.assert_array_equal(ps7.hubs_[int(c)], want)
        np.testing.assert_array_equal(ps7.prior_[int(c)][1], ps.prior_[int(c)][1])
    # the float64 fit gives the same graph, prior and hubs
    ps64 = sl.PosteriorShortlist(8).fit(frames, X.astype(np.float64), y)
    np.testing.assert_array_equal(ps64.neighbors_, ps.neighbors_)
    for c in frames.classes_:
        np.testing.assert_array_equal(ps64.hubs_[int(c)], ps.hubs_[int(c)])
        np.testing.assert_array_equal(ps64.prior_[int(c)][1], ps.prior_[int(c)][1])


def test_streamed_copy_equals_the_whole_stream(db, conn, cname):
    """copy_out_columns decodes the stream in blocks (here 1,000 bytes: rows split across blocks)
    into arrays sized by a hint (here too small: grown) and gives what decode() of the whole stream
    gives; the job's item reader (_load_items) gives the rows as ingested."""
    from pm_vector.db import _binary
    from pm_vector.db.core.collection import collection_row, load_items

    X, y = _clustered(700, 24, seed=3)
    db.create_collection(cname, 24, list(range(100)))
    ids = np.asarray(db.ingest(cname, X, y)["item_ids"])
    cid = db.collection_info(cname)["id"]
    cols = [("id", "int8", 0), ("label", "int8", 0), ("features", "vector", 24)]
    q = f"SELECT id, label, features FROM pm_vector.items WHERE collection_id = {cid} ORDER BY id"
    whole = _binary.decode(cols, _binary.copy_out(conn, q))
    for block, hint in ((1000, 10), (1 << 22, 700), (37, 0)):
        got = _binary.copy_out_columns(conn, q, cols, hint, block=block)
        for k in whole:
            np.testing.assert_array_equal(got[k], whole[k])
            assert got[k].dtype == whole[k].dtype
    empty = _binary.copy_out_columns(conn, q.replace("ORDER BY", "AND false ORDER BY"), cols, 5, block=100)
    assert empty["features"].shape == (0, 24) and empty["id"].shape == (0,)
    with db.connect() as c2:
        items = load_items(c2, collection_row(c2, cname))
    np.testing.assert_array_equal(items["id"], np.sort(ids))
    np.testing.assert_array_equal(items["features"], X[np.argsort(ids)])
    assert items["features"].dtype == np.float32


@pytest.mark.parametrize("method", ["ivf", "hnsw"])
def test_a_job_forced_onto_the_approximate_graph_serves_resolves(db, conn, cname, method):
    """A collection whose class-rows setting forces an approximate graph: the job records it, the stored
    graph recalls >= 95 % of the exact one, the hub counts are those of the stored graph, and a
    client's request is resolved through PostgreSQL (the SQL shortlist and resolve())."""
    from pm_vector.client.query import PrivateKNN
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.db.resolve.resolution import public_anchor, resolve
    from pm_vector.manifold.class_frames import ClassFrames
    from pm_vector.neighbors import neighbor_graph

    X, y = _clustered(3000 + 400 + 200 + 5, 32, seed=4)
    y = y // 10
    Xs, ys, Xa, ya, Xd, yd, Xq, yq = (X[:3000], y[:3000], X[3000:3400], y[3000:3400], X[3400:3600], y[3400:3600],
                                      X[3600:], y[3600:])
    db.create_collection(cname, 32, list(range(10)), settings={"class_rows": {"graph": method}})
    ids = np.asarray(db.ingest(cname, Xs, ys)["item_ids"])
    db.register_anchor_set(cname, Xa, ya)
    db.register_anchor_set(cname, Xd, yd, role="dummy")
    run = db.run_embedding_job(cname, {"n_components": 8}, 1, embed_fn=anchor_frame_embed_fn)
    rid = run["run_id"]
    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    assert doc["status"] == "ready" and doc["graph"] == method and doc["graph_method"] == method
    # the blocked graph's figures of the raw data are in the run's (server-side) timings, not in the
    # published document
    tm = db.run_info(rid)["timings"]
    assert not any("probe" in k or "recall" in k for k in doc)
    if method == "ivf":
        assert tm["class_rows.graph_probe"] >= 8 and 0.0 < tm["class_rows.graph_sample_recall"] <= 1.0
    else:
        assert "class_rows.graph_probe" not in tm
    pos = {int(v): i for i, v in enumerate(ids)}
    stored = np.full((3000, 16), -1)
    for iid, lst in conn.execute(f"SELECT item_id, array_agg(neighbor_id) FROM pm_vector.run_{rid}_neighbors "
                                 "GROUP BY item_id").fetchall():
        stored[pos[iid]] = [pos[v] for v in lst]
    assert (stored >= 0).all()
    rec = _recall(stored, neighbor_graph(Xs, 16, method="exact"))
    print(f"stored {method} graph recall against exact (N = 3000): {rec:.4f}")
    assert rec >= 0.95
    # the hub counts are those of the stored graph
    for lab, iid, h in conn.execute(f"SELECT label, item_id, hub FROM pm_vector.run_{rid}_hubs").fetchall()[:300]:
        assert h == np.sum(stored[ys == lab] == pos[iid])
    pa, info = public_anchor(cname)
    client = PrivateKNN(ClassFrames.from_dict(info["class_frames"]), pa.dummy_features, pa.dummy_labels,
                        epsilon=4.0, shortlist=32)
    req, _ = client.request(Xq[0].astype(np.float64), int(yq[0]))
    sql = conn.execute("SELECT row_index, item_id FROM pm_vector.pm_shortlist(%s, %s::float8[], %s::float8[], %s)",
                       [cname, req.rows.tolist(), list(req.sigmas), 32]).fetchall()
    assert sorted({r for r, _ in sql}) == list(range(1, 11)) and len(sql) == 10 * 32
    res = resolve(cname, req, log=False)
    assert len(res["rows"]) == 10 and all(len(r["item_ids"]) == 32 for r in res["rows"])
    assert all(set(r["item_ids"]) <= set(ids.tolist()) for r in res["rows"])
    # a job that forces the exact graph on the same collection records it
    run2 = db.run_embedding_job(cname, {"n_components": 8}, 1, embed_fn=anchor_frame_embed_fn,
                                class_rows={"graph": "exact"})
    doc2 = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s",
                        [run2["run_id"]]).fetchone()[0]
    assert doc2["graph_method"] == "exact"


def test_bad_graph_settings_are_refused(db, cname):
    from pm_vector.db.runs.class_rows import params
    from pm_vector.errors import InvalidInputError

    assert params()["graph"] == "auto" and params({"class_rows": {"graph": "hnsw"}})["graph"] == "hnsw"
    assert params({"class_rows": {"graph": "ivf"}})["graph"] == "ivf"
    for bad in ({"graph": "annoy"}, {"graph_exact_max_items": -1}, {"graph_exact_max_items": 1.5},
                {"graph_exact_max_items": True}):
        with pytest.raises(InvalidInputError):
            params(None, bad)
