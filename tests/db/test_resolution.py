"""Resolution of PrivateMail requests in PostgreSQL: public anchor, client frame, resolve, bad input,
the plan of resolve's statement, release-only requests, client-side re-ranking."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pmtest_plans import reads_by_index

K = 8


@pytest.fixture(scope="module")
def served(pm_home):
    """digits: a collection with an AnchorFrame run (8 dims), anchor set, dummy pool; a client frame."""
    import pm_vector.db as db
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.db.resolve.resolution import client_frame, public_anchor

    ds = load_dataset("digits")
    sp = split_dataset(ds, 800, 300, 150, 20, seed=0)
    name = "res_served"
    db.drop_collection(name, missing_ok=True)
    db.create_collection(name, ds.dim, ds.classes.tolist())
    Xs, ys = sp.server
    ids = db.ingest(name, Xs, ys, external_ids=[f"d{i}" for i in range(len(ys))],
                    payloads=[{"n": i} for i in range(len(ys))])["item_ids"]
    a = db.register_anchor_set(name, *sp.anchor)
    db.register_anchor_set(name, *sp.dummy, role="dummy")
    run = db.run_embedding_job(name, {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn)
    pa, info = public_anchor(name)
    frame = client_frame(name, pa, info)
    yield {"name": name, "split": sp, "ids": ids, "run": run, "anchor_set_id": a["anchor_set_id"], "pa": pa,
           "info": info, "frame": frame}
    db.drop_collection(name, missing_ok=True)


def _request(served, i=0, seed=11, **kw):
    from pm_vector.client import PrivateMail

    Xq, yq = served["split"].query
    pm = PrivateMail(served["frame"], epsilon=1.0, _rng=seed, **kw)
    return pm.request(Xq[i], int(yq[i]), served["pa"], collection=served["name"])


def _log_count(conn) -> int:
    return conn.execute("SELECT count(*) FROM pm_vector.request_log").fetchone()[0]


def test_public_anchor_and_client_frame(served):
    pa, info = served["pa"], served["info"]
    s = served["anchor_set_id"]
    assert info["anchor_set_id"] == s == served["run"]["anchor_set_id"]
    assert pa.ids[:2] == [f"{s}:0", f"{s}:1"] and len(pa.ids) == 300
    assert info["run_id"] == served["run"]["run_id"] and info["seed"] == 3 and info["params"] == {"n_components": 8}
    assert info["anchor_embedding"].shape == (300, 8) and pa.dummy_features.shape[0] == 150
    assert served["frame"].reproduction_error_ <= 1e-6
    np.testing.assert_allclose(served["frame"].anchor_embedding_, info["anchor_embedding"], atol=1e-6)


def test_client_frame_refuses_a_run_it_cannot_rebuild(db, cname):
    from dbtest_helpers import data, make_embed_fn

    from pm_vector.db.errors import FrameMismatchError
    from pm_vector.db.resolve.resolution import client_frame

    X, y = data(60, 5, 3)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    db.create_collection(cname, 5, [0, 1, 2])
    db.ingest(cname, X, y)
    db.register_anchor_set(cname, X[:20], y[:20])
    db.register_anchor_set(cname, X[20:30], y[20:30], role="dummy")
    db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())  # a random projection, not an AnchorFrame
    with pytest.raises(FrameMismatchError, match="not built with an AnchorFrame"):
        client_frame(cname)
    # an AnchorFrame run whose stored embedding was produced otherwise: clear error, not a wrong frame
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    def tampered(ax, ay, ix, iy, params, seed, progress):
        a, i = anchor_frame_embed_fn(ax, ay, ix, iy, params, seed, progress)
        return a + 1e-3, i

    db.run_embedding_job(cname, {"n_components": 3}, 1, embed_fn=tampered)
    with pytest.raises(FrameMismatchError, match="differs from the stored anchor embedding"):
        client_frame(cname)


def test_resolve_answers_every_row_in_one_statement_and_logs_only_the_release(served, conn):
    from pm_vector.bench.latency import _CountingConn
    from pm_vector.db import connect, list_requests
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.alignment import align_request

    req, secret = _request(served)
    text = req.to_json()
    before = _log_count(conn)
    c = _CountingConn(connect())
    try:
        res = resolve(served["name"], text, k=K, conn=c)
    finally:
        c.close()
    assert c.knn_statements == 1  # all C rows answered by one statement
    assert _log_count(conn) == before + 1
    C = req.n_query_rows
    assert res["n_query_rows"] == C == 10 and len(res["rows"]) == C and res["run_id"] == served["run"]["run_id"]
    # the same as one knn_batch of the aligned rows
    import pm_vector.db as db

    aligned = align_request(req, served["pa"].ids, served["info"]["anchor_embedding"])
    ref = db.knn_batch(served["name"], aligned, K)
    for i, row in enumerate(res["rows"]):
        assert row["item_ids"] == ref["item_ids"][i].tolist()
        assert row["labels"] == ref["labels"][i].tolist()
        assert row["external_ids"] == ref["external_ids"][i]
        np.testing.assert_allclose(row["distances"], ref["distances"][i], rtol=1e-6)
        pos = {int(v): j for j, v in enumerate(served["ids"])}
        assert row["payloads"] == [{"n": pos[v]} for v in row["item_ids"]]
        assert "features" not in row
    real = secret.pick(res["rows"])
    assert np.mean(np.asarray(real["labels"]) == secret.label) >= 0.5
    log = list_requests(served["name"], limit=1)[0]
    assert log["id"] == res["request_log_id"] and log["status"] == "ok" and log["row_count"] == C * K
    assert log["run_id"] == served["run"]["run_id"] and log["duration_ms"] > 0
    assert log["request"] == json.loads(text)  # exactly what the client released, nothing else
    # a request object resolves the same (and is logged in the same form)
    res2 = resolve(served["name"], req, k=K)
    assert [r["item_ids"] for r in res2["rows"]] == [r["item_ids"] for r in res["rows"]]
    assert list_requests(served["name"], limit=1)[0]["request"] == json.loads(text)


def test_bad_input_is_refused_clearly_and_nothing_is_written(served, db, conn, cname):
    from pm_vector.client import PrivateMailRequest
    from pm_vector.db.errors import AnchorIdMismatchError
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.errors import RequestError
    from pm_vector.errors import AlignmentError, InvalidInputError
    from pm_vector.manifold import AnchorFrame

    name = served["name"]
    req, _ = _request(served)
    d = req.to_dict()
    before = _log_count(conn)

    def refused(exc, match, request, collection=name, **kw):
        with pytest.raises(exc, match=match):
            resolve(collection, request, **kw)
        assert _log_count(conn) == before

    refused(db.CollectionNotFoundError, "unknown collection 'no_such_collection'", req, "no_such_collection")
    db.create_collection(cname, 64, list(range(10)))
    refused(db.NoActiveRunError, f"collection '{cname}' has no active embedding run", req, cname)
    # anchor ids of another anchor set, in another order, or too few
    s = served["anchor_set_id"]
    refused(AnchorIdMismatchError, "do not match the anchor set", {**d, "anchor_ids": [f"{s + 1000}:{i}" for i in range(300)]})
    refused(AnchorIdMismatchError, "first difference at position 0", {**d, "anchor_ids": d["anchor_ids"][::-1]})
    short = {**d, "anchor_ids": d["anchor_ids"][:-1], "embedding": d["embedding"][:-1]}
    refused(AnchorIdMismatchError, "the request has 299", short)
    # wrong embedding dimension
    refused(db.DimensionMismatchError, "dimension 7, but .* embeds in 8",
            {**d, "embedding": [r[:7] for r in d["embedding"]]})
    # NaN / inf: in JSON text, in a dict, in a request object changed after it was built
    text = req.to_json()
    bad = json.loads(text)
    bad["embedding"][3][2] = float("nan")
    refused(InvalidInputError, "NaN or infinite", json.dumps(bad))
    bad["embedding"][3][2] = float("inf")
    refused(InvalidInputError, "NaN or infinite", bad)
    obj = PrivateMailRequest.from_dict(d)
    obj.embedding[0, 0] = np.nan
    refused(RequestError, "NaN or infinite values .first at row 0", obj)
    # too many query rows, malformed, k
    refused(RequestError, "10 query rows; at most 5", req, max_query_rows=5)
    refused(InvalidInputError, "expected 12 query rows", {**d, "n_query_rows": 12})
    refused(RequestError, "not valid JSON", text[:-2])
    refused(RequestError, "unsupported request format", {**d, "format": "something/9"})
    refused(InvalidInputError, "k must be an integer in 1..1000", req, k=0)
    refused(RequestError, "built for collection 'elsewhere'", {**d, "collection": "elsewhere"})
    refused(db.RawFeaturesNotAllowedError, "allow_raw_features is false", req, include_features=True)
    # a request built on another frame (other seed) does not align
    Xa, ya = served["split"].anchor
    foreign = AnchorFrame(8, seed=12345).fit(Xa, ya)
    from pm_vector.client import PrivateMail

    Xq, yq = served["split"].query
    freq, _ = PrivateMail(foreign, epsilon=1.0, _rng=1).request(Xq[0], int(yq[0]), served["pa"])
    refused(AlignmentError, "do not match the collection's anchor frame", freq)
    assert conn.execute("SELECT count(*) FROM pm_vector.request_log WHERE status = 'error'").fetchone()[0] == 0


def test_explain_shows_the_hnsw_index_in_resolutions_statement(served):
    from pm_vector.db.resolve.resolution import explain_resolution

    req, _ = _request(served)
    plans = explain_resolution(served["name"], req.to_json(), k=K)
    rid = served["run"]["run_id"]
    inner = "\n".join(plans["knn"])
    assert f"Index Scan using run_{rid}_items_hnsw on run_{rid}_items" in inner
    assert "Order By: (embedding <-> q.vec)" in inner and "Function Scan on unnest q" in inner
    assert "Seq Scan" not in inner
    outer = "\n".join(plans["statement"])
    assert "Function Scan on pm_knn_batch b" in outer and reads_by_index(outer, "items_pkey")
    assert "Seq Scan on run_" not in outer and "Seq Scan on items" not in outer


def test_release_only_requests_give_the_same_answer_for_the_same_seed(served, conn):
    from pm_vector.db import list_requests
    from pm_vector.client.release import RELEASE_FORMAT, ReleaseOnlyPrivateMail, ReleaseRequest
    from pm_vector.db.resolve.resolution import post_process_release, resolve

    Xq, yq = served["split"].query
    for i, seed in ((1, 5), (2, 6)):
        full, s1 = _request(served, i=i, seed=seed)
        rel, s2 = ReleaseOnlyPrivateMail(served["frame"], epsilon=1.0, _rng=seed).request_release(
            Xq[i], int(yq[i]), served["pa"], collection=served["name"])
        assert s1 == s2  # same dummies and shuffle
        assert rel.release.shape == full.embedding.shape and rel.query_labels == list(s1.row_labels)
        text = rel.to_json()
        assert json.loads(text)["format"] == RELEASE_FORMAT and "embedding" not in json.loads(text)
        # the server's post-processing reproduces the client's
        pp = post_process_release(served["name"], text)
        np.testing.assert_allclose(pp.query_rows, full.query_rows, atol=1e-9)
        a = resolve(served["name"], full, k=K)
        b = resolve(served["name"], text, k=K)
        assert b["release_only"] and not a["release_only"]
        assert [r["item_ids"] for r in a["rows"]] == [r["item_ids"] for r in b["rows"]]
        np.testing.assert_allclose([r["distances"] for r in a["rows"]], [r["distances"] for r in b["rows"]],
                                   atol=1e-6)
        assert list_requests(served["name"], limit=1)[0]["request"]["format"] == RELEASE_FORMAT
    # bad release requests: clear errors, nothing written
    before = _log_count(conn)
    d = json.loads(text)
    for bad, match in (({**d, "query_labels": [99] + d["query_labels"][1:]}, "not classes of the run"),
                       ({**d, "n_post_iter": 10**6}, "n_post_iter must be an integer in 0..2000"),
                       ({**d, "query_labels": d["query_labels"][:-1]}, "expected 9 query rows"),
                       ({**d, "q_rms": 0.0}, "q_rms must be positive")):
        with pytest.raises(Exception, match=match):
            resolve(served["name"], bad, k=K)
    assert _log_count(conn) == before
    assert ReleaseRequest.from_dict(d).n_query_rows == 10


def test_rerank_orders_candidates_by_the_clients_raw_features():
    from pm_vector.bench.metrics import rerank_precision
    from pm_vector.client.query import rerank

    q = np.array([1.0, 0.0])
    cands = np.array([[0.0, 1.0], [1.0, 0.1], [0.9, 0.0], [-1.0, 0.0]])
    assert rerank(q, cands).tolist() == [2, 1, 0, 3]
    assert rerank(q, cands, 2).tolist() == [2, 1]
    res = [{"labels": [0, 1, 1, 0], "features": cands}]
    out = rerank_precision(res, [q], [1], k=2)
    assert out == {"precision_at_2": 0.5, "precision_at_2_reranked": 1.0, "candidates": 4, "queries": 1}
