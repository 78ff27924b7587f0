"""A merge applies the changes made during its build to the new run BEFORE its switch, outside the
collection's lock (pm_vector/db/runs/merge.py, catch_up_run), so the switch holds the row for the last
few only; an item deleted during the build is tombstoned in the new run (one statement), not erased
with its lists refilled in the switch (12,002 such erasures held the switch, and every write, for 166 s
at 100,000 items)."""

from __future__ import annotations

import threading

import numpy as np

from test_db_delta import _every_location_answer
from test_db_erase import _collection


def test_changes_made_during_a_merges_build_are_applied_before_its_switch(db, cname, conn, monkeypatch):
    from dbtest_helpers import make_embed_fn, make_extend_fn

    from pm_vector.db.runs import merge as merge_mod

    X, y, ids, rid = _collection(db, cname, n=400, delta=True)
    gone = ids[::7]
    Xn = (X[:40] * 0.9 + X[40:80] * 0.1).astype(np.float32)
    new: list = []
    inner = make_embed_fn()

    placed_before: list = []

    def embed_while_writing(*a):  # the merge's build: meanwhile a delete and two ingests commit
        db.delete_items(cname, item_ids=gone.tolist())
        got = db.ingest(cname, Xn[:25], y[:25], embed_fn_extend=make_extend_fn())  # placed in the serving run
        new.extend(got["item_ids"])
        placed_before.extend(conn.execute(
            "SELECT item_id, level, cell, h, h_r FROM pm_vector.delta_entries WHERE run_id = %s AND item_id = ANY(%s) "
            "ORDER BY 1, 2", [rid, [int(i) for i in got["item_ids"]]]).fetchall())
        conn.commit()
        new.extend(db.ingest(cname, Xn[25:], y[25:40])["item_ids"])  # not placed (no extension given)
        return inner(*a)

    switch_sql = []
    real_switch = merge_mod.run_embedding_job

    def job(*a, **kw):  # what the switch itself applied: the job's own record of it
        out = real_switch(*a, **kw)
        switch_sql.append(out.get("timings") or {})
        return out

    monkeypatch.setattr(merge_mod, "run_embedding_job", job)
    out = db.merge(cname, embed_fn=embed_while_writing, embed_fn_extend=make_extend_fn())
    new_run = out["run_id"]
    # the catch-up took every change before the switch: the switch erased and rewrote nothing
    assert sum(t for t, _ in out["catch_up"]) == gone.size
    assert sum(p for _, p in out["catch_up"]) == len(new)
    assert "erased_at_switch" not in switch_sql[0] and switch_sql[0]["catch_up_s"] > 0
    # the deleted items are tombstoned in the new run and in no answer; the new items are in its delta
    t = {r[0] for r in conn.execute("SELECT item_id FROM pm_vector.delta_tombstones WHERE run_id = %s",
                                    [new_run]).fetchall()}
    assert t == set(gone.tolist())
    d = {r[0] for r in conn.execute("SELECT DISTINCT item_id FROM pm_vector.delta_entries WHERE run_id = %s",
                                    [new_run]).fetchall()}
    assert d == set(new)
    # those the serving run had placed are copied as they were (not embedded and estimated again)
    assert len(placed_before) == 25 * len({r[1] for r in placed_before})
    assert conn.execute("SELECT item_id, level, cell, h, h_r FROM pm_vector.delta_entries WHERE run_id = %s "
                        "AND item_id = ANY(%s) ORDER BY 1, 2", [new_run, [int(i) for i in new[:25]]]).fetchall() == placed_before
    n_items = conn.execute("SELECT n_items FROM pm_vector.embedding_runs WHERE id = %s", [new_run]).fetchone()[0]
    assert n_items == len(ids) - gone.size + len(new)
    conn.commit()
    _every_location_answer(cname, X, set(gone.tolist()), n_items, conn)
    # the next merge purges them from every derived table
    out2 = db.merge(cname, embed_fn=make_embed_fn(), embed_fn_extend=make_extend_fn())
    assert out2["merged_tombstones"] == gone.size and new_run in out2["dropped_runs"]
    assert conn.execute("SELECT count(*) FROM pm_vector.delta_tombstones WHERE item_id = ANY(%s)",
                        [gone.tolist()]).fetchone()[0] == 0


