"""A sharded run takes the delta's write path (issue #36 item 5): a delete writes tombstones on the
coordinator and rewrites no shard row; from its commit on no answer holds a deleted item -- every
published location level and cell at eps 1, 4 and 16, the class-rows and cell fan-outs -- and the
cluster answers as a single node after the same writes; new items are placed in the coordinator's
delta; the merge leaves 0 rows of a deleted item in every table of every shard and of the
coordinator."""

from __future__ import annotations

import os

import numpy as np
import psycopg

from conftest import _load

KP = 32
NAME = "cl_delta"


def _on(url, fn):
    from pm_vector.db import postgres

    os.environ["PM_VECTOR_DATABASE_URL"] = url
    postgres.dispose_engines()
    try:
        return fn()
    finally:
        os.environ.pop("PM_VECTOR_DATABASE_URL", None)
        postgres.dispose_engines()


def _requests(X, y):
    """Cell requests (every published K) and class-rows requests at eps 1, 4 and 16."""
    from pm_vector.client.cell_client import PrivateCellKNN
    from pm_vector.client.query import PrivateKNN
    from pm_vector.db.resolve.resolution import class_frames, public_anchor
    from pm_vector.manifold.public_cells import PublicCells
    from pm_vector.privacy import secure_generator

    cells = PublicCells.from_dict(public_anchor(NAME)[1]["public_cells"])
    frames = class_frames(NAME)
    out = []
    for eps in (1.0, 4.0, 16.0):
        for K in cells.levels_:
            c = PrivateCellKNN(cells, eps, n_cells=int(K), shortlist=KP, collection=NAME)._inject_generator(
                secure_generator(int(K)))
            out += [c.request(X[i].astype(np.float64), int(y[i]))[0] for i in range(3)]
        c = PrivateKNN(frames, X[:60].astype(np.float64), y[:60], epsilon=eps, shortlist=KP,
                       collection=NAME)._inject_generator(secure_generator(7))
        out += [c.request(X[i].astype(np.float64), int(y[i]))[0] for i in range(3)]
    return out


def _every_location_answer(X, gone: set, n_left: int) -> int:
    """Every published level, every cell, eps 1 / 4 / 16: no answer holds a deleted item, each holds
    min(candidates, items left), and pm_location_shortlist ranks alike. Returns the answers checked."""
    from pm_vector.client.location import PrivateLocationKNN
    from pm_vector.db.postgres import connect
    from pm_vector.db.resolve.resolution import public_anchor, resolve
    from pm_vector.manifold.public_cells import PublicCells
    from pm_vector.protocol.location import LocationRequest
    from pm_vector.protocol.published_codes import unpack

    info = public_anchor(NAME)[1]
    cells = PublicCells.from_dict(info["public_locations"])
    pc = unpack(info["product_codes"], info["class_rows"]["codes"]["digest"])
    seen = 0
    with connect() as conn:
        for eps in (1.0, 4.0, 16.0):
            c = PrivateLocationKNN(cells, eps, n_items=int(info["class_rows"]["n_items"]), widths=pc.widths_,
                                   collection=NAME, max_bytes=4_000)
            base = c._inject_generator(np.random.default_rng(0)).request(X[0].astype(np.float64)).to_dict()
            for M in cells.levels_:
                for r in range(int(M)):
                    q = LocationRequest.from_dict({**base, "level": int(M), "report": r})
                    got = np.asarray(resolve(NAME, q, log=False)["item_ids"], np.int64)
                    assert not set(got.tolist()) & gone, (eps, M, r)
                    assert got.size == min(q.candidates, n_left), (eps, M, r)
                    sql = [v for (v,) in conn.execute(
                        "SELECT item_id FROM pm_vector.pm_location_shortlist(%s, %s, %s, %s, %s)",
                        [NAME, int(M), r, eps, q.candidates]).fetchall()]
                    assert sql == got.tolist(), (eps, M, r)
                    seen += 1
    return seen


def _rows_holding(url: str, ids: list[int]) -> dict[str, int]:
    """Every ``pm_vector.run_*`` table of the node at ``url`` (a shard's or the coordinator's, partitions
    and all): rows naming one of ``ids`` in an item column (``item_id``, ``neighbor_id``, ``nbrs``,
    ``item_ids``), per table that has any."""
    out = {}
    with psycopg.connect(url) as c:
        cols = c.execute("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = "
                         "'pm_vector' AND table_name LIKE 'run\\_%%' AND column_name = ANY(%s) ORDER BY 1, 2",
                         [["item_id", "neighbor_id", "nbrs", "item_ids"]]).fetchall()
        for table, col in cols:
            t, k = psycopg.sql.Identifier("pm_vector", table), psycopg.sql.Identifier(col)
            cond = (psycopg.sql.SQL("{} && %s::bigint[]") if col in ("nbrs", "item_ids")
                    else psycopg.sql.SQL("{} = ANY(%s::bigint[])")).format(k)
            n = c.execute(psycopg.sql.SQL("SELECT count(*) FROM {} WHERE {}").format(t, cond), [ids]).fetchone()[0]
            if n:
                out[f"{table}.{col}"] = int(n)
    return out


