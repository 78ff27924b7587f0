"""The delta beside the precomputed answers (issue 36, migration 0023, pm_vector/db/runs/delta.py):
a delete writes tombstones and rewrites no derived row, yet from its commit on no answer of any
release (every published level, every cell, several eps and code widths; class rows and cells too)
holds a deleted item; new items are answered from the delta by the same ranking as the base
(entry by entry against numpy); the merge leaves no row of a deleted item in any derived table;
sync-status's view shows the pending purge."""

from __future__ import annotations

import numpy as np
import pytest

from test_db_attach import user_table  # noqa: F401  (fixture)
from test_db_erase import _cell_requests, _collection, _row_requests


def _cells(name):
    from pm_vector.db.resolve.resolution import public_anchor
    from pm_vector.manifold.public_cells import PublicCells
    from pm_vector.protocol.published_codes import unpack

    info = public_anchor(name)[1]
    return (PublicCells.from_dict(info["public_locations"]),
            unpack(info["product_codes"], info["class_rows"]["codes"]["digest"]), info)


def _base_request(name, X, eps, widths, **plan):
    from pm_vector.client.location import PrivateLocationKNN

    cells, pc, info = _cells(name)
    c = PrivateLocationKNN(cells, eps, n_items=int(info["class_rows"]["n_items"]), widths=pc.widths_,
                           collection=name, **plan)
    return c._inject_generator(np.random.default_rng(0)).request(X[0].astype(np.float64))


def _versions(conn, rid):
    """Every derived row of the run as (table, key, xmin): a rewrite changes its xmin."""
    t = f"pm_vector.run_{rid}_"
    return {"locations": conn.execute(f"SELECT level, cell, part, xmin::text FROM {t}locations ORDER BY 1, 2, 3").fetchall(),
            "cells": conn.execute(f"SELECT level, label, cell, xmin::text FROM {t}cells ORDER BY 1, 2, 3").fetchall(),
            "prior": conn.execute(f"SELECT item_id, xmin::text FROM {t}prior ORDER BY 1").fetchall(),
            "hubs": conn.execute(f"SELECT count(*) FROM {t}hubs").fetchall(),
            "neighbors": conn.execute(f"SELECT count(*) FROM {t}neighbors").fetchall()}


def _every_location_answer(name, X, gone, n_left, conn):
    """Every published level, every cell, eps 1 / 4 / 16, two code widths: no answer holds a deleted
    item, each holds min(candidates, items left), and pm_location_shortlist ranks alike."""
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.protocol.location import LocationRequest

    cells, pc, _ = _cells(name)
    seen = 0
    widths = sorted(set(int(w) for w in pc.widths_))
    for k, eps in enumerate((1.0, 4.0, 16.0)):
        for b in (widths[k % len(widths)],):  # (each eps at one width: both widths, three eps)
            base = _base_request(name, X, eps, pc.widths_, max_bytes=4_000).to_dict()
            for M in cells.levels_:
                for r in range(int(M)):
                    q = LocationRequest.from_dict({**base, "level": int(M), "report": r, "code_bytes": b})
                    ans = resolve(name, q, log=False)
                    got = np.asarray(ans["item_ids"], np.int64)
                    assert not set(got.tolist()) & gone, (eps, b, M, r)
                    assert got.size == min(q.candidates, n_left)
                    assert len(ans["codes_data"]) == got.size * b
                    sql = [v for (v,) in conn.execute(
                        "SELECT item_id FROM pm_vector.pm_location_shortlist(%s, %s, %s, %s, %s)",
                        [name, int(M), r, eps, q.candidates]).fetchall()]
                    assert sql == got.tolist()
                    seen += 1
    return seen


def test_a_delete_writes_tombstones_and_no_answer_of_any_release_holds_the_item(db, cname, conn):
    """The exhaustive check after deleting items: every level, cell, eps and code width of the location
    release, the class-rows and cell requests; and the delete rewrote no derived row (the old code
    rewrote the location, cell and prior rows in the delete's transaction)."""
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.db.runs import delta

    X, y, ids, rid = _collection(db, cname, delta=True)
    cell_reqs, row_reqs = _cell_requests(db, cname, X, y), _row_requests(cname, X, y)
    before = [resolve(cname, r, log=False)["rows"] for r in cell_reqs + row_reqs]
    hit = sorted({i for rows in before for r in rows for i in r["item_ids"]})
    top = [int(v) for v in conn.execute(f"SELECT item_ids[1:10] FROM pm_vector.run_{rid}_locations "
                                        "WHERE level = 0").fetchone()[0]]
    gone = np.array(sorted(set(hit[::3][:25]) | set(top[:5])), dtype=np.int64)  # answered items, top hubs
    v0 = _versions(conn, rid)
    out = db.delete_items(cname, item_ids=gone.tolist())
    assert out["deleted"] == gone.size and out["runs"] == [rid]
    assert _versions(conn, rid) == v0  # no derived row rewritten: the work waits for the merge
    assert delta.tombstoned(conn, rid).tolist() == gone.tolist()
    assert conn.execute("SELECT count(*) FROM pm_vector.items WHERE id = ANY(%s)", [gone.tolist()]).fetchone()[0] == 0
    erased = set(gone.tolist())
    assert _every_location_answer(cname, X, erased, len(ids) - gone.size, conn) > 0
    for req in cell_reqs + row_reqs:
        rows = resolve(cname, req, log=False)["rows"]
        assert not erased & {i for r in rows for i in r["item_ids"]}
    # an update's old version is tombstoned too, and its new version is answered from the delta
    from dbtest_helpers import make_extend_fn

    old = int(ids[1]) if int(ids[1]) not in erased else int(ids[2])
    res = db.update_items(cname, item_ids=[old], features=X[:1] * 0.5 + X[3:4] * 0.5, embed_fn_extend=make_extend_fn())
    assert old in delta.tombstoned(conn, rid).tolist() and _versions(conn, rid) == v0
    new = res["item_ids"][old]
    assert conn.execute("SELECT count(*) FROM pm_vector.delta_entries WHERE run_id = %s AND item_id = %s",
                        [rid, new]).fetchone()[0] == len(_cells(cname)[0].levels_)
    _every_location_answer(cname, X, erased | {old}, len(ids) - gone.size, conn)


