"""The cell release in PostgreSQL (migration 0013): the embedding job publishes the public cells
(fit on the public anchor only) and the per-(level, class, cell) hub counts; resolve() answers a
CellRequest with ONE statement, exactly as the in-memory CellShortlist (ids and order); bad cell
requests are refused clearly and log nothing; a killed job leaves the previous run serving with its
cells; embed --new-items extends the cells on the run's graph; a run without ready cells refuses
clearly."""

from __future__ import annotations

import time

import numpy as np
import pytest

KP = 32


@pytest.fixture(scope="module")
def cserved(pm_home):
    """digits: server 800 / anchor 300 / dummy 150 / query 100; a run with class rows and cells; the
    in-memory CellShortlist fit on the same (float32 as stored) items with cells fit on the anchor."""
    import pm_vector.db as db
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.manifold.public_cells import PublicCells
    from pm_vector.shortlist import CellShortlist

    ds = load_dataset("digits")
    sp = split_dataset(ds, 800, 300, 150, 100, seed=0)
    name = "cells_served"
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
    cells = PublicCells().fit(Xa, sp.anchor[1])  # the public anchor only
    cs = CellShortlist().fit(cells, X32, ys)  # the cell release's graph (CELL_GRAPH_DEGREE neighbours)
    yield {"name": name, "split": sp, "ids": np.asarray(ids), "run": run, "cells": cells, "cs": cs}
    db.drop_collection(name, missing_ok=True)


def _client(cells, name, eps, K=None, seed=0):
    from pm_vector.client.cell_client import PrivateCellKNN
    from pm_vector.privacy import secure_generator

    return PrivateCellKNN(cells, eps, n_cells=K, shortlist=KP, collection=name)._inject_generator(
        secure_generator(seed))


def _requests(served, eps, K=None, n=10, seed=0):
    c = _client(served["cells"], served["name"], eps, K, seed)
    Xq, yq = served["split"].query
    return [c.request(np.asarray(Xq[i], np.float32).astype(np.float64), int(yq[i]))[0] for i in range(n)]


class _Counting:
    """A connection proxy counting statements (all, and those that rank cells)."""

    def __init__(self, conn):
        self._conn = conn
        self.statements = 0
        self.cell_statements = 0

    def execute(self, query, *a, **kw):
        self.statements += 1
        if "pm_cell_shortlist" in str(query):
            self.cell_statements += 1
        return self._conn.execute(query, *a, **kw)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_the_job_publishes_the_cells_fit_on_the_public_anchor(cserved, conn):
    from pm_vector.db.resolve.resolution import public_anchor
    from pm_vector.manifold.public_cells import PublicCells

    rid = cserved["run"]["run_id"]
    _, info = public_anchor(cserved["name"])
    doc = info["class_rows"]["cells"]
    pub = PublicCells.from_dict(info["public_cells"])
    # what the anchor download carries is the fit on the public anchor alone, and its digest
    assert doc["status"] == "ready" and doc["digest"] == pub.digest() == cserved["cells"].digest()
    assert doc["levels"] == list(cserved["cells"].levels_) and doc["levels"][:4] == [2, 4, 8, 16]
    assert doc["graph_degree"] == 32
    n_cls = len(info["class_rows"]["classes"])
    rows = conn.execute(f"SELECT level, count(*), sum(cardinality(item_ids)) FROM pm_vector.run_{rid}_cells "
                        "GROUP BY level ORDER BY level").fetchall()
    assert [(k, n) for k, n, _ in rows] == [(0, n_cls)] + [(K, n_cls * K) for K in doc["levels"]]
    # per level, the counts of all cells of a class add up to the class hub counts
    cs = cserved["cs"]
    for K in doc["levels"]:
        total = cs.cell_hubs_[K].sum()
        got = conn.execute(f"SELECT sum(h) FROM pm_vector.run_{rid}_cells, unnest(hubs) AS h WHERE level = %s",
                           [K]).fetchone()[0]
        assert got == total == 800 * 32
    # level 0: each class's hub counts, by count desc then id (its first k' are the class's top hubs)
    for k, c in enumerate(info["class_rows"]["classes"]):
        got_ids, got_h = conn.execute(f"SELECT item_ids, hubs FROM pm_vector.run_{rid}_cells WHERE level = 0 "
                                      "AND label = %s", [c]).fetchone()
        h = cs.hubs_[k]
        order = np.lexsort((np.arange(h.size), -h))[:len(got_ids)]
        assert got_ids == cserved["ids"][order].tolist() and got_h == h[order].tolist() and h[order].min() > 0