def test_a_sharded_run_takes_the_delta_and_the_merge_purges_every_shard(local_cluster, node_urls):
    import pm_vector.db as db
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.db.runs import delta
    from pm_vector.db.runs.jobs import anchor_frame_extend_fn

    ds = load_dataset("digits")
    sp = split_dataset(ds, 800, 300, 150, 100, seed=0)
    coord = local_cluster.coordinator_url()
    single = local_cluster.standalone_database(coord, "pm_single_delta")
    rid = _load(NAME, sp, ds)["run_id"]
    _on(single, lambda: _load(NAME, sp, ds))
    with psycopg.connect(coord) as c:
        doc = c.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    assert set(doc["shards"]) == {"shard0", "shard1"} and delta.takes_delta(doc)
    Xq, yq = sp.query
    X, y = sp.server
    reqs = _requests(Xq, yq)
    held = sorted({i for q in reqs for r in resolve(NAME, q, log=False)["rows"] for i in r["item_ids"]})
    with psycopg.connect(coord) as c:
        top = [int(v) for v in c.execute(f"SELECT item_ids[1:5] FROM pm_vector.run_{rid}_locations "
                                         "WHERE level = 0").fetchone()[0]]
        victims = sorted(set(held[::4][:30]) | set(top))  # answered items of both releases, top hubs
        ext = [r[0] for r in c.execute("SELECT external_id FROM pm_vector.items WHERE id = ANY(%s) ORDER BY id",
                                       [victims]).fetchall()]
    shards_before = {s: _rows_holding(node_urls[s], victims) for s in doc["shards"]}
    assert all(shards_before.values())  # the shards' prior, graph, hubs and cells list them

    # new items (placed in the coordinator's delta), then the deletes, the same on both nodes
    Xn = (X[:20] * 0.8 + X[20:40] * 0.2).astype(np.float32)
    new = db.ingest(NAME, Xn, y[:20], external_ids=[f"n{i}" for i in range(20)], embed_fn_extend=anchor_frame_extend_fn)
    assert new["placed"] == 20
    _on(single, lambda: db.ingest(NAME, Xn, y[:20], external_ids=[f"n{i}" for i in range(20)],
                                  embed_fn_extend=anchor_frame_extend_fn))
    out = db.delete_items(NAME, external_ids=ext)
    assert out["deleted"] == len(ext) and out["runs"] == [rid]
    _on(single, lambda: db.delete_items(NAME, external_ids=ext))
    with psycopg.connect(coord) as c:
        assert delta.tombstoned(c, rid).tolist() == victims  # the delta's path ...
        assert c.execute("SELECT count(DISTINCT item_id) FROM pm_vector.delta_entries WHERE run_id = %s",
                         [rid]).fetchone()[0] == 20
    # ... which rewrote no shard row: the deleted items' rows wait there for the merge, never answered
    assert {s: _rows_holding(node_urls[s], victims) for s in doc["shards"]} == shards_before

    gone = set(victims)
    n_left = len(y) - len(victims) + 20
    assert _every_location_answer(Xq, gone, n_left) > 0
    bases = []
    for url in (coord, single):
        with psycopg.connect(url) as c:
            bases.append(c.execute("SELECT min(i.id) FROM pm_vector.items i JOIN pm_vector.collections k "
                                   "ON k.id = i.collection_id WHERE k.name = %s", [NAME]).fetchone()[0])
    for q in reqs:  # the fan-outs filtered on the coordinator as one node filters its own lists
        got = resolve(NAME, q, log=False)["rows"]
        want = _on(single, lambda q=q: resolve(NAME, q, log=False)["rows"])
        assert not gone & {i for r in got for i in r["item_ids"]}
        assert [[int(i) - bases[0] for i in r["item_ids"]] for r in got] == \
            [[int(i) - bases[1] for i in r["item_ids"]] for r in want]

    res = db.merge(NAME)
    assert res["previous_run_id"] == rid and rid in res["dropped_runs"] and res["merged_tombstones"] == len(victims)
    with psycopg.connect(coord) as c:
        doc2 = c.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [res["run_id"]]).fetchone()[0]
        assert c.execute("SELECT count(*) FROM pm_vector.delta_tombstones WHERE item_id = ANY(%s)",
                         [victims]).fetchone()[0] == 0
        assert c.execute("SELECT count(*) FROM pm_vector.delta_entries WHERE run_id = %s",
                         [res["run_id"]]).fetchone()[0] == 0
    assert set(doc2["shards"]) == set(doc["shards"])
    for s in doc["shards"]:  # 0 rows of a deleted item in any table of any shard, or of the coordinator
        assert _rows_holding(node_urls[s], victims) == {}, s
    assert _rows_holding(coord, victims) == {}
    with psycopg.connect(coord) as c:  # the new items are in the new run's base on the shards
        new_ids = [int(i) for i in new["item_ids"]]
    assert sum(sum(_rows_holding(node_urls[s], new_ids).values()) for s in doc2["shards"]) > 0
    assert _every_location_answer(Xq, gone, n_left) > 0
    db.drop_collection(NAME)
    _on(single, lambda: db.drop_collection(NAME))