def _row(conn, rid, level, cell):
    """(ids, h_r, h) of the base row (its parts joined) and of the top hubs, as stored."""
    got = {}
    for lv, it, hb, ch in conn.execute(f"SELECT level, item_ids, hubs, chubs FROM pm_vector.run_{rid}_locations "
                                       "WHERE (level, cell) IN ((0, 0), (%s, %s)) ORDER BY part", [level, cell]):
        a = got.setdefault(int(lv), ([], [], []))
        a[0].extend(it), a[1].extend(hb), a[2].extend(ch)
    return got.get(int(level), ([], [], [])), got.get(0, ([], [], []))


def test_new_items_are_answered_from_the_delta_by_the_same_ranking(db, cname, conn):
    """After deletes and new items (no merge): every cell of every level answers the numpy ranking of
    (base rows minus tombstones) and the cell's delta entries, entry by entry; the SQL function alike;
    a new item ranking within the size is in its own cell's answer; no derived row was rewritten."""
    from dbtest_helpers import make_extend_fn

    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.privacy.location import location_weight
    from pm_vector.protocol.location import LocationRequest
    from pm_vector.shortlist import location_list

    X, y, ids, rid = _collection(db, cname, n=460, delta=True)
    rng = np.random.default_rng(5)
    Xn = (X[:60] + 0.05 * rng.normal(size=X[:60].shape)).astype(np.float32)
    Xn /= np.linalg.norm(Xn, axis=1, keepdims=True)
    v0 = _versions(conn, rid)
    got = db.ingest(cname, Xn, y[:60], embed_fn_extend=make_extend_fn())  # placed in the delta at once
    new = np.asarray(got["item_ids"])
    assert got["placed"] == 60 and db.embed_new_items(cname, make_extend_fn())["n_new"] == 0
    gone = ids[::17]
    db.delete_items(cname, item_ids=gone.tolist())
    assert _versions(conn, rid) == v0
    cells, pc, _ = _cells(cname)
    dead = set(gone.tolist())
    n_left = len(ids) - gone.size + new.size
    base = _base_request(cname, X, 8.0, pc.widths_, max_bytes=6_000).to_dict()
    answered_new = 0
    for M in cells.levels_:
        for r in range(int(M)):
            (rid_, rh, rch), (tid, _th, tch) = _row(conn, rid, int(M), r)
            d = conn.execute("SELECT item_id, h_r, h FROM pm_vector.delta_entries WHERE run_id = %s AND level = %s "
                             "AND cell = %s", [rid, int(M), r]).fetchall()
            keep = [k for k, i in enumerate(rid_) if i not in dead]
            tkeep = [k for k, i in enumerate(tid) if i not in dead]
            want, _ = location_list([rid_[k] for k in keep] + [e[0] for e in d],
                                    [rh[k] for k in keep] + [e[1] for e in d],
                                    [rch[k] for k in keep] + [e[2] for e in d],
                                    [tid[k] for k in tkeep], [tch[k] for k in tkeep], location_weight(8.0),
                                    base["candidates"])
            q = LocationRequest.from_dict({**base, "level": int(M), "report": r})
            got = np.asarray(resolve(cname, q, log=False)["item_ids"], np.int64)
            assert got.tolist() == want.tolist(), (M, r)
            assert got.size == min(q.candidates, n_left)
            sql = [v for (v,) in conn.execute("SELECT item_id FROM pm_vector.pm_location_shortlist(%s, %s, %s, %s, %s)",
                                              [cname, int(M), r, 8.0, q.candidates]).fetchall()]
            assert sql == want.tolist()
            answered_new += len(set(got.tolist()) & set(new.tolist()))
            # a new item of this cell that ranks within the size is in the answer (its own cell's)
            for e in d:
                if e[0] in set(want.tolist()):
                    assert e[0] in set(got.tolist())
    assert answered_new > 0  # new items are answered without `embed --new-items`' rewrite of the rows