@pytest.mark.parametrize("eps", [1.0, 4.0, 16.0, float("inf")])
def test_resolve_equals_the_in_memory_cell_shortlist_with_one_statement(cserved, eps):
    import pm_vector.db as pdb
    from pm_vector.db.resolve.resolution import resolve

    cs, ids, name = cserved["cs"], cserved["ids"], cserved["name"]
    c = _Counting(pdb.connect())
    n = 0
    try:
        for K in cserved["cells"].levels_:
            reqs = _requests(cserved, eps, K, n=4, seed=int(K))
            for req in reqs:
                res = resolve(name, req, conn=c, log=False)
                assert res["release"] == "cells" and res["n_cells"] == K
                want = cs.shortlist(req)
                for r, row in enumerate(res["rows"]):
                    assert row["item_ids"] == ids[want[r]].tolist(), (K, r)
                    s = cs.scores(r, K, req.reports[r], req.epsilon)
                    assert row["scores"] == s[want[r]].tolist()
                n += 1
    finally:
        c.close()
    assert c.cell_statements == n  # one statement per request answers every row
    assert c.statements <= 3 * n  # + the snapshot's BEGIN and the run's metadata


@pytest.mark.parametrize("code_bytes", [32, 64])
def test_the_compact_cell_answer_is_the_full_answer_in_three_values_per_row(cserved, conn, code_bytes):
    """The compact statement (one row per answer row: ids, code prefixes and payloads aggregated by
    rank) answers the full statement's candidates, in its order, with the same codes and payloads,
    in one statement; every row alike."""
    import pm_vector.db as pdb
    from pm_vector.db.resolve.resolution import resolve

    name, rid = cserved["name"], cserved["run"]["run_id"]
    stored = {int(i): bytes(c) for i, c in conn.execute(f"SELECT item_id, code FROM pm_vector.run_{rid}_codes")}
    meta = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]["codes"]
    off = dict(zip(meta["widths"], meta["offsets"]))[code_bytes]  # a residual prefix at 0, a wide table after them
    c = _Counting(pdb.connect())
    try:
        for K in cserved["cells"].levels_[:3]:
            for req in _requests(cserved, 4.0, K, n=2, seed=int(K) + 100):
                full = resolve(name, req, log=False)
                compact = resolve(name, req, conn=c, compact=True, code_bytes=code_bytes, log=False)
                assert compact["answer"] == "compact" and compact["codes"]["bytes"] == code_bytes
                assert len(compact["rows"]) == len(full["rows"]) == req.n_rows
                for r, (row, frow) in enumerate(zip(compact["rows"], full["rows"])):
                    assert set(row) == {"row", "item_ids", "codes", "payloads"} and row["row"] == r
                    assert row["item_ids"].dtype == np.uint32 and row["item_ids"].tolist() == frow["item_ids"]
                    assert row["payloads"] == frow["payloads"] and len(row["payloads"]) == KP
                    assert row["codes"].shape == (KP, code_bytes) and row["codes"].dtype == np.uint8
                    want = [stored[i][off:off + code_bytes] for i in frow["item_ids"]]
                    assert [bytes(v) for v in row["codes"]] == want
    finally:
        c.close()
    assert c.cell_statements == 6


