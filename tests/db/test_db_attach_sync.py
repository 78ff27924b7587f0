"""What a sync batch keeps between batches and within one: the run's items as built, cached in the
syncing process (pm_vector.db.runs.item_cache), must notice a batch applied by another process; the
cell and location rows a batch reads once and writes once (pm_vector.db.runs.array_rows.deferred)
must lose every erased item; and the cache, after many batches, holds exactly the run's items with
the vectors they were built from."""

from __future__ import annotations

import numpy as np
import pytest

from test_db_attach import _ids_of, _served, _vec, user_table  # noqa: F401  (fixture)

#: another process's sync (the same database, its own cache)
CHILD = """
import sys
sys.path.insert(0, sys.argv[2])
import pm_vector.db as db
from dbtest_helpers import make_extend_fn
print("APPLIED", db.sync(sys.argv[1], embed_fn_extend=make_extend_fn())["applied"], flush=True)
"""


def _changes(conn, t, X, y, rng, n, nxt):
    """``n`` mixed changes of the user's table (inserts, vector updates, payload updates, deletes)."""
    live = [r[0] for r in conn.execute(f"SELECT id FROM public.{t} WHERE id < 1000 OR id > 2000").fetchall()]
    for _ in range(n):
        r = rng.random()
        i = int(live[int(rng.integers(len(live)))])
        if r < 0.3:
            nxt += 1
            j = int(rng.integers(400))
            conn.execute(f"INSERT INTO public.{t} VALUES (%s, %s::vector, %s, 'new')", [nxt, _vec(X[j]), int(y[j])])
            live.append(nxt)
        elif r < 0.6:
            conn.execute(f"UPDATE public.{t} SET embedding = %s::vector WHERE id = %s", [_vec(X[int(rng.integers(400))]), i])
        elif r < 0.8:
            conn.execute(f"UPDATE public.{t} SET title = 'edited' WHERE id = %s", [i])
        else:
            conn.execute(f"DELETE FROM public.{t} WHERE id = %s", [i])
            live.remove(i)
    return nxt


def _check(conn, name, t, rid):
    """The collection is the table's valid rows; the run holds exactly them; no derived row lists an
    item that is not in the run; the process's cache (when it holds the run) is the run's items with
    the table's vectors."""
    from pm_vector.db.runs import item_cache

    items = {int(i) for i in _ids_of(conn, name).values()}
    valid = conn.execute(f"SELECT count(*) FROM public.{t} WHERE embedding IS NOT NULL AND "
                         "vector_dims(embedding) = 6").fetchone()[0]
    assert len(items) == valid
    p = f"pm_vector.run_{rid}_"
    assert {r[0] for r in conn.execute(f"SELECT item_id FROM {p}items").fetchall()} == items
    listed = set()
    for q in (f"SELECT item_ids FROM {p}cells", f"SELECT item_ids FROM {p}locations", f"SELECT nbrs FROM {p}prior"):
        listed |= {int(i) for (a,) in conn.execute(q).fetchall() for i in a}
    listed |= {r[0] for r in conn.execute(f"SELECT neighbor_id FROM {p}neighbors").fetchall()}
    listed |= {r[0] for r in conn.execute(f"SELECT item_id FROM {p}hubs").fetchall()}
    assert listed <= items
    from dbtest_helpers import check_location_parts

    check_location_parts(conn, rid)  # the location rows' parts: every item once, every entry in its part
    _check_prior_lists(conn, rid)
    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    cached = item_cache.get(conn, rid, doc)
    conn.rollback()
    if cached is not None:
        assert set(cached["id"].tolist()) == items
        ext = {int(i): e for e, i in _ids_of(conn, name).items()}
        vec = {str(k): np.asarray(v.strip("[]").split(","), np.float32) for k, v in conn.execute(
            f"SELECT id::text, embedding::text FROM public.{t} WHERE embedding IS NOT NULL").fetchall()}
        for i, f in zip(cached["id"].tolist(), cached["features"]):
            assert np.allclose(vec[ext[i]], f, atol=1e-5)
    return cached is not None


def _check_prior_lists(conn, rid):
    """Every prior row's ``nbrs`` is the neighbour table's list of its item (nearest first: the same
    set, no entry twice) and its ``nhub`` the stored hub counts of those items in the row's class."""
    p = f"pm_vector.run_{rid}_"
    graph: dict[int, list] = {}
    for a, b in conn.execute(f"SELECT item_id, neighbor_id FROM {p}neighbors").fetchall():
        graph.setdefault(a, []).append(b)
    hubs = {(c, i): h for c, i, h in conn.execute(f"SELECT label, item_id, hub FROM {p}hubs").fetchall()}
    rows = conn.execute(f"SELECT item_id, label, nbrs, nhub FROM {p}prior").fetchall()
    assert rows
    for item, c, nbrs, nhub in rows:
        assert sorted(nbrs) == sorted(graph.get(item, [])), f"item {item}: nbrs against the neighbour table"
        assert nhub == [hubs.get((c, i), 0.0) for i in nbrs], f"item {item}: nhub against the hub counts"
    conn.rollback()