class _Received:
    """A connection that keeps every statement's result: what a resolve read, in bytes, row by row."""

    def __init__(self, conn):
        self._conn, self.results = conn, []

    def execute(self, query, *a, **kw):
        cur = self._conn.execute(query, *a, **kw)
        self.results.append(cur)
        return cur

    def __getattr__(self, name):
        return getattr(self._conn, name)

    @property
    def autocommit(self):
        return self._conn.autocommit

    @autocommit.setter
    def autocommit(self, value):
        self._conn.autocommit = value

    def top_hubs_read(self) -> list[int]:
        """The entries of the top hubs row (level 0, cell 0) each binary result carried."""
        out = []
        for cur in self.results:
            res = cur.pgresult
            if res is None or res.nfields < 3 or not res.fformat(0):
                continue
            for r in range(res.ntuples):
                if res.get_value(r, 0) == b"\0\0\0\0" and res.get_value(r, 1) == b"\0\0\0\0":
                    out.append(len(res.get_value(r, 2)) // 12)  # an int8[]'s records: 12 bytes an entry
        return out


def _ranked(conn, rid, M, r, dead, size, eps=4.0):
    """The numpy ranking of cell ``(M, r)``'s whole stored row and top hubs minus ``dead``."""
    from pm_vector.privacy.location import location_weight
    from pm_vector.shortlist import location_list

    (rid_, rh, rch), (tid, _th, tch) = _row(conn, rid, M, r)
    keep = [k for k, i in enumerate(rid_) if i not in dead]
    tkeep = [k for k, i in enumerate(tid) if i not in dead]
    return location_list([rid_[k] for k in keep], [rh[k] for k in keep], [rch[k] for k in keep],
                         [tid[k] for k in tkeep], [tch[k] for k in tkeep], location_weight(eps), size)[0]


def test_a_miss_reads_only_the_top_hubs_an_answer_can_use_and_answers_alike(db, cname, conn):
    """A miss (an answer built) reads at most twice ``candidates`` + (the run's tombstones) of the top hubs
    row, not the whole row (65,536 entries at 10^6 items: most of a miss's time), the first miss only
    (the process holds the prefix: location_cache.ROWS), and still answers
    the numpy ranking of the whole stored rows minus the tombstones, entry by entry, with the first
    top hubs deleted (so that the answer reaches past the first ``candidates`` of them)."""
    from pm_vector.db.postgres import connect
    from pm_vector.db.resolve import location_cache
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.protocol.location import LocationRequest

    X, y, ids, rid = _collection(db, cname, n=460, delta=True)
    cells, pc, _ = _cells(cname)
    base = _base_request(cname, X, 4.0, pc.widths_, max_bytes=2_500).to_dict()
    size = int(base["candidates"])
    top = _row(conn, rid, 0, 0)[1][0]
    assert len(top) == 460 and size < 200
    gone = list(top[:size // 2]) + list(top[size:size + 5])  # among the first top hubs, and just after them
    db.delete_items(cname, item_ids=gone)
    dead = set(gone)
    location_cache.clear_all()
    reads = []
    for M in (int(cells.levels_[0]), int(cells.levels_[-1])):
        for r in range(M):
            want = _ranked(conn, rid, M, r, dead, size)
            with connect() as c:
                seen = _Received(c)
                ans = resolve(cname, LocationRequest.from_dict({**base, "level": M, "report": r}), conn=seen)
            assert not ans["cached"]
            assert np.asarray(ans["item_ids"], np.int64).tolist() == want.tolist(), (M, r)
            reads.append(seen.top_hubs_read())
    assert reads[0] == [2 * (size + len(gone))] and 2 * (size + len(gone)) < len(top)
    assert all(r == [] for r in reads[1:]), reads
    # more tombstones than the held prefix covers: read again (twice what an answer can use), same ranking
    more = [i for i in top[size + 5:] if i not in dead][:size + len(gone) + 10]
    db.delete_items(cname, item_ids=more)
    dead |= set(more)
    M = int(cells.levels_[-1])
    want = _ranked(conn, rid, M, 0, dead, size)
    with connect() as c:
        seen = _Received(c)
        ans = resolve(cname, LocationRequest.from_dict({**base, "level": M, "report": 0}), conn=seen)
    assert np.asarray(ans["item_ids"], np.int64).tolist() == want.tolist()
    assert 2 * (size + len(gone)) < size + len(dead) and seen.top_hubs_read() == [min(len(top), 2 * (size + len(dead)))]

def _ids_of(conn, rid, kind):
    t = f"pm_vector.run_{rid}_{kind}"
    if conn.execute("SELECT to_regclass(%s)", [t]).fetchone()[0] is None:
        return set()
    cols = {"items": ["item_id"], "codes": ["item_id"], "neighbors": ["item_id", "neighbor_id"],
            "hubs": ["item_id"], "prior": ["item_id", "nbrs"], "cells": ["item_ids"], "locations": ["item_ids"]}[kind]
    out = set()
    for c in cols:
        for (v,) in conn.execute(f"SELECT {c} FROM {t}").fetchall():
            out |= set(v) if isinstance(v, list) else {v}
    return out


def test_the_merge_leaves_no_row_of_a_deleted_item_in_any_derived_table(db, cname, conn):
    """Deleted items: tombstones (the pending purge in delta_status, with its age) until the merge;
    after it, 0 rows of them in every table of run_tables() of every run of the collection and in the
    delta; the new items are in the new run's base, answers hold them and no deleted item."""
    from dbtest_helpers import make_embed_fn, make_extend_fn

    from pm_vector.db.runs import delta
    from pm_vector.db.runs.erase import run_tables

    X, y, ids, rid = _collection(db, cname, n=400, delta=True)
    new = np.asarray(db.ingest(cname, X[:30] * 0.9 + X[30:60] * 0.1, y[:30])["item_ids"])
    db.embed_new_items(cname, make_extend_fn())
    gone = ids[::9]
    db.delete_items(cname, item_ids=gone.tolist())
    st = delta.status(conn, cname)
    assert st["pending_purge"] == gone.size and st["purge_age_s"] >= 0 and st["delta_items"] == new.size
    assert all(gone_id in _ids_of(conn, rid, "locations") | _ids_of(conn, rid, "prior") for gone_id in gone[:3].tolist())
    out = db.merge(cname, embed_fn=make_embed_fn(), embed_fn_extend=make_extend_fn())
    assert out["previous_run_id"] == rid and out["merged_tombstones"] == gone.size and rid in out["dropped_runs"]
    runs = [r for (r,) in conn.execute("SELECT r.id FROM pm_vector.embedding_runs r JOIN pm_vector.collections c "
                                       "ON c.id = r.collection_id WHERE c.name = %s", [cname]).fetchall()]
    dead = set(gone.tolist())
    for r in runs:
        for t in run_tables({"status": "ready", "cells": {"status": "ready"},
                             "locations": {"status": "ready"}}):  # every kind a release names
            assert not dead & _ids_of(conn, r, t.kind), (r, t.kind)
    assert conn.execute("SELECT count(*) FROM pm_vector.delta_tombstones WHERE item_id = ANY(%s)",
                        [gone.tolist()]).fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM pm_vector.delta_entries WHERE item_id = ANY(%s)",
                        [gone.tolist()]).fetchone()[0] == 0
    assert set(new.tolist()) <= _ids_of(conn, out["run_id"], "locations")  # in the new base
    st = delta.status(conn, cname)
    assert st["pending_purge"] == 0 and st["purge_age_s"] is None and st["delta_items"] == 0
    _every_location_answer(cname, X, dead, len(ids) - gone.size + new.size, conn)


def test_a_merge_is_due_by_its_setting(db, cname, conn):
    from pm_vector.db.runs.merge import due

    X, y, ids, rid = _collection(db, cname, n=300, delta=True)
    assert not due(conn, cname, {})
    db.delete_items(cname, item_ids=ids[:3].tolist())
    assert not due(conn, cname, {})  # the defaults: 10,000 rows or an hour
    assert due(conn, cname, {"merge": {"delta_items": 3, "pause": 0}})
    assert not due(conn, cname, {"merge": {"delta_items": 4, "age_s": 0, "pause": 0}})
    assert due(conn, cname, {"merge": {"delta_items": 0, "age_s": 1e-9, "pause": 0}})
    # not before the active run has served ``pause`` times its build's time
    built, served = conn.execute("SELECT extract(epoch FROM finished_at - started_at), extract(epoch FROM "
                                 "clock_timestamp() - finished_at) FROM pm_vector.embedding_runs WHERE id = %s",
                                 [rid]).fetchone()
    assert built > 0
    assert not due(conn, cname, {"merge": {"delta_items": 3, "pause": 2 * float(served) / float(built) + 1000}})
    assert due(conn, cname, {"merge": {"delta_items": 3, "pause": 0.5 * float(served) / float(built)}})
    # new items count once each, not once per level of their entries
    from dbtest_helpers import make_extend_fn

    db.ingest(cname, X[:2] * 0.9 + X[2:4] * 0.1, y[:2])
    db.embed_new_items(cname, make_extend_fn())
    n_rows = conn.execute("SELECT count(*) FROM pm_vector.delta_entries WHERE run_id = %s", [rid]).fetchone()[0]
    conn.rollback()
    assert n_rows > 2
    assert not due(conn, cname, {"merge": {"delta_items": 6, "age_s": 0, "pause": 0}})  # 3 tombstones + 2 new items
    assert due(conn, cname, {"merge": {"delta_items": 5, "age_s": 0, "pause": 0}})


def test_the_merge_rule_is_read_and_set_within_its_bounds(db, cname, conn):
    """``pm_vector.db.merge_rule`` / ``pm-vector db merge-rule``: the defaults until a collection sets
    its own; a bad value (type, bound, NaN) is refused before anything is written; the rule set is the
    one the sync worker's ``due_names`` applies; a value written by hand that is not valid falls back
    to the default instead of stopping every collection's merges."""
    import json

    from typer.testing import CliRunner

    from pm_vector import defaults
    from pm_vector.cli import app
    from pm_vector.db.runs.merge import due_names
    from pm_vector.errors import InvalidInputError

    X, y, ids, rid = _collection(db, cname, n=300, delta=True)
    first = db.merge_rule(cname)
    assert first["own"] == {} and first["rule"] == {"delta_items": defaults.MERGE_DELTA_ITEMS,
                                                    "age_s": float(defaults.MERGE_AGE_S),
                                                    "pause": float(defaults.MERGE_PAUSE)} == first["defaults"]
    ends = conn.execute("SELECT finished_at + %s * (finished_at - started_at) FROM pm_vector.embedding_runs "
                        "WHERE id = %s", [float(defaults.MERGE_PAUSE), rid]).fetchone()[0]
    conn.rollback()
    assert first["pause_ends_at"] == ends.isoformat()
    db.delete_items(cname, item_ids=ids[:3].tolist())
    assert cname not in due_names(conn)
    got = db.merge_rule(cname, delta_items=3, pause=0)
    assert got["own"] == {"delta_items": 3, "pause": 0.0} and got["rule"]["age_s"] == float(defaults.MERGE_AGE_S)
    assert cname in due_names(conn)
    got = db.merge_rule(cname, pause=1_000)  # the run has not served 1,000 times its build
    assert got["own"] == {"delta_items": 3, "pause": 1000.0} and cname not in due_names(conn)
    for bad in ({"pause": -1}, {"pause": float("nan")}, {"pause": True}, {"pause": 1_001}, {"age_s": float("inf")},
                {"delta_items": 2.5}, {"delta_items": "5"}, {"delta_items": 10**9 + 1}):
        with pytest.raises(InvalidInputError, match="merge rule"):
            db.merge_rule(cname, **bad)
    assert db.merge_rule(cname)["own"] == {"delta_items": 3, "pause": 1000.0}  # nothing was written
    # by hand, a value of the wrong type: the default in force, and the worker's pass still runs
    conn.execute("UPDATE pm_vector.collections SET settings = jsonb_set(settings, '{merge}', "
                 "'{\"delta_items\": 3, \"pause\": \"soon\"}') WHERE name = %s", [cname])
    conn.commit()
    assert db.merge_rule(cname)["rule"]["pause"] == float(defaults.MERGE_PAUSE)
    due_names(conn)
    runner = CliRunner()
    r = runner.invoke(app, ["db", "merge-rule", cname, "--reset", "--pause", "7", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["own"] == {"pause": 7.0} and out["rule"]["pause"] == 7.0
    r = runner.invoke(app, ["db", "merge-rule", cname, "--pause", "-2"])
    assert r.exit_code == 2 and "error:" in r.output and "Traceback" not in r.output
    assert "merge rule 'pause' must be" in " ".join(r.output.split())
    r = runner.invoke(app, ["db", "merge-rule", cname + "_missing"])
    assert r.exit_code == 2 and "unknown collection" in r.output
    assert db.merge_rule(cname)["own"] == {"pause": 7.0}


def test_a_superseded_run_is_dropped_only_between_two_writes(db, cname, conn):
    """The merge drops a superseded run holding the collection's row as a write does: while a write
    holds it (a sync batch or a delete, which read the runs with tables to tombstone in each), the
    drop waits and the run's tables are still there for that write; once it ends, they go. (A sync
    pass found a table dropped under it so, twice in a 10-minute stream.)"""
    import threading

    from dbtest_helpers import make_embed_fn
    from pm_vector.db.runs.merge import purge_superseded

    X, y, ids, rid = _collection(db, cname, n=300, delta=True)
    db.delete_items(cname, item_ids=ids[:1].tolist())  # a tombstone in the run: the merge drops it once superseded
    assert db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())["run_id"] != rid
    write = db.connect()  # (a transaction: the row stays held until it ends)
    write.execute("SELECT 1 FROM pm_vector.collections WHERE name = %s FOR NO KEY UPDATE", [cname])
    got: list = []
    th = threading.Thread(target=lambda: got.append(purge_superseded(cname)), daemon=True)
    th.start()
    th.join(1.5)
    waited = th.is_alive()
    with db.connect() as c:
        there = c.execute("SELECT to_regclass(%s) IS NOT NULL", [f"pm_vector.run_{rid}_items"]).fetchone()[0]
    write.rollback()  # the write ends
    write.close()
    th.join(60)
    assert waited and there, (waited, there, got)
    assert got == [[rid]]
    assert conn.execute("SELECT to_regclass(%s)", [f"pm_vector.run_{rid}_items"]).fetchone()[0] is None


@pytest.mark.parametrize("n", [0])
def test_the_sql_ranking_reads_the_delta_of_its_run_only(db, cname, conn, n):
    """A tombstone of another run does not hide an item from this run's answers."""
    X, y, ids, rid = _collection(db, cname, n=300, delta=True)
    cells, _, _ = _cells(cname)
    M = int(cells.levels_[0])
    want = [v for (v,) in conn.execute("SELECT item_id FROM pm_vector.pm_location_shortlist(%s, %s, 0, 4, 50)",
                                       [cname, M]).fetchall()]
    conn.execute("INSERT INTO pm_vector.embedding_runs (collection_id, status, params, seed) SELECT collection_id, "
                 "'failed', '{}', 0 FROM pm_vector.embedding_runs WHERE id = %s RETURNING id", [rid])
    other = conn.execute("SELECT max(id) FROM pm_vector.embedding_runs").fetchone()[0]
    conn.execute("INSERT INTO pm_vector.delta_tombstones (run_id, item_id) SELECT %s, unnest(%s::bigint[])",
                 [other, want[:5]])
    got = [v for (v,) in conn.execute("SELECT item_id FROM pm_vector.pm_location_shortlist(%s, %s, 0, 4, 50)",
                                      [cname, M]).fetchall()]
    assert got == want


def test_an_attached_tables_sync_writes_the_delta(db, cname, conn, user_table):  # noqa: F811
    """A sync batch of deletes, vector updates and inserts rewrites no derived row; from its commit no
    location answer holds a deleted or replaced item and the new rows are answered from the delta;
    sync-status shows the pending purge, which the merge clears."""
    from dbtest_helpers import make_embed_fn, make_extend_fn

    from pm_vector.db.runs import delta
    from test_db_attach import _ids_of, _served, _vec

    t, X, y = user_table
    db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding",
                    label_column="category", payload_columns=["title"], dim=6)
    rid = _served(db, cname, X, y, delta=True)
    before = _ids_of(conn, cname)
    v0 = _versions(conn, rid)
    for i in range(2, 60, 3):
        conn.execute(f"DELETE FROM public.{t} WHERE id = %s", [i])
    for i in range(100, 110):
        conn.execute(f"UPDATE public.{t} SET embedding = %s::vector WHERE id = %s", [_vec(X[i + 100]), i])
    for k in range(12):
        conn.execute(f"INSERT INTO public.{t} VALUES (%s, %s::vector, %s, 'new')", [5000 + k, _vec(X[k + 300]),
                                                                                     int(y[k + 300])])
    res = db.sync(cname, embed_fn_extend=make_extend_fn())
    assert res["applied"] == 20 + 10 + 12
    assert _versions(conn, rid) == v0  # the batch rewrote no derived row
    after = _ids_of(conn, cname)
    gone = {before[str(i)] for i in range(2, 60, 3)} | {before[str(i)] for i in range(100, 110)}
    assert set(delta.tombstoned(conn, rid).tolist()) == gone
    st = db.sync_status(cname)
    assert st["pending_purge"] == len(gone) and st["purge_age_s"] >= 0
    new = {after[str(5000 + k)] for k in range(12)} | {after[str(i)] for i in range(100, 110)}
    assert {r[0] for r in conn.execute("SELECT DISTINCT item_id FROM pm_vector.delta_entries WHERE run_id = %s",
                                       [rid]).fetchall()} == new
    _every_location_answer(cname, X, gone, len(after), conn)
    db.merge(cname, embed_fn=make_embed_fn(), embed_fn_extend=make_extend_fn())
    st = db.sync_status(cname)
    assert st["pending_purge"] == 0 and st["purge_age_s"] is None


def test_the_migration_goes_down_and_up(fresh_url):
    """0023's downgrade leaves 0022's schema (no delta tables, attach_status without the purge columns,
    the ranking of before), and the upgrade makes them again."""
    import psycopg
    from alembic import command

    from pm_vector.db.postgres.migrate import alembic_config, upgrade_to_head

    upgrade_to_head(fresh_url)

    def shape():
        with psycopg.connect(fresh_url) as c:
            return (c.execute("SELECT to_regclass('pm_vector.delta_tombstones') IS NOT NULL, "
                              "to_regclass('pm_vector.delta_status') IS NOT NULL").fetchone(),
                    [r[0] for r in c.execute("SELECT attname FROM pg_attribute WHERE attrelid = "
                                             "'pm_vector.attach_status'::regclass AND attnum > 0 ORDER BY attnum")])

    up = shape()
    assert up[0] == (True, True) and up[1][-2:] == ["pending_purge", "purge_age_s"]
    command.downgrade(alembic_config(fresh_url), "0022_privileges")
    down = shape()
    assert down[0] == (False, False) and down[1][-2:] == ["broken", "broken_at"]
    upgrade_to_head(fresh_url)
    assert shape() == up


def _run_embeddings(conn, rid):
    rows = conn.execute(f"SELECT item_id, embedding::text FROM pm_vector.run_{rid}_items ORDER BY item_id").fetchall()
    return np.asarray([r[0] for r in rows]), np.asarray([np.fromstring(r[1].strip("[]"), sep=",") for r in rows])


def _check_estimates(conn, cname, rid, new, Xn, feats, dead):
    """Each new item's entry at every level against numpy brute force: its exact g nearest live run
    items (less ``dead``), ties by id, counted in its own cell."""
    metric = conn.execute("SELECT metric FROM pm_vector.collections WHERE name = %s", [cname]).fetchone()[0]
    eid, E = _run_embeddings(conn, rid)
    cells, _, info = _cells(cname)
    g = int(info["class_rows"]["locations"].get("graph_degree") or 32)
    checked = 0
    for i, x in zip(np.asarray(new).tolist(), Xn):
        e = E[eid == i][0]
        if metric == "l2":
            dist = np.linalg.norm(E - e, axis=1)
        elif metric == "cosine":
            dist = 1 - E @ e / (np.linalg.norm(E, axis=1) * np.linalg.norm(e))
        else:
            dist = -(E @ e)
        dist[(eid == i) | np.isin(eid, list(dead))] = np.inf
        near = eid[np.lexsort((eid, dist))[:g]]
        assert np.isfinite(dist[np.isin(eid, near)]).all()
        for M in cells.levels_:
            own = int(cells.assign(x[None].astype(np.float64), 0, int(M))[0])
            theirs = cells.assign(np.asarray([feats[int(j)] for j in near], np.float64), 0, int(M))
            want = 1.0 + float((theirs == own).sum())
            got = conn.execute("SELECT cell, h_r FROM pm_vector.delta_entries WHERE run_id = %s AND item_id = %s "
                               "AND level = %s", [rid, i, int(M)]).fetchone()
            assert got == (own, want), (i, int(M), got, (own, want))
            checked += 1
    assert checked == len(new) * len(cells.levels_)


def test_new_items_are_estimated_from_their_exact_nearest(db, cname, conn):
    """Each new item's h_r at every level counts its exact g nearest live run items (brute force over
    the run's embeddings less the tombstoned, here in numpy) in its own cell, at any run size (the
    estimate searches the run's embeddings in memory, :mod:`pm_vector.db.runs.run_nearest`; it asked
    the run's HNSW index above 10,000 items): after deletes of many of its nearest, and again for a
    second ingest whose nearest include the first one's new items, some of them deleted (the
    process's entry follows the delta's items and tombstones from one transaction to the next), so
    two databases holding the same run and the same writes place it alike."""
    from dbtest_helpers import make_extend_fn

    X, y, ids, rid = _collection(db, cname, n=700, delta=True)
    rng = np.random.default_rng(11)
    Xn = (X[:80] + 0.05 * rng.normal(size=X[:80].shape)).astype(np.float32)
    Xn /= np.linalg.norm(Xn, axis=1, keepdims=True)
    # tombstoned first: most of the new items' nearest are deleted, the rest must be found (an HNSW scan
    # of ef_search rows filtered by the tombstones afterwards found too few)
    gone = ids[:600]
    db.delete_items(cname, item_ids=gone.tolist())
    new = np.asarray(db.ingest(cname, Xn, y[:80], embed_fn_extend=make_extend_fn())["item_ids"])
    feats = dict(zip(ids.tolist(), X)) | dict(zip(new.tolist(), Xn))
    _check_estimates(conn, cname, rid, new, Xn, feats, set(gone.tolist()))
    # a second write: near the first new items, half of which are deleted first
    db.delete_items(cname, item_ids=new[::2].tolist())
    Xm = (Xn[:40] + 0.02 * rng.normal(size=Xn[:40].shape)).astype(np.float32)
    Xm /= np.linalg.norm(Xm, axis=1, keepdims=True)
    more = np.asarray(db.ingest(cname, Xm, y[:40], embed_fn_extend=make_extend_fn())["item_ids"])
    feats |= dict(zip(more.tolist(), Xm))
    _check_estimates(conn, cname, rid, more, Xm, feats, set(gone.tolist()) | set(new[::2].tolist()))
    # this process's memory of the run (the estimate's) holds no deleted item
    from pm_vector.db.runs import run_nearest

    held = [e for k, e in run_nearest._cache.items() if k[4] == rid]
    assert len(held) == 1 and held[0].ids.size == 700 - 600 + 80 - 40 + 40
    assert not np.isin(held[0].ids, np.concatenate([gone, new[::2]])).any()


def test_two_runs_with_the_same_items_and_writes_place_new_items_alike(db, cname, conn):
    """Two collections holding the same items, each its own run (its own HNSW index, built apart), given
    the same deletes and new items: the same delta entries, level by level, item by item (the
    estimate is exact; the index's random levels could make it differ)."""
    from dbtest_helpers import make_extend_fn

    other = cname + "_b"
    try:
        entries = []
        for name in (cname, other):
            X, y, ids, rid = _collection(db, name, n=900, delta=True)
            rng = np.random.default_rng(5)
            db.delete_items(name, item_ids=ids[::3].tolist())
            Xn = (X[:60] + 0.05 * rng.normal(size=X[:60].shape)).astype(np.float32)
            Xn /= np.linalg.norm(Xn, axis=1, keepdims=True)
            new = np.asarray(db.ingest(name, Xn, y[:60], embed_fn_extend=make_extend_fn())["item_ids"])
            db.delete_items(name, item_ids=new[:10].tolist())
            more = np.asarray(db.ingest(name, Xn[:30] * 0.9 + X[100:130] * 0.1, y[:30],
                                        embed_fn_extend=make_extend_fn())["item_ids"])
            rank = {int(i): k for k, i in enumerate(ids.tolist() + new.tolist() + more.tolist())}
            rows = conn.execute("SELECT item_id, level, cell, h, h_r FROM pm_vector.delta_entries WHERE run_id = %s",
                                [rid]).fetchall()
            entries.append(sorted((rank[int(i)], lv, c, h, hr) for i, lv, c, h, hr in rows))
        assert len(entries[0]) > 0 and entries[0] == entries[1]
    finally:
        db.drop_collection(other, missing_ok=True)


def test_an_item_deleted_while_a_merge_builds_is_tombstoned_at_its_switch(db, cname, conn):
    """Items deleted while a merge's job embeds (after it read them): its switch tombstones them in the
    new run (no list rewritten while the switch holds the collection row, which holds every write);
    no answer holds them from the switch on, and the merge after leaves no row of them anywhere."""
    from dbtest_helpers import make_embed_fn, make_extend_fn

    from pm_vector.db.runs import delta
    from pm_vector.db.runs.erase import run_tables

    X, y, ids, rid = _collection(db, cname, n=400, delta=True)
    db.delete_items(cname, item_ids=ids[:5].tolist())  # (a delta to merge)
    gone = ids[10::20]
    inner = make_embed_fn()

    def embed_and_delete(*args):
        db.delete_items(cname, item_ids=gone.tolist())  # committed while the job runs, after its load
        return inner(*args)

    out = db.merge(cname, embed_fn=embed_and_delete, embed_fn_extend=make_extend_fn())
    new_rid = out["run_id"]
    dead = set(gone.tolist())
    assert dead <= _ids_of(conn, new_rid, "items")  # (the rows stay until the next merge)
    assert set(delta.tombstoned(conn, new_rid).tolist()) == dead
    assert delta.status(conn, cname)["pending_purge"] == gone.size
    info = conn.execute("SELECT n_items, (class_rows ->> 'n_items')::bigint FROM pm_vector.embedding_runs "
                        "WHERE id = %s", [new_rid]).fetchone()
    assert info == (len(ids) - 5 - gone.size,) * 2
    _every_location_answer(cname, X, dead | set(ids[:5].tolist()), len(ids) - 5 - gone.size, conn)
    out2 = db.merge(cname, embed_fn=make_embed_fn(), embed_fn_extend=make_extend_fn())
    assert new_rid in out2["dropped_runs"]
    for t in run_tables({"status": "ready", "cells": {"status": "ready"}, "locations": {"status": "ready"}}):
        assert not dead & _ids_of(conn, out2["run_id"], t.kind), t.kind
    assert delta.status(conn, cname)["pending_purge"] == 0


def test_an_answer_built_on_a_held_set_of_32767_tombstones(db, cname, conn):
    """The tombstones a process holds (TombstoneSets) are counted into the statement's slice of the
    hubs' row as a parameter, beside the answer's size: both below 2^15, psycopg sends them as
    smallints, and where their sum passed 32,767 every answer built on the held set failed with
    "smallint out of range" (a 100,000-item collection whose delta held 32,400 tombstones). The first
    answer, which reads the set, and the next, built on it, answer alike."""
    from pm_vector.db.resolve.location_cache import CACHE, DEAD
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.protocol.location import LocationRequest

    X, y, ids, rid = _collection(db, cname, n=300, delta=True)
    conn.execute("INSERT INTO pm_vector.delta_tombstones (run_id, item_id) SELECT %s, 10000000000 + g "
                 "FROM generate_series(1, 32767) g", [rid])  # (ids of no item: only their count matters)
    conn.execute("UPDATE pm_vector.embedding_runs SET delta_version = delta_version + 1 WHERE id = %s", [rid])
    conn.commit()
    cells, pc, _ = _cells(cname)
    base = _base_request(cname, X, 16.0, pc.widths_, max_bytes=4_000).to_dict()
    M = int(max(cells.levels_))
    got = []
    for _ in range(2):
        CACHE.clear()  # (built again: the second on the set the first read and held)
        got.append(resolve(cname, LocationRequest.from_dict({**base, "level": M, "report": 0}), log=False)["item_ids"])
    assert DEAD.reads >= 1 and list(got[0]) == list(got[1]) and len(got[0]) > 0