def test_compact_groups_fills_rows_without_candidates_and_refuses_parts_that_disagree():
    from pm_vector.db.resolve.requests import compact_groups

    ids = np.array([5, 2**33], ">i8").tobytes()
    rows = compact_groups(3, [(2, ids, bytes(range(8)), [{"a": 1}, None])], 4)
    assert [r["row"] for r in rows] == [0, 1, 2]
    assert rows[1]["item_ids"].tolist() == [5, 2**33] and rows[1]["item_ids"].dtype == np.int64  # does not fit uint32
    assert rows[1]["codes"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and rows[1]["payloads"] == [{"a": 1}, None]
    assert rows[0]["item_ids"].size == 0 and rows[0]["codes"].shape == (0, 4) and rows[2]["payloads"] == []
    small = compact_groups(1, [(1, ids[:8], bytes(4), [None])], 4)
    assert small[0]["item_ids"].dtype == np.uint32 and "payloads" not in small[0]  # no candidate has a payload
    for bad in ([(1, ids, bytes(7), [None, None])], [(1, ids, bytes(8), [None])], [(3, ids, bytes(8), [None, None])]):
        with pytest.raises(ValueError, match="compact statement"):
            compact_groups(2, bad, 4)


def test_sql_function_answers_sql_callers_alike(cserved, conn):
    from pm_vector.db.resolve.resolution import resolve

    req = _requests(cserved, 4.0, 8, n=1)[0]
    rows = conn.execute("SELECT row_index, item_id FROM pm_vector.pm_cell_shortlist(%s, %s, %s, %s, %s)",
                        [cserved["name"], 8, req.reports, 4.0, KP]).fetchall()
    res = resolve(cserved["name"], req, log=False)
    for r, row in enumerate(res["rows"]):
        assert [i for ri, i in rows if ri == r + 1] == row["item_ids"]
    with pytest.raises(Exception, match="published levels"):
        conn.execute("SELECT * FROM pm_vector.pm_cell_shortlist(%s, %s, %s, %s, %s)",
                     [cserved["name"], 3, req.reports, 4.0, KP])


def test_a_cell_request_is_logged_with_delta_zero_and_answers_with_features(cserved):
    from pm_vector.db import list_requests
    from pm_vector.db.resolve.resolution import resolve

    req = _requests(cserved, 2.0, n=1)[0]
    res = resolve(cserved["name"], req, include_features=True)
    assert all(r["features"].shape == (KP, 64) for r in res["rows"])
    logged = [r for r in list_requests(cserved["name"]) if r["id"] == res["request_log_id"]][0]
    assert logged["request"]["release"] == "cells" and logged["request"]["delta"] == 0.0
    assert logged["request"]["reports"] == req.reports


def test_bad_cell_requests_are_refused_clearly_and_nothing_is_logged(cserved, conn):
    from pm_vector.client.request import CellRequest
    from pm_vector.db.errors import CellsDigestMismatchError
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.errors import InvalidInputError

    name = cserved["name"]
    req = _requests(cserved, 4.0, 8, n=1)[0]
    before = conn.execute("SELECT count(*) FROM pm_vector.request_log").fetchone()[0]
    d = req.to_dict()
    with pytest.raises(CellsDigestMismatchError, match="fetch the current public anchor"):
        resolve(name, {**d, "cells_digest": "0" * 64})
    with pytest.raises(InvalidInputError, match=r"published levels \[2, 4, 8, 16"):
        resolve(name, {**d, "n_cells": 32, "reports": [0] * 10})
    with pytest.raises(InvalidInputError, match="needs exactly 10"):
        resolve(name, {**d, "reports": d["reports"][:9]})
    with pytest.raises(InvalidInputError, match=r"in \[0, 8\)"):
        resolve(name, {**d, "reports": [8] + d["reports"][1:]})
    with pytest.raises(InvalidInputError, match="delta must be 0"):
        resolve(name, {**d, "delta": 1e-5})
    with pytest.raises(InvalidInputError, match="unknown cell request field"):
        resolve(name, {**d, "sigmas": [1.0]})
    with pytest.raises(InvalidInputError, match="built for collection"):
        resolve(name, CellRequest(**{**{k: v for k, v in d.items() if k != "format"}, "collection": "other"}))
    assert conn.execute("SELECT count(*) FROM pm_vector.request_log").fetchone()[0] == before


KILL_CHILD = """
import sys, time
import pm_vector.db as db
from pm_vector.db.runs.jobs import anchor_frame_embed_fn

def progress(s, done, total):
    if s == "index":
        print("READY", done, total, flush=True)
        time.sleep(300)

db.run_embedding_job(sys.argv[1], {"n_components": 8}, 99, progress=progress, embed_fn=anchor_frame_embed_fn)
print("FINISHED", flush=True)
"""


def test_a_sigkilled_job_leaves_the_previous_run_serving_with_its_cells(cserved, db, conn):
    import os
    import signal

    from dbtest_helpers import start_child, wait_ready

    from pm_vector.db.resolve.resolution import public_anchor, resolve

    name = cserved["name"]
    first = cserved["run"]["run_id"]
    reqs = _requests(cserved, 4.0, 8, n=3)
    before = [[r["item_ids"] for r in resolve(name, q, log=False)["rows"]] for q in reqs]
    Xa, ya = cserved["split"].anchor
    db.register_anchor_set(name, Xa[::-1].copy(), ya[::-1].copy())  # another public anchor: other cells
    child = start_child(KILL_CHILD, name)
    try:
        wait_ready(child, timeout=180)
        run_id = [r for r in db.list_runs(name) if r["status"] == "running"][0]["run_id"]
        # the killed job's cells were written (before the index stage) ...
        assert conn.execute(f"SELECT count(*) FROM pm_vector.run_{run_id}_cells").fetchone()[0] > 0
        other = conn.execute("SELECT class_rows -> 'cells' ->> 'digest' FROM pm_vector.embedding_runs WHERE id = %s",
                             [run_id]).fetchone()[0]
        assert other != cserved["cells"].digest()
        # ... and nothing serves them: the previous run answers, and publishes its own cells
        assert [[r["item_ids"] for r in resolve(name, q, log=False)["rows"]] for q in reqs] == before
        assert public_anchor(name)[1]["class_rows"]["cells"]["digest"] == cserved["cells"].digest()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    deadline = time.monotonic() + 15
    while db.run_info(run_id)["worker_alive"] is not False and time.monotonic() < deadline:
        time.sleep(0.1)
    assert db.collection_info(name)["active_run_id"] == first
    assert db.cleanup_stale_runs(name) == [run_id]
    assert conn.execute("SELECT to_regclass(%s)", [f"pm_vector.run_{run_id}_cells"]).fetchone()[0] is None
    assert [[r["item_ids"] for r in resolve(name, q, log=False)["rows"]] for q in reqs] == before


def _extended_shortlist(cells, n_old, X, y, g=32):
    """A CellShortlist on the graph a run holds after new items: the old items' lists as the job
    fit them (among the old items), each new item's list against all items (itself left out)."""
    from pm_vector.neighbors import knn_search, neighbor_graph
    from pm_vector.shortlist import CellShortlist, cell_hub_counts

    ids = np.arange(len(y))
    nb_new = knn_search(X[n_old:], X, g + 1)
    nb_new = np.stack([r[r != n_old + i][:g] for i, r in enumerate(nb_new)])
    nb = np.concatenate([neighbor_graph(X[:n_old], g), nb_new])
    cs = CellShortlist(g)
    cs.cells_, cs.y_index_, cs.neighbors_, cs.n_items_ = cells, cells.class_index(y), nb, len(ids)
    C = cells.classes_.size
    cs.hubs_ = {c: np.bincount(nb[cs.y_index_ == c].ravel(), minlength=len(ids)).astype(np.float64)
                for c in range(C)}
    cs.cell_hubs_ = {K: cell_hub_counts(nb, cs.y_index_, cells.assign(X, cs.y_index_, K), len(ids), n_classes=C,
                                        n_cells=K) for K in cells.levels_}
    return cs


@pytest.mark.slow
def test_new_items_extend_the_cells_on_the_runs_graph(db, cname, conn):
    from dbtest_helpers import make_embed_fn, make_extend_fn

    from pm_vector.db.resolve.cell_resolution import CellsUnavailableError
    from pm_vector.db.resolve.resolution import public_anchor, resolve
    from pm_vector.manifold.public_cells import PublicCells

    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, 700)
    X = rng.normal(size=(700, 6)) + 2.0 * np.eye(6)[y]
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    db.create_collection(cname, 6, [0, 1, 2], settings={"delta": False})  # (rows extended in the write)
    ids = np.asarray(db.ingest(cname, X[:600], y[:600])["item_ids"])
    db.register_anchor_set(cname, X[:90], y[:90])
    db.register_anchor_set(cname, X[90:120], y[90:120], role="dummy")
    rid = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())["run_id"]
    cells = PublicCells.from_dict(public_anchor(cname)[1]["public_cells"])
    reqs = [_client(cells, cname, eps, K, seed=K).request(X[300 + K].astype(np.float64), int(y[300 + K]))[0]
            for eps in (2.0, 8.0) for K in cells.levels_]
    ids = np.concatenate([ids, np.asarray(db.ingest(cname, X[600:], y[600:])["item_ids"])])
    db.embed_new_items(cname, make_extend_fn())
    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    assert doc["cells"]["status"] == "ready"
    cs = _extended_shortlist(cells, 600, X.astype(np.float64), y)
    assert cs.cell_hubs_[cells.levels_[0]].sum() == 700 * 32  # every item's list, the new ones included
    for req in reqs:  # the new items are in the answers' ranking: their cells and neighbour lists count
        want = cs.shortlist(req)
        got = resolve(cname, req, log=False)["rows"]
        assert [r["item_ids"] for r in got] == [ids[w].tolist() for w in want]
    # a run without ready cells refuses cell requests clearly until a full job
    conn.execute("UPDATE pm_vector.embedding_runs SET class_rows = jsonb_set(class_rows, '{cells,status}', "
                 "'\"stale\"') || jsonb_build_object('graph_version', 99) WHERE id = %s", [rid])
    with pytest.raises(CellsUnavailableError, match="run a full embedding job"):
        resolve(cname, reqs[0], log=False)
    with pytest.raises(Exception, match="publishes no cells") as ei:  # SQL callers: PM009
        conn.execute("SELECT * FROM pm_vector.pm_cell_shortlist(%s, 4, %s, 4.0, 16)", [cname, reqs[0].reports])
    assert ei.value.sqlstate == "PM009"
    assert public_anchor(cname)[1]["public_cells"] is None  # nothing stale is published
    db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())
    assert len(resolve(cname, reqs[0], log=False)["rows"]) == 3  # same anchor: same cells, served again


