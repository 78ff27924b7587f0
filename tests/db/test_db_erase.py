"""Deleting items (pm_vector.db.delete_items): one transaction erases them from every run table of
the active run and of the runs kept for switching back; the refilled class-rows graph is the graph a
fresh job fits on the remaining items; no answer (class rows, cells, every level, eps) holds a deleted
id and every answer keeps its shape; a delete during a job reaches the new run before it switches on;
raw KAHM models stop serving."""

from __future__ import annotations


import numpy as np
import pytest

KP = 24


def _collection(db, name, n=500, d=6, seed=3, keep_previous=1, delta=False):
    """A collection of ``n`` items and one job; ``delta`` False: every write rewrites the run's rows in its
    own transaction (the erasure these tests check; tests/db/test_db_delta.py: the delta's tombstones)."""
    from dbtest_helpers import make_embed_fn

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    X = rng.normal(size=(n, d)) + 2.0 * np.eye(d)[y]
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    db.create_collection(name, d, [0, 1, 2], settings={"keep_previous_runs": keep_previous, "delta": delta})
    ids = np.asarray(db.ingest(name, X, y, external_ids=[f"e{i}" for i in range(n)])["item_ids"])
    rng2 = np.random.default_rng(seed + 1)
    A = rng2.normal(size=(90, d)) + 2.0 * np.eye(d)[np.arange(90) % 3]
    A = (A / np.linalg.norm(A, axis=1, keepdims=True)).astype(np.float32)
    db.register_anchor_set(name, A, np.arange(90) % 3)
    db.register_anchor_set(name, A[:30], np.arange(30) % 3, role="dummy")
    run = db.run_embedding_job(name, {"k": 3}, 1, embed_fn=make_embed_fn())
    return X, y, ids, run["run_id"]


def _tables(conn, rid):
    t = f"pm_vector.run_{rid}_"
    return {
        "prior": conn.execute(f"SELECT item_id, label, nbrs, nhub FROM {t}prior ORDER BY item_id").fetchall(),
        "neighbors": conn.execute(f"SELECT item_id, neighbor_id FROM {t}neighbors ORDER BY 1, 2").fetchall(),
        "hubs": conn.execute(f"SELECT label, item_id, hub FROM {t}hubs ORDER BY 1, 2").fetchall(),
        "items": [r[0] for r in conn.execute(f"SELECT item_id FROM {t}items ORDER BY 1").fetchall()],
        "codes": [r[0] for r in conn.execute(f"SELECT item_id FROM {t}codes ORDER BY 1").fetchall()],
    }


def _ids_in_cells(conn, rid):
    return {int(i) for (a,) in conn.execute(f"SELECT item_ids FROM pm_vector.run_{rid}_cells").fetchall() for i in a}


def _cell_requests(db, name, X, y, n=4):
    from pm_vector.client.cell_client import PrivateCellKNN
    from pm_vector.db.resolve.resolution import public_anchor
    from pm_vector.manifold.public_cells import PublicCells
    from pm_vector.privacy import secure_generator

    cells = PublicCells.from_dict(public_anchor(name)[1]["public_cells"])
    out = []
    for eps in (1.0, 4.0, 16.0):
        for K in cells.levels_:
            c = PrivateCellKNN(cells, eps, n_cells=K, shortlist=KP, collection=name)._inject_generator(
                secure_generator(int(K)))
            out += [c.request(X[i].astype(np.float64), int(y[i]))[0] for i in range(n)]
    return out


def _row_requests(name, X, y, n=4):
    from pm_vector.client.query import PrivateKNN
    from pm_vector.db.resolve.resolution import class_frames
    from pm_vector.privacy import secure_generator

    frames = class_frames(name)
    out = []
    for eps in (1.0, 4.0, 16.0):
        c = PrivateKNN(frames, X[:60].astype(np.float64), y[:60], epsilon=eps, shortlist=KP,
                       collection=name)._inject_generator(secure_generator(7))
        out += [c.request(X[i].astype(np.float64), int(y[i]))[0] for i in range(n)]
    return out


