"""End to end on Fashion-MNIST: private queries resolved through SQL score as the in-memory pipeline.

Server items, anchor set, dummy pool and queries are disjoint stratified splits
(pm_vector.datasets.split_dataset). The server side runs on the embedded PostgreSQL:
ingest, anchor + dummy sets, the embedding job (anchor_frame_embed_fn), then every query is
built by a PrivateMail client from the collection's public anchor (client_frame) and resolved
by SQL (resolve: align + one pm_knn_batch statement). The in-memory reference is the
pm_vector.bench.privacy_bench pipeline with the same frame parameters and seeds (frame fit on
the anchors, items extended in memory, the same client seed, Kabsch-Umeyama, exact k-NN).

The comparison resolves with a wide HNSW beam (ef_search 1000, pgvector's largest), so that
it tests the server path rather than HNSW's approximation; the figures at the default beam
(ef_search 40, the one the latency benchmark times) are reported beside them
(``sql_default_ef_search``), with what client-side re-ranking of k' = 32 candidates by the
client's own raw features does to precision@8 (``rerank``).

The figures are printed (pytest -s) and written to $PM_VECTOR_E2E_OUT when set.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from pm_vector.datasets import DEFAULT_FASHION_MNIST_DIR, FASHION_MNIST_DIR_ENV

FM_DIR = os.environ.get(FASHION_MNIST_DIR_ENV) or str(DEFAULT_FASHION_MNIST_DIR)
pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(FM_DIR, "t10k-labels-idx1-ubyte.gz")),
                                reason=f"Fashion-MNIST is not installed at {FM_DIR} (apt-get install "
                                       "dataset-fashion-mnist, or set PM_VECTOR_FASHION_MNIST_DIR)")

SIZES = (10000, 1000, 500, 50)  # server items, anchors, dummy pool, queries
K, K_RERANK, EPS, SEED, EF_WIDE = 8, 32, 1.0, 0, 1000


@pytest.fixture(scope="module")
def figures(pm_home):
    import uuid

    import pm_vector.db as db

    cname = "e2e_fm_" + uuid.uuid4().hex[:8]
    try:
        yield _run(db, cname)
    finally:
        db.drop_collection(cname, missing_ok=True)


def _run(db, cname) -> dict:
    from pm_vector.bench.metrics import chance_recall_at_k, precision_at_k, recall_at_k
    from pm_vector.bench.privacy_bench import BenchConfig
    from pm_vector.client import PrivateMail, PublicAnchor
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.bench.metrics import rerank_precision
    from pm_vector.db.resolve.resolution import client_frame, public_anchor, resolve
    from pm_vector.manifold import AnchorFrame
    from pm_vector.alignment import align_request
    from pm_vector.neighbors import knn_search

    t0 = time.perf_counter()
    cfg = BenchConfig(epsilons=(EPS,), seed=SEED)  # privacy_bench's frame parameters
    ds = load_dataset("fashion-mnist")
    sp = split_dataset(ds, *SIZES, seed=SEED)
    Xs, ys = sp.server
    Xa, ya = sp.anchor
    Xd, yd = sp.dummy
    Xq, yq = sp.query
    # disjoint parts
    rows = [tuple(r) for part in (Xs, Xa, Xd, Xq) for r in part[:, ::97]]
    assert sum(len(p[1]) for p in (sp.server, sp.anchor, sp.dummy, sp.query)) == sum(SIZES)
    assert len(set(rows)) > 0.99 * len(rows)

    # ---- server: PostgreSQL
    db.create_collection(cname, ds.dim, ds.classes.tolist(), allow_raw_features=True)
    ids = db.ingest(cname, Xs, ys, external_ids=[f"fm{i}" for i in range(len(ys))])["item_ids"]
    db.register_anchor_set(cname, Xa, ya)
    db.register_anchor_set(cname, Xd, yd, role="dummy")
    run = db.run_embedding_job(cname, {"n_components": cfg.n_components}, cfg.seed, embed_fn=anchor_frame_embed_fn)
    assert run["n_items"] == len(ys) and run["items_missing"] == 0
    t_server = time.perf_counter() - t0

    # ---- client: public anchor + frame from the database, one request per query, resolved by SQL
    pa, info = public_anchor(cname)
    frame = client_frame(cname, pa, info)
    client = PrivateMail(frame, epsilon=EPS, delta=cfg.delta, dp_sigma=cfg.dp_sigma, dp_alpha=cfg.dp_alpha,
                         _rng=cfg.seed + 7)
    reqs, secrets = [], []
    t = time.perf_counter()
    for i in range(len(yq)):
        r, s = client.request(Xq[i], int(yq[i]), pa, collection=cname)
        reqs.append(r)
        secrets.append(s)
    client_s = time.perf_counter() - t
    id_pos = {int(v): j for j, v in enumerate(ids)}
    sql_rows, sql_dist, rerank_rows, resolve_ms = [], [], [], []
    for r, s in zip(reqs, secrets):
        # a wide HNSW beam (pgvector's largest ef_search): the SQL path against the exact in-memory k-NN
        res = resolve(cname, r.to_json(), k=K, ef_search=EF_WIDE)
        resolve_ms.append(res["timings_ms"]["total"])
        real = s.pick(res["rows"])
        sql_rows.append([id_pos[v] for v in real["item_ids"]])
        sql_dist.append(real["distances"])
        # the default beam (ef_search 40, what the latency benchmark measures); k' = 32 candidates with raw
        # features for client-side re-ranking, whose first 8 are the default k = 8 answer (same beam)
        rerank_rows.append(s.pick(resolve(cname, r, k=K_RERANK, include_features=True)["rows"]))
    sql_rows = np.asarray(sql_rows)
    default_rows = np.asarray([[id_pos[v] for v in rr["item_ids"][:K]] for rr in rerank_rows])
    t_sql = time.perf_counter() - t0

    # ---- in memory: privacy_bench's pipeline, same frame parameters and seeds
    mframe = AnchorFrame(cfg.n_components, seed=cfg.seed).fit(Xa, ya)
    np.testing.assert_allclose(mframe.anchor_embedding_, frame.anchor_embedding_, atol=1e-9)
    items = mframe.extend(Xs, ys)
    manchor = PublicAnchor(list(range(len(ya))), Xa, ya, Xd, yd)
    mclient = PrivateMail(mframe, epsilon=EPS, delta=cfg.delta, dp_sigma=cfg.dp_sigma, dp_alpha=cfg.dp_alpha,
                          _rng=cfg.seed + 7)
    # The in-memory client is the same deterministic function of the same public data and seed
    # as the database's client: checked on the first requests, whose copies are then used for all.
    for i in range(3):
        r, s = mclient.request(Xq[i], int(yq[i]), manchor)
        np.testing.assert_allclose(r.embedding, reqs[i].embedding, atol=1e-9)
        assert s == secrets[i]
    aligned = [align_request(r, pa.ids, mframe.anchor_embedding_) for r in reqs]
    mem = [knn_search(a, items, K) for a in aligned]
    mem_rows = np.asarray([s.pick(m) for m, s in zip(mem, secrets)])
    mem_dist = np.asarray([np.linalg.norm(items[s.pick(m)] - s.pick(a), axis=1)
                           for m, a, s in zip(mem, aligned, secrets)])

    sql_lab, mem_lab = ys[sql_rows], ys[mem_rows]
    freq = np.array([np.mean(ys == c) for c in np.unique(ys)])
    out = {"sizes": dict(zip(("server", "anchor", "dummy", "query"), SIZES)), "epsilon": EPS, "k": K,
           "n_components": cfg.n_components, "ef_search": EF_WIDE,
           "sql": {"recall_at_8": float(recall_at_k(sql_lab, yq)), "precision_at_8": float(precision_at_k(sql_lab, yq))},
           "sql_default_ef_search": {"recall_at_8": float(recall_at_k(ys[default_rows], yq)),
                                     "precision_at_8": float(precision_at_k(ys[default_rows], yq))},
           "in_memory": {"recall_at_8": float(recall_at_k(mem_lab, yq)),
                         "precision_at_8": float(precision_at_k(mem_lab, yq))},
           "chance": {"recall_at_8": float(chance_recall_at_k(freq, K)), "precision_at_8": float(np.sum(freq ** 2))},
           "same_top8_fraction": float(np.mean([len(set(a) & set(b)) / K for a, b in zip(sql_rows, mem_rows)])),
           # HNSW (SQL) vs exact (memory) 8th-neighbour distance: ties explain a different top-8 at ratio ~1
           "kth_distance_ratio_p50": float(np.median(np.asarray(sql_dist)[:, -1] / np.maximum(mem_dist[:, -1], 1e-12))),
           "rerank": rerank_precision(rerank_rows, Xq, yq, k=K),
           "resolve_ms_p50": float(np.median(resolve_ms)),
           "seconds": {"server": round(t_server, 1), "clients": round(client_s, 1),
                       "sql": round(t_sql - t_server - client_s, 1), "total": round(time.perf_counter() - t0, 1)},
           "load_average": [round(v, 2) for v in os.getloadavg()]}
    print("\nFashion-MNIST end to end:", json.dumps(out))
    if os.environ.get("PM_VECTOR_E2E_OUT"):
        with open(os.environ["PM_VECTOR_E2E_OUT"], "w") as f:
            json.dump(out, f, indent=1)

    return out


@pytest.mark.slow
def test_private_queries_through_sql_match_the_in_memory_benchmark(figures):
    out = figures
    for m in ("recall_at_8", "precision_at_8"):
        assert abs(out["sql"][m] - out["in_memory"][m]) <= 0.05, out
    # HNSW vs exact k-NN of the same aligned rows: neighbours as near (the item sets may differ by ties)
    assert out["kth_distance_ratio_p50"] <= 1.05, out
    # re-ranking keeps 8 of the same real row's 32 candidates
    assert out["rerank"]["candidates"] == K_RERANK and out["rerank"]["queries"] == SIZES[3]
    assert out["rerank"]["precision_at_8"] == out["sql_default_ef_search"]["precision_at_8"], out


def test_private_queries_through_sql_are_far_above_chance(figures):
    out = figures
    sql, dflt, chance = out["sql"], out["sql_default_ef_search"], out["chance"]
    # chance on 10 balanced classes: precision@8 0.1, recall@8 (at least one of 8 in the class) 0.57
    for r in (sql, dflt):
        assert r["precision_at_8"] >= chance["precision_at_8"] + 0.5, out
    # recall@8 over the 50 queries: the tuned ef_search path finds what the in-memory benchmark
    # finds (1.0 here); pgvector's default ef_search (40) is approximate and its HNSW build varies
    # (.80-.90 seen): at least .75, 2.6 binomial standard deviations above chance at n = 50
    assert sql["recall_at_8"] >= 0.85, out
    assert dflt["recall_at_8"] >= 0.75, out