def test_explain_a_cell_request(cserved):
    from pm_vector.db.resolve.resolution import explain_resolution

    rid = cserved["run"]["run_id"]
    plans = explain_resolution(cserved["name"], _requests(cserved, 4.0, 8, n=1)[0])
    assert "pm_cell_shortlist_core" in "\n".join(plans["statement"])
    shortlist = "\n".join(plans["shortlist"])
    # each row's cell row by primary key, the class's top hubs by their index
    assert f"run_{rid}_cells_pkey" in shortlist and "hubs" not in shortlist, shortlist


def test_cut_rows_answer_as_the_whole_rows_and_new_items_keep_the_whole_counts(db, cname, conn, monkeypatch):
    """With the rows' cap at 40 (1000 in use: the largest k'), the job cuts the cell rows to what an
    answer with k' <= 40 can use and each level-0 row to its first 40 hubs, the whole class counts
    at level -1; resolve() still answers exactly as the in-memory CellShortlist on the whole counts;
    after new items, level -1 holds the run graph's whole class counts and level 0 their first 40."""
    from dbtest_helpers import make_embed_fn, make_extend_fn

    import pm_vector.db.runs.cell_data as dbcells
    from pm_vector.db.resolve.resolution import public_anchor, resolve
    from pm_vector.manifold.public_cells import PublicCells
    from pm_vector.shortlist import CellShortlist

    monkeypatch.setattr(dbcells, "MAX_K_PRIME", 40)
    rng = np.random.default_rng(5)
    y = rng.integers(0, 3, 700)
    X = rng.normal(size=(700, 6)) + 2.0 * np.eye(6)[y]
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    db.create_collection(cname, 6, [0, 1, 2], settings={"delta": False})  # (rows extended in the write)
    ids = np.asarray(db.ingest(cname, X[:600], y[:600])["item_ids"])
    db.register_anchor_set(cname, X[:90], y[:90])
    db.register_anchor_set(cname, X[90:120], y[90:120], role="dummy")
    rid = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())["run_id"]
    t = f"pm_vector.run_{rid}_cells"
    whole = dict(((lab, tuple(ii)) for lab, ii in conn.execute(f"SELECT label, item_ids FROM {t} WHERE level = -1")))
    assert sorted(whole) == [0, 1, 2]
    for lab, ii in conn.execute(f"SELECT label, item_ids FROM {t} WHERE level = 0").fetchall():
        assert tuple(ii) == whole[lab][:40]
    sizes = [n for (n,) in conn.execute(f"SELECT cardinality(item_ids) FROM {t} WHERE level > 0").fetchall()]
    cells = PublicCells.from_dict(public_anchor(cname)[1]["public_cells"])
    cs = CellShortlist().fit(cells, X[:600].astype(np.float64), y[:600])
    full = [int((cs.cell_hubs_[K].getrow(r).toarray() > 0).sum()) for K in cells.levels_ for r in range(3 * K)]
    assert sum(sizes) < sum(full)  # rows were cut
    for eps in (0.5, 2.0, 8.0, float("inf")):
        for K in cells.levels_:
            req = _client(cells, cname, eps, K, seed=K).request(X[300 + K].astype(np.float64), int(y[300 + K]))[0]
            got = resolve(cname, req, log=False)["rows"]
            assert [r["item_ids"] for r in got] == [ids[w].tolist() for w in cs.shortlist(req)]
    ids = np.concatenate([ids, np.asarray(db.ingest(cname, X[600:], y[600:])["item_ids"])])
    db.embed_new_items(cname, make_extend_fn())
    ext = _extended_shortlist(cells, 600, X.astype(np.float64), y)
    pos = {int(v): i for i, v in enumerate(ids)}
    for lab, ii, hh, ch in conn.execute(f"SELECT label, item_ids, hubs, chubs FROM {t} WHERE level = -1").fetchall():
        want = ext.hubs_[int(lab)]
        assert sorted(pos[v] for v in ii) == np.flatnonzero(want).tolist()
        assert hh == [want[pos[v]] for v in ii] == ch
        lv0 = conn.execute(f"SELECT item_ids, chubs FROM {t} WHERE level = 0 AND label = %s", [lab]).fetchone()
        assert lv0[0] == ii[:40] and lv0[1] == hh[:40]
    for lab, ii, ch in conn.execute(f"SELECT label, item_ids, chubs FROM {t} WHERE level > 0").fetchall():
        assert ch == [ext.hubs_[int(lab)][pos[v]] for v in ii]  # chubs follow the whole class counts
