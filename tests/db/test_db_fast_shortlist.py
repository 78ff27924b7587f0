"""Migration 0009 (sql/0009_fast_shortlist.sql): new runs keep each prior item's neighbour list and
those neighbours' hub counts in the prior row; pm_shortlist answers them without joining the graph
or the hubs and gives the same shortlists as the 0005 statement and as the in-memory
PosteriorShortlist (min_weight included); runs without the columns keep the 0005 statement; new
items keep the hub counts of the lists exact."""

from __future__ import annotations

import numpy as np
import pytest

KP = 24


def _make(db, cname, n=1500, dim=8, seed=3, **class_rows):
    from dbtest_helpers import data, make_embed_fn

    X, y = data(n, dim, seed=seed)
    db.create_collection(cname, dim, [0, 1, 2], settings={"delta": False})  # (rows extended in the write)
    ids = np.asarray(db.ingest(cname, X, y)["item_ids"])
    db.register_anchor_set(cname, X[:150], y[:150])
    run = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn(), class_rows=class_rows or None)
    return X, y, ids, int(run["run_id"])


def _rows(db, cname, X, y, n_req=6, seed=0):
    """Released-looking rows: a random item's clipped coordinates in each class frame plus noise."""
    from pm_vector.db.resolve.resolution import class_frames

    frames = class_frames(cname)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_req):
        j = int(rng.integers(len(y)))
        rows = np.stack([frames.clipped(X[j:j + 1].astype(np.float64), [c])[0] for c in frames.classes_])
        sig = rng.choice([0.02, 0.2, 2.0], size=len(frames.classes_))
        out.append((rows + sig[:, None] * rng.standard_normal(rows.shape), sig))
    return frames, out


def _sql(conn, cname, rows, sig, kp=KP, max_prior=None):
    res = conn.execute("SELECT row_index, item_id, score FROM pm_vector.pm_shortlist(%s, %s::float8[], %s::float8[], "
                       "%s, %s)", [cname, rows.tolist(), sig.tolist(), kp, max_prior]).fetchall()
    out: dict[int, list] = {}
    for r in res:
        out.setdefault(r[0] - 1, []).append((int(r[1]), float(r[2])))
    return out


def _v1(conn, cname, rows, sig, kp=KP, max_prior=None):
    """The statement of sql/0005_class_rows.sql (graph and hubs tables) on the same run and arguments."""
    from psycopg import RawCursor

    run = conn.execute("SELECT * FROM pm_vector.pm_class_rows_run(%s)", [cname]).fetchone()
    mp = max_prior or run[4]
    text = conn.execute("SELECT pm_vector.pm_shortlist_sql_v1(%s, %s)", [run[0], run[3]]).fetchone()[0]
    with conn.transaction():
        conn.execute("SELECT pm_vector.pm_prepare_prior_search(%s)", [mp])
        res = RawCursor(conn).execute(text, [rows.tolist(), sig.tolist(), run[1], run[2], kp, mp]).fetchall()
    out: dict[int, list] = {}
    for r in res:
        out.setdefault(r[0] - 1, []).append((int(r[2]), float(r[5])))
    return out


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for r, got in a.items():
        assert [i for i, _ in got] == [i for i, _ in b[r]], f"row {r}"
        np.testing.assert_allclose([s for _, s in got], [s for _, s in b[r]], rtol=1e-12, atol=1e-12)


def test_new_runs_keep_neighbour_lists_and_their_hubs_in_the_prior(db, cname, conn):
    X, _, ids, rid = _make(db, cname, n=600)
    assert conn.execute("SELECT pm_vector.pm_run_has_nbrs(%s)", [rid]).fetchone()[0] is True
    rows = conn.execute(f"SELECT item_id, label, nbrs, nhub FROM pm_vector.run_{rid}_prior").fetchall()
    assert len(rows) == 600
    graph: dict[int, set] = {}
    for a, b in conn.execute(f"SELECT item_id, neighbor_id FROM pm_vector.run_{rid}_neighbors").fetchall():
        graph.setdefault(a, set()).add(b)
    hubs = {(lab, i): h for lab, i, h in conn.execute(f"SELECT label, item_id, hub FROM pm_vector.run_{rid}_hubs")}
    for item, lab, nbrs, nhub in rows:
        assert len(nbrs) == 16 and set(nbrs) == graph[item]
        assert nhub == [hubs.get((lab, i), 0.0) for i in nbrs]
    # nearest first, as neighbor_graph orders them
    j = 10
    d = ((X.astype(np.float64) - X[j]) ** 2).sum(1)
    d[j] = np.inf
    got = conn.execute(f"SELECT nbrs FROM pm_vector.run_{rid}_prior WHERE item_id = %s", [int(ids[j])]).fetchone()[0]
    assert got[:4] == ids[np.argsort(d, kind="stable")[:4]].tolist()


@pytest.mark.parametrize("min_weight", [0.0, 0.05])
def test_fast_statement_equals_the_in_memory_shortlist_when_exact(db, cname, conn, min_weight):
    """max_prior above the class sizes: the prior is read whole, so SQL and memory rank the same."""
    from pm_vector.shortlist import PosteriorShortlist

    X, y, ids, _ = _make(db, cname, max_prior=1000, min_weight=min_weight)
    frames, reqs = _rows(db, cname, X, y)
    ps = PosteriorShortlist(16, 1000, min_weight).fit(frames, X.astype(np.float32).astype(np.float64), y)
    for rows, sig in reqs:
        got = _sql(conn, cname, rows, sig)
        for r, c in enumerate(frames.classes_):
            s = ps.scores(rows[r], sig[r], c)
            want = np.lexsort((np.arange(s.size), -s))[:KP]
            assert [i for i, _ in got[r]] == ids[want].tolist()
            np.testing.assert_allclose([v for _, v in got[r]], s[want], rtol=1e-12, atol=1e-12)
    if min_weight == 0.0:  # and the 0005 statement agrees on the same run
        for rows, sig in reqs:
            _same(_sql(conn, cname, rows, sig), _v1(conn, cname, rows, sig))