def test_sync_batches_keep_every_prior_list_and_its_hub_counts(db, cname, conn, user_table):  # noqa: F811
    """Batches of erasures, replacements and new items (the prior rows' lists held and written once
    per batch, pm_vector.db.runs.prior_rows.deferred): after each, every prior row's nbrs is its
    neighbour list and its nhub the hub counts."""
    from dbtest_helpers import check_location_parts, make_extend_fn

    t, X, y = user_table
    db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding", label_column="category",
                    payload_columns=["title"], dim=6)
    rid = _served(db, cname, X, y)
    _check_prior_lists(conn, rid)
    assert check_location_parts(conn, rid) > 0
    rng = np.random.default_rng(5)
    nxt = 7000
    for _ in range(3):
        nxt = _changes(conn, t, X, y, rng, 40, nxt)
        out = db.sync(cname, embed_fn_extend=make_extend_fn())
        assert out["applied"] == 40 and out["deleted"] + out["replaced"] > 0 and out["inserted"] + out["replaced"] > 0
        _check_prior_lists(conn, rid)
        check_location_parts(conn, rid)  # erased items left their parts, new ones joined theirs


@pytest.mark.slow
def test_syncs_keep_the_run_items_and_notice_another_process(db, cname, conn, user_table):  # noqa: F811
    import os

    from dbtest_helpers import make_extend_fn, start_child

    from pm_vector.db.runs import item_cache

    t, X, y = user_table
    item_cache.forget()  # (entries of other tests' runs)
    db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding", label_column="category",
                    payload_columns=["title"], dim=6)
    rid = _served(db, cname, X, y)
    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    assert doc["status"] == "ready" and doc["cells"]["status"] == "ready" and doc["locations"]["status"] == "ready"
    conn.rollback()
    rng = np.random.default_rng(11)
    nxt = 5000
    for _ in range(3):  # batches in this process: the second and third read the run's items from the cache
        nxt = _changes(conn, t, X, y, rng, 25, nxt)
        assert db.sync(cname, embed_fn_extend=make_extend_fn())["applied"] == 25
        assert _check(conn, cname, t, rid)
    stale = dict(item_cache._cache)
    # another process applies a batch: this process's entry is now of an older version
    nxt = _changes(conn, t, X, y, rng, 25, nxt)
    child = start_child(CHILD, cname, os.path.dirname(__file__))
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    assert "APPLIED 25" in out
    item_cache._cache.clear()
    item_cache._cache.update(stale)
    doc2 = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    assert doc2["graph_version"] > doc.get("graph_version", 0) and item_cache.get(conn, rid, doc2) is None
    conn.rollback()
    nxt = _changes(conn, t, X, y, rng, 25, nxt)
    assert db.sync(cname, embed_fn_extend=make_extend_fn())["applied"] == 25
    assert _check(conn, cname, t, rid)  # read again, then cached under the new version
    # an entry that does not hold as many items as the run is not used
    k = next(k for k in item_cache._cache if k[3] == rid)
    item_cache._cache[k] = item_cache.after(item_cache._cache[k], item_cache._cache[k]["id"][:1])
    doc3 = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    assert item_cache.get(conn, rid, doc3) is None
    conn.rollback()


def test_deferred_rows_are_read_once_and_written_at_the_end(db, conn):
    from pm_vector.db.run_tables import TableName
    from pm_vector.db.runs import array_rows

    t = TableName("pm_t_rows")  # (a table as a hashable identifier, as every caller gives it: run_table)

    conn.execute("CREATE TEMP TABLE pm_t_rows (level integer, cell integer, item_ids bigint[], hubs float8[], "
                 "chubs float8[])")
    conn.execute("INSERT INTO pm_t_rows VALUES (1, 0, '{1,2,3}', '{1,1,1}', '{5,5,5}'), (1, 1, '{4,5}', '{2,2}', '{6,6}')")
    keys = (("level", "int4"), ("cell", "int4"))
    with array_rows.deferred(conn):
        rows = array_rows.read(conn, t, ("level", "cell"), "item_ids && %s::bigint[]", [[2]],
                               match=lambda r: bool(array_rows.member(r.item_ids, np.array([2])).any()))
        assert [r.key for r in rows] == [(1, 0)]
        rows[0].item_ids, rows[0].hubs, rows[0].chubs = rows[0].item_ids[[0, 2]], rows[0].hubs[[0, 2]], rows[0].chubs[[0, 2]]
        array_rows.write(conn, t, keys, rows)
        # not written yet; a second read sees the held row (changed) and reads the other one
        assert conn.execute("SELECT item_ids FROM pm_t_rows WHERE cell = 0").fetchone()[0] == [1, 2, 3]
        again = array_rows.read(conn, t, ("level", "cell"), "true", match=lambda r: True)
        assert sorted((r.key, r.item_ids.tolist()) for r in again) == [((1, 0), [1, 3]), ((1, 1), [4, 5])]
    assert conn.execute("SELECT item_ids, hubs, chubs FROM pm_t_rows WHERE cell = 0").fetchone() == ([1, 3], [1.0, 1.0],
                                                                                                      [5.0, 5.0])
    assert array_rows._held.sessions == {}
    conn.rollback()