def test_delete_erases_every_run_table_and_the_graph_is_a_fresh_jobs(db, cname, conn):
    from dbtest_helpers import make_embed_fn

    from pm_vector.db.resolve.resolution import resolve

    X, y, ids, rid = _collection(db, cname)
    cell_reqs = _cell_requests(db, cname, X, y)
    row_reqs = _row_requests(cname, X, y)
    before = [resolve(cname, r, log=False)["rows"] for r in cell_reqs + row_reqs]
    hit = sorted({i for rows in before for r in rows for i in r["item_ids"]})
    gone = np.array(hit[::3][:25], dtype=np.int64)  # items the answers held
    out = db.delete_items(cname, item_ids=gone.tolist())
    assert out["deleted"] == gone.size and out["runs"] == [rid]
    t = _tables(conn, rid)
    erased = set(gone.tolist())
    for name in ("items", "codes"):
        assert not erased & set(t[name])
    assert not erased & {r[0] for r in t["prior"]} and not erased & {i for r in t["prior"] for i in r[2]}
    assert not erased & {v for r in t["neighbors"] for v in r}
    assert not erased & {r[1] for r in t["hubs"]}
    assert not erased & _ids_in_cells(conn, rid)
    assert conn.execute("SELECT count(*) FROM pm_vector.items WHERE id = ANY(%s)", [gone.tolist()]).fetchone()[0] == 0
    # no answer holds a deleted item, every answer keeps its shape (k' per row)
    for req, old in zip(cell_reqs + row_reqs, before):
        rows = resolve(cname, req, log=False)["rows"]
        assert [len(r["item_ids"]) for r in rows] == [len(r["item_ids"]) for r in old]
        assert not erased & {i for r in rows for i in r["item_ids"]}
    # the refilled graph, hubs and prior are those a fresh job fits on the remaining items
    fresh = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())["run_id"]
    t2 = _tables(conn, fresh)
    assert t["neighbors"] == t2["neighbors"]
    assert t["hubs"] == t2["hubs"]
    assert [(a, b, list(c), list(d)) for a, b, c, d in t["prior"]] == \
        [(a, b, list(c), list(d)) for a, b, c, d in t2["prior"]]
    doc = lambda r: conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [r]).fetchone()[0]
    assert doc(rid)["class_sizes"] == doc(fresh)["class_sizes"] and doc(rid)["graph_version"] == 1


def test_delete_by_external_id_reaches_the_kept_run_and_refuses_unknown_ids(db, cname, conn):
    from dbtest_helpers import make_embed_fn

    X, y, ids, r1 = _collection(db, cname, n=300)
    r2 = db.run_embedding_job(cname, {"k": 3}, 2, embed_fn=make_embed_fn())["run_id"]  # r1 kept for switching back
    with pytest.raises(db.ItemNotFoundError, match="nothing was deleted"):
        db.delete_items(cname, external_ids=["e1", "nope"])
    assert conn.execute("SELECT count(*) FROM pm_vector.items WHERE external_id = 'e1'").fetchone()[0] == 1
    with pytest.raises(Exception, match="exactly one"):
        db.delete_items(cname, item_ids=[1], external_ids=["e1"])
    out = db.delete_items(cname, external_ids=["e1", "e2", "nope"], missing_ok=True)
    assert out["deleted"] == 2 and sorted(out["runs"]) == sorted([r1, r2])
    for rid in (r1, r2):
        t = _tables(conn, rid)
        assert not {int(ids[1]), int(ids[2])} & (set(t["items"]) | {r[0] for r in t["prior"]})


def test_a_delete_during_a_job_reaches_the_new_run_before_it_switches_on(db, cname, conn):
    from dbtest_helpers import make_embed_fn

    X, y, ids, r1 = _collection(db, cname, n=300)
    victim = int(ids[5])
    inner = make_embed_fn()

    def embed(*a):  # the delete commits while the job embeds (after it read the items)
        db.delete_items(cname, item_ids=[victim])
        return inner(*a)

    run = db.run_embedding_job(cname, {"k": 3}, 3, embed_fn=embed)
    assert run["timings"]["erased_at_switch"] == 1
    t = _tables(conn, run["run_id"])
    assert victim not in t["items"] and victim not in {i for r in t["prior"] for i in [r[0], *r[2]]}
    assert victim not in _ids_in_cells(conn, run["run_id"])


def test_raw_kahm_models_stop_serving_after_an_erasure(db, cname, conn):
    from pm_vector.db import kahm as dbk
    from pm_vector.db.resolve.resolution import resolve

    X, y, ids, rid = _collection(db, cname, n=300)
    dbk.fit_kahm_models(cname, kind="raw", n_components=3)
    dbk.load_kahm_model(cname)
    db.delete_items(cname, item_ids=[int(ids[0])])
    with pytest.raises(dbk.NoKAHMModelError, match="is refused|are refused.*Refit it"):
        dbk.load_kahm_model(cname)
    req = _row_requests(cname, X, y, n=1)[0]
    assert resolve(cname, req, log=False)["kahm"] is None  # no scores of the erased model come back


def test_every_run_table_is_registered(conn):
    """Every kind of run table is in the registry; the SQL namer pm_vector.pm_run_table takes any of
    them (a kind's shape, migration 0026: no second list), and the one kind that holds no items is the
    anchors."""
    from pm_vector.db.runs.kinds import KINDS

    for kind in KINDS:
        assert conn.execute("SELECT pm_vector.pm_run_table(3, %s)", [kind]).fetchone()[0] == f"pm_vector.run_3_{kind}"
    assert {k for k, t in KINDS.items() if t.erase is None} == {"anchors"}  # the one kind that holds no items