def test_writes_wait_on_a_merges_switch_only_for_its_last_changes(db, cname, conn, monkeypatch):
    """A delete committed while the merge's catch-up runs neither waits for the catch-up nor is lost:
    it is in the new run's tombstones after the switch."""
    from dbtest_helpers import make_embed_fn, make_extend_fn

    from pm_vector.db.runs import merge as merge_mod

    X, y, ids, rid = _collection(db, cname, n=300, delta=True)
    first, late = ids[:20], ids[200:205]
    inner = make_embed_fn()
    waited = []

    def embed_while_writing(*a):
        db.delete_items(cname, item_ids=first.tolist())
        return inner(*a)

    real = merge_mod.catch_up_run

    def catch_up_then_write(*a, **kw):
        got = real(*a, **kw)
        done = threading.Event()

        def late_delete():
            import time
            t = time.perf_counter()
            db.delete_items(cname, item_ids=late.tolist())
            waited.append(time.perf_counter() - t)
            done.set()

        th = threading.Thread(target=late_delete)
        th.start()
        done.wait(30)  # committed before the switch takes the row
        th.join()
        return got

    monkeypatch.setattr(merge_mod, "catch_up_run", catch_up_then_write)
    out = db.merge(cname, embed_fn=embed_while_writing, embed_fn_extend=make_extend_fn())
    t = {r[0] for r in conn.execute("SELECT item_id FROM pm_vector.delta_tombstones WHERE run_id = %s",
                                    [out["run_id"]]).fetchall()}
    assert t == set(first.tolist()) | set(late.tolist())
    assert waited and waited[0] < 5.0


def test_a_delete_does_not_wait_while_the_catch_up_places_items(db, cname, conn, monkeypatch):
    """While a catch-up pass places items in the run being built (its write transaction open), a delete
    of the serving run commits at once: the pass shares the run row its switch locks, not the collection
    row every sync batch, delete and update holds (sharing that stalled the sync ~50 s at 100,000 items)."""
    import time

    from dbtest_helpers import make_embed_fn, make_extend_fn

    from pm_vector.db.runs import delta as delta_mod, merge as merge_mod

    X, y, ids, rid = _collection(db, cname, n=300, delta=True)
    inner = make_embed_fn()
    Xn = (X[:10] * 0.9 + X[10:20] * 0.1).astype(np.float32)

    def embed_while_writing(*a):
        db.ingest(cname, Xn, y[:10])  # not placed in the serving run: the catch-up embeds and places them
        return inner(*a)

    real_place, waited = delta_mod.place, []

    def place_then_delete(c, coll, run_id, *a, **kw):
        out = real_place(c, coll, run_id, *a, **kw)
        if run_id != rid and not waited:  # the catch-up's pass, its transaction still open
            t = time.perf_counter()
            th = threading.Thread(target=lambda: db.delete_items(cname, item_ids=ids[250:253].tolist()))
            th.start()
            th.join(5.0)
            waited.append((time.perf_counter() - t, th.is_alive()))
        return out

    monkeypatch.setattr(delta_mod, "place", place_then_delete)
    out = db.merge(cname, embed_fn=embed_while_writing, embed_fn_extend=make_extend_fn())
    assert waited and not waited[0][1] and waited[0][0] < 5.0, waited
    t = {r[0] for r in conn.execute("SELECT item_id FROM pm_vector.delta_tombstones WHERE run_id = %s",
                                    [out["run_id"]]).fetchall()}
    assert set(ids[250:253].tolist()) <= t  # the delete reached the new run (by its switch)