def test_min_weight_drops_contributions_below_it(db, cname, conn):
    """A larger min_weight can only drop (never add) per-item contributions: at sigma small enough
    every score is its own item's weight, so a min_weight of 0.9 keeps only the nearest items."""
    from pm_vector.shortlist import PosteriorShortlist

    X, y, ids, _ = _make(db, cname, n=600, max_prior=1000, min_weight=0.9)
    frames, reqs = _rows(db, cname, X, y, n_req=2)
    ps0 = PosteriorShortlist(16, 1000, 0.0).fit(frames, X.astype(np.float32).astype(np.float64), y)
    ps9 = PosteriorShortlist(16, 1000, 0.9).fit(frames, X.astype(np.float32).astype(np.float64), y)
    rows, sig = reqs[0]
    s0, s9 = ps0.scores(rows[0], sig[0], 0), ps9.scores(rows[0], sig[0], 0)
    assert np.all(s9 <= s0 + 1e-15) and np.count_nonzero(s9) < np.count_nonzero(s0)
    got = _sql(conn, cname, rows, sig)
    want = np.lexsort((np.arange(s9.size), -s9))[:KP]
    assert [i for i, _ in got[0]] == ids[want].tolist()


def test_fast_statement_equals_the_0005_statement_through_the_index(db, cname, conn):
    """Classes larger than max_prior (64): both statements read the same HNSW scan of each class."""
    X, y, _, rid = _make(db, cname, n=1500, max_prior=64)
    _, reqs = _rows(db, cname, X, y)
    for rows, sig in reqs:
        _same(_sql(conn, cname, rows, sig), _v1(conn, cname, rows, sig))
    plan = "\n".join(r[0] for r in conn.execute(
        "SELECT * FROM pm_vector.pm_shortlist_explain(%s, %s::float8[], %s::float8[], %s)",
        [cname, reqs[0][0].tolist(), reqs[0][1].tolist(), KP]).fetchall())
    assert f"run_{rid}_neighbors" not in plan and f"run_{rid}_prior" in plan


def test_a_run_without_neighbour_lists_keeps_answering(db, cname, conn):
    """A run of the 0005 layout (no nbrs / nhub) is answered by the 0005 statement, with the same answers."""
    X, y, _, rid = _make(db, cname, n=600)
    _, reqs = _rows(db, cname, X, y, n_req=3)
    before = [_sql(conn, cname, rows, sig) for rows, sig in reqs]
    conn.execute(f"ALTER TABLE pm_vector.run_{rid}_prior DROP COLUMN nbrs, DROP COLUMN nhub")
    assert conn.execute("SELECT pm_vector.pm_run_has_nbrs(%s)", [rid]).fetchone()[0] is False
    for (rows, sig), b in zip(reqs, before):
        _same(_sql(conn, cname, rows, sig), b)
    # and new items still extend it (the 0005 layout is written)
    from dbtest_helpers import data, make_extend_fn

    X2, y2 = data(20, 8, seed=9)
    db.ingest(cname, X2, y2)
    assert db.embed_new_items(cname, make_extend_fn())["n_new"] == 20
    assert conn.execute(f"SELECT count(*) FROM pm_vector.run_{rid}_prior").fetchone()[0] == 620


def test_new_items_keep_the_lists_hub_counts_exact(db, cname, conn):
    from dbtest_helpers import data, make_extend_fn

    X, y, _, rid = _make(db, cname, n=600)
    X2, y2 = data(80, 8, seed=11)
    db.ingest(cname, X2, y2)
    assert db.embed_new_items(cname, make_extend_fn())["n_new"] == 80
    hubs = {(lab, i): h for lab, i, h in conn.execute(f"SELECT label, item_id, hub FROM pm_vector.run_{rid}_hubs")}
    rows = conn.execute(f"SELECT label, nbrs, nhub FROM pm_vector.run_{rid}_prior").fetchall()
    assert len(rows) == 680
    stale = sum(nhub != [hubs.get((lab, i), 0.0) for i in nbrs] for lab, nbrs, nhub in rows)
    assert stale == 0
    _, reqs = _rows(db, cname, X, y, n_req=3)
    for rows_, sig in reqs:
        _same(_sql(conn, cname, rows_, sig), _v1(conn, cname, rows_, sig))


def test_min_weight_is_validated_with_a_clear_error(db, cname):
    from pm_vector.db.runs.class_rows import params
    from pm_vector.errors import InvalidInputError
    from pm_vector.shortlist import PosteriorShortlist

    for bad in (1.0, -0.1, "0.1", True):
        with pytest.raises(InvalidInputError, match="min_weight"):
            params(None, {"min_weight": bad})
    with pytest.raises(InvalidInputError, match="min_weight"):
        PosteriorShortlist(16, 64, 1.5).fit(None, np.zeros((3, 2)), [0, 0, 1])
    assert params(None, {"min_weight": 0})["min_weight"] == 0.0
