"""Deleting items of a sharded collection (2 shards): one call erases them on the coordinator and on
every shard (prior, neighbour lists, hubs, fill ids, cells), and the cluster then answers exactly
as a single node with the same data after the same delete.

Both collections take the synchronous erasure (``settings={"delta": False}``): a sharded run keeps it
until shards take the delta's path (issue #36, item 5), and the two are compared on the same path; a
single node's default, the delta, has its own exhaustive test (``tests/db/test_db_delta.py``)."""


from __future__ import annotations

import os

import numpy as np
import psycopg

from conftest import _load

KP = 32
NAME = "cl_erase"
#: the erasure both nodes take here
SYNC_ERASURE = {"delta": False}


def _pair(local_cluster):
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db import postgres

    ds = load_dataset("digits")
    sp = split_dataset(ds, 800, 300, 150, 100, seed=0)
    coord = local_cluster.coordinator_url()
    single = local_cluster.standalone_database(coord)
    run = _load(NAME, sp, ds, SYNC_ERASURE)
    os.environ["PM_VECTOR_DATABASE_URL"] = single
    postgres.dispose_engines()
    try:
        _load(NAME, sp, ds, SYNC_ERASURE)
    finally:
        os.environ.pop("PM_VECTOR_DATABASE_URL", None)
        postgres.dispose_engines()
    return sp, run, coord, single


def _on(url, fn):
    from pm_vector.db import postgres

    os.environ["PM_VECTOR_DATABASE_URL"] = url
    postgres.dispose_engines()
    try:
        return fn()
    finally:
        os.environ.pop("PM_VECTOR_DATABASE_URL", None)
        postgres.dispose_engines()


def test_a_delete_reaches_every_shard_and_answers_as_a_single_node(local_cluster, node_urls):
    import pm_vector.db as db
    from pm_vector.client.cell_client import PrivateCellKNN
    from pm_vector.db.resolve.resolution import public_anchor, resolve
    from pm_vector.manifold.public_cells import PublicCells
    from pm_vector.privacy import secure_generator

    sp, run, coord, single = _pair(local_cluster)
    rid = run["run_id"]
    cells = PublicCells.from_dict(public_anchor(NAME)[1]["public_cells"])
    Xq, yq = sp.query
    reqs = []
    for eps, K in ((1.0, 2), (4.0, 8), (16.0, 16)):
        c = PrivateCellKNN(cells, eps, n_cells=K, shortlist=KP, collection=NAME)._inject_generator(secure_generator(5))
        reqs += [c.request(np.asarray(Xq[i], np.float32).astype(np.float64), int(yq[i]))[0] for i in range(4)]
    held = sorted({i for q in reqs for r in resolve(NAME, q, log=False)["rows"] for i in r["item_ids"]})
    with psycopg.connect(coord) as c:
        ext = [r[0] for r in c.execute("SELECT external_id FROM pm_vector.items WHERE id = ANY(%s) ORDER BY id",
                                       [held[::4][:30]]).fetchall()]
    out = db.delete_items(NAME, external_ids=ext)
    assert out["deleted"] == len(ext) and out["runs"] == [rid]
    _on(single, lambda: db.delete_items(NAME, external_ids=ext))
    with psycopg.connect(coord) as c:
        gone = [r[0] for r in c.execute("SELECT unnest(%s::bigint[])", [held[::4][:30]]).fetchall()]
        doc = c.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
        for t in ("items", "codes"):
            assert c.execute(f"SELECT count(*) FROM pm_vector.run_{rid}_{t} WHERE item_id = ANY(%s)",
                             [gone]).fetchone()[0] == 0
        assert c.execute("SELECT count(*) FROM pg_class WHERE relname LIKE %s AND relkind = 'f'",
                         [f"run_{rid}_%_at_%"]).fetchone()[0] == 0  # the erasure's foreign tables are gone
    for shard in doc["shards"]:
        with psycopg.connect(node_urls[shard]) as s:
            t = f"pm_vector.run_{rid}_"
            assert s.execute(f"SELECT count(*) FROM {t}prior WHERE item_id = ANY(%(g)s::bigint[]) OR nbrs && %(g)s::bigint[]",
                             {"g": gone}).fetchone()[0] == 0
            assert s.execute(f"SELECT count(*) FROM {t}neighbors WHERE item_id = ANY(%(g)s::bigint[]) OR neighbor_id = ANY(%(g)s::bigint[])",
                             {"g": gone}).fetchone()[0] == 0
            for q in (f"SELECT count(*) FROM {t}hubs WHERE item_id = ANY(%(g)s::bigint[])",
                      f"SELECT count(*) FROM {t}items WHERE item_id = ANY(%(g)s::bigint[])",
                      f"SELECT count(*) FROM {t}cells WHERE item_ids && %(g)s::bigint[]"):
                assert s.execute(q, {"g": gone}).fetchone()[0] == 0
            assert s.execute(f"SELECT count(*) FROM {t}items").fetchone()[0] == min(1000, 800 - len(gone))
    gset = set(gone)
    # the two nodes number their items from their own sequences (other tests may have used them first):
    # compare by position in the ingest, which was the same
    bases = []
    for url in (coord, single):
        with psycopg.connect(url) as c:
            bases.append(c.execute("SELECT min(i.id) FROM pm_vector.items i JOIN pm_vector.collections k "
                                   "ON k.id = i.collection_id WHERE k.name = %s", [NAME]).fetchone()[0])
    for q in reqs:
        got = resolve(NAME, q, log=False)["rows"]
        want = _on(single, lambda q=q: resolve(NAME, q, log=False)["rows"])
        assert [[int(i) - bases[0] for i in r["item_ids"]] for r in got] == \
            [[int(i) - bases[1] for i in r["item_ids"]] for r in want]
        assert not gset & {i for r in got for i in r["item_ids"]} and all(len(r["item_ids"]) == KP for r in got)
    db.drop_collection(NAME)
    _on(single, lambda: db.drop_collection(NAME))
