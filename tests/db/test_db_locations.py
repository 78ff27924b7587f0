"""The location release in PostgreSQL (migration 0015): the embedding job publishes the location
cells (fit on the public anchor only) and per-(level, cell) hub counts; resolve() answers a
LocationRequest as the in-memory ranking (:func:`pm_vector.shortlist.location_list` on the rows the
job computed), the SQL function ranks alike, the answer is a public function of the report (the
cache serves the same bytes), bad requests are refused clearly and log nothing, and embed
--new-items extends the rows."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def lserved(pm_home):
    import pm_vector.db as db
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db.resolve.resolution import public_anchor
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.manifold.public_cells import PublicCells
    from pm_vector.protocol.published_codes import unpack

    ds = load_dataset("digits")
    sp = split_dataset(ds, 800, 300, 150, 100, seed=0)
    name = "locations_served"
    db.drop_collection(name, missing_ok=True)
    db.create_collection(name, ds.dim, ds.classes.tolist())
    Xs, ys = sp.server
    ids = db.ingest(name, Xs, ys, payloads=[{"n": i} for i in range(len(ys))])["item_ids"]
    db.register_anchor_set(name, *sp.anchor)
    db.register_anchor_set(name, *sp.dummy, role="dummy")
    db.run_embedding_job(name, {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn)
    info = public_anchor(name)[1]
    cells = PublicCells.from_dict(info["public_locations"])
    pc = unpack(info["product_codes"], info["class_rows"]["codes"]["digest"])
    yield {"name": name, "split": sp, "ids": np.asarray(ids), "cells": cells, "pc": pc, "info": info}
    db.drop_collection(name, missing_ok=True)


def _blobs(n: int, seed: int):
    """``n`` unit rows in 6 dimensions, three classes each pushed along its own axis."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    X = rng.normal(size=(n, 6)) + 2.0 * np.eye(6)[y]
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32), y


def _small_run(db, cname, X, y, items, anchor, dummy, delta=False):
    """A collection of ``_blobs`` rows: ``items`` ingested, ``anchor``/``dummy`` its anchor sets, one
    job (dbtest_helpers.make_embed_fn). Returns (the item ids, the run id). ``delta`` False: writes
    rewrite the location rows in their transaction (what these tests check; tests/db/test_db_delta.py:
    the delta)."""
    from dbtest_helpers import make_embed_fn

    db.create_collection(cname, 6, [0, 1, 2], settings={"delta": delta})
    ids = np.asarray(db.ingest(cname, X[items], y[items])["item_ids"])
    db.register_anchor_set(cname, X[anchor], y[anchor])
    db.register_anchor_set(cname, X[dummy], y[dummy], role="dummy")
    return ids, db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())["run_id"]


def _request(served, eps, x, **plan):
    from pm_vector.client.location import PrivateLocationKNN
    from pm_vector.privacy import secure_generator

    c = PrivateLocationKNN(served["cells"], eps, n_items=len(served["ids"]), widths=served["pc"].widths_,
                           collection=served["name"], **plan)
    return c._inject_generator(secure_generator(7)).request(x)


def test_the_job_publishes_location_cells_fit_on_the_public_anchor(lserved, conn):
    from pm_vector.manifold.public_cells import fit_location_cells

    doc = lserved["info"]["class_rows"]["locations"]
    Xa = np.asarray(lserved["split"].anchor[0], np.float32).astype(np.float64)
    assert doc["status"] == "ready" and doc["digest"] == lserved["cells"].digest()
    assert lserved["cells"].classes_.tolist() == [0] and doc["levels"] == list(lserved["cells"].levels_)
    assert fit_location_cells(Xa).digest() == doc["digest"]  # a function of the public anchor alone
    rid = lserved["info"]["run_id"]
    n = conn.execute(f"SELECT count(*), max(cardinality(item_ids)) FROM pm_vector.run_{rid}_locations "
                     "WHERE level = 0").fetchone()
    assert n == (1, len(lserved["ids"]))  # the top hubs row ranks every item


def test_the_jobs_tables_are_written_frozen_and_the_locations_indexed_after(lserved, db):
    """A job creates each table it fills in the transaction that fills it and writes its rows frozen
    (``COPY ... FREEZE``, :func:`pm_vector.db._binary.copy_options`): the pages are all-visible from
    the start (those a COPY began empty: it writes 1,000 rows at a time, and a narrow table's page
    that the next thousand finds begun is left to vacuum; written the old way, none), so no vacuum or
    first reader writes them again. The locations table gets its primary key and its index on
    ``part``, with their names, once its rows are in (migration 0031)."""
    from psycopg import sql

    from pm_vector.db.run_tables import run_table

    rid = lserved["info"]["run_id"]
    with db.connect() as c:
        c.autocommit = True
        for kind in ("items", "anchors", "codes", "neighbors", "hubs", "cells", "locations", "prior_0"):
            c.execute(sql.SQL("ANALYZE {}").format(run_table(rid, kind)))
            pages, visible = c.execute("SELECT relpages, relallvisible FROM pg_class WHERE oid = to_regclass(%s)",
                                       [f"pm_vector.run_{rid}_{kind}"]).fetchone()
            assert pages > 0 and visible >= 0.6 * pages, (kind, pages, visible)
        got = {r[0]: (r[1], r[2]) for r in c.execute(
            "SELECT x.relname, i.indisprimary, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class x "
            "ON x.oid = i.indexrelid WHERE i.indrelid = to_regclass(%s)", [f"pm_vector.run_{rid}_locations"]).fetchall()}
    assert got[f"run_{rid}_locations_pkey"][0] is True and "(level, cell, part)" in got[f"run_{rid}_locations_pkey"][1]
    assert got[f"run_{rid}_locations_by_part"][0] is False and "(part)" in got[f"run_{rid}_locations_by_part"][1]
    assert len(got) == 2


@pytest.mark.parametrize("eps", [1.0, 8.0, float("inf")])
def test_resolve_answers_the_in_memory_ranking_and_sql_alike(lserved, conn, eps):
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.privacy.location import location_weight
    from pm_vector.shortlist import location_list

    rid = lserved["info"]["run_id"]
    Xq = lserved["split"].query[0]
    for i in range(4):
        req = _request(lserved, eps, Xq[i], max_bytes=20_000)
        rows = {}  # a row's parts joined (the top hubs: one part)
        for lv, c, it, hb, ch in conn.execute(
                f"SELECT level, cell, item_ids, hubs, chubs FROM pm_vector.run_{rid}_locations "
                "WHERE (level, cell) IN ((0, 0), (%s, %s)) ORDER BY part", [req.level, req.report]).fetchall():
            got = rows.get((lv, c), ([], [], []))
            rows[(lv, c)] = (got[0] + list(it), got[1] + list(hb), got[2] + list(ch))
        want, _ = location_list(*rows[(req.level, req.report)], rows[(0, 0)][0], rows[(0, 0)][2],
                                location_weight(eps), req.candidates)
        ans = resolve(lserved["name"], req, log=False)
        got = np.asarray(ans["item_ids"], np.int64)
        assert got.tolist() == want.tolist() and got.size == min(req.candidates, len(lserved["ids"]))
        assert len(ans["codes_data"]) == got.size * req.code_bytes
        # the plan's width of the stored codes (a residual prefix or a wide table's span), in rank order
        codes = {int(a): bytes(b) for a, b in conn.execute(
            f"SELECT item_id, code FROM pm_vector.run_{rid}_codes WHERE item_id = ANY(%s)", [got.tolist()])}
        off, w = lserved["pc"].span(req.code_bytes)
        assert ans["codes_data"] == b"".join(codes[int(v)][off:off + w] for v in got)
        assert ans["payloads"] is not None and len(ans["payloads"]) == got.size
        sql = [r[0] for r in conn.execute("SELECT item_id FROM pm_vector.pm_location_shortlist(%s, %s, %s, %s, %s)",
                                          [lserved["name"], req.level, req.report, eps, req.candidates])]
        assert sql == want.tolist()


def test_the_answer_is_a_public_function_of_the_report(lserved):
    """Two different queries that report the same cell get byte-identical answers (the second from
    the cache), and nothing of either query but the report reaches the server."""
    from pm_vector.db.resolve.location_cache import CACHE
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.protocol.location import LocationRequest

    Xq = lserved["split"].query[0]
    a = _request(lserved, 2.0, Xq[0], max_bytes=20_000)
    b = LocationRequest.from_dict({**_request(lserved, 2.0, Xq[5], max_bytes=20_000).to_dict(), "report": a.report})
    CACHE.clear()
    ra, rb = resolve(lserved["name"], a, log=False), resolve(lserved["name"], b, log=False)
    assert not ra["cached"] and rb["cached"]
    assert ra["item_ids"].tolist() == rb["item_ids"].tolist() and ra["codes_data"] == rb["codes_data"]


def test_bad_location_requests_are_refused_clearly_and_nothing_is_logged(lserved, conn):
    from pm_vector.db.errors import CellsDigestMismatchError
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.errors import InvalidInputError, RequestError
    from pm_vector.protocol.location import LocationRequest

    name = lserved["name"]
    before = conn.execute("SELECT count(*) FROM pm_vector.request_log").fetchone()[0]
    req = _request(lserved, 4.0, lserved["split"].query[0][0]).to_dict()
    with pytest.raises(CellsDigestMismatchError, match="fetch the current public anchor"):
        resolve(name, {**req, "locations_digest": "0" * 64})
    with pytest.raises(RequestError, match="published levels"):
        resolve(name, {**req, "level": 3, "report": 0})
    with pytest.raises(RequestError, match="published code widths"):
        resolve(name, {**req, "code_bytes": 17})
    for bad in ({"report": req["level"]}, {"candidates": 0}, {"candidates": 1 << 17}, {"delta": 1e-5},
                {"release": "cells"}, {"epsilon": -1}, {"extra": 1}):
        with pytest.raises(InvalidInputError):
            resolve(name, {**req, **bad})
    with pytest.raises(InvalidInputError):
        LocationRequest.from_dict({**req, "report": True})
    assert conn.execute("SELECT count(*) FROM pm_vector.request_log").fetchone()[0] == before


def test_new_items_extend_the_location_rows(db, cname, conn):
    from dbtest_helpers import check_location_parts, make_extend_fn

    from pm_vector.db.resolve.resolution import public_anchor, resolve

    X, y = _blobs(700, 3)
    _, rid = _small_run(db, cname, X, y, np.s_[:600], np.s_[:90], np.s_[90:120])
    new = np.asarray(db.ingest(cname, X[600:], y[600:])["item_ids"])
    assert check_location_parts(conn, rid) > 0  # (600 items: rows in parts)
    db.embed_new_items(cname, make_extend_fn())
    assert check_location_parts(conn, rid) > 0  # the new items in their parts' lists, their entries in their parts
    # every level's rows count every item once (itself) and its 32 neighbours' lists: new ones included
    for lv, total in conn.execute(f"SELECT level, sum((SELECT sum(h) FROM unnest(hubs) h)) FROM "
                                  f"pm_vector.run_{rid}_locations WHERE level > 0 GROUP BY level").fetchall():
        assert total >= 600 * 33 + 100 * 33 - 100  # the new items' lists and themselves (rows cut nothing here)
    info = public_anchor(cname)[1]
    from pm_vector.client.location import PrivateLocationKNN
    from pm_vector.manifold.public_cells import PublicCells
    from pm_vector.privacy import secure_generator

    cells = PublicCells.from_dict(info["public_locations"])
    c = PrivateLocationKNN(cells, 16.0, n_items=700, widths=(16, 32), collection=cname, max_bytes=10_000)
    got = set()
    for i in range(600, 700, 10):
        req = c._inject_generator(secure_generator(i)).request(X[i].astype(np.float64))
        got |= set(np.asarray(resolve(cname, req, log=False)["item_ids"]).tolist())
    assert got & set(new.tolist())  # new items reach the answers


def test_a_delete_leaves_every_location_row_and_answer(db, cname, conn):
    """Erasure reaches the location rows: no row holds a deleted id, and no answer at any level and
    report lists one; the answers keep their size (the ranking refills them)."""
    from dbtest_helpers import check_location_parts

    from pm_vector.db.resolve.resolution import public_anchor, resolve
    from pm_vector.client.location import PrivateLocationKNN
    from pm_vector.manifold.public_cells import PublicCells
    from pm_vector.protocol.location import LocationRequest

    X, y = _blobs(500, 5)
    ids, rid = _small_run(db, cname, X, y, np.s_[:400], np.s_[400:480], np.s_[480:])
    gone = ids[::10]
    db.delete_items(cname, item_ids=gone.tolist())
    left = conn.execute(f"SELECT count(*) FROM pm_vector.run_{rid}_locations WHERE item_ids && %s::bigint[]",
                        [gone.tolist()]).fetchone()[0]
    assert left == 0
    assert check_location_parts(conn, rid) > 0  # the erased items left their parts' lists too
    info = public_anchor(cname)[1]
    cells = PublicCells.from_dict(info["public_locations"])
    req = PrivateLocationKNN(cells, 8.0, n_items=400 - gone.size, widths=(16, 32), collection=cname,
                             max_bytes=5_000)._inject_generator(np.random.default_rng(0)).request(X[0].astype(float))
    for M in cells.levels_[:4]:
        for r in range(M):
            q = LocationRequest.from_dict({**req.to_dict(), "level": int(M), "report": r})
            got = np.asarray(resolve(cname, q, log=False)["item_ids"], np.int64)
            assert not set(got.tolist()) & set(gone.tolist())
            assert got.size == min(q.candidates, 400 - gone.size)


def test_a_repeated_request_takes_one_statement_and_sees_every_change_of_the_run(db, cname, conn):
    """A request this process has answered before is logged in one statement and answered from the
    cache; once the run's document changes (here: a delete), the next request takes the full path
    and its answer holds no deleted item. Every answer is logged exactly once."""
    from pm_vector.client.location import PrivateLocationKNN
    from pm_vector.db.postgres import connect
    from pm_vector.db.resolve.resolution import public_anchor, resolve
    from pm_vector.manifold.public_cells import PublicCells

    X, y = _blobs(400, 6)
    _small_run(db, cname, X, y, np.s_[:300], np.s_[300:380], np.s_[380:], delta=True)  # (the delta's version)
    info = public_anchor(cname)[1]
    cells = PublicCells.from_dict(info["public_locations"])
    req = PrivateLocationKNN(cells, 8.0, n_items=300, widths=(16, 32), collection=cname,
                             max_bytes=3_000)._inject_generator(np.random.default_rng(1)).request(X[0].astype(float))

    def logged():
        return conn.execute("SELECT count(*) FROM pm_vector.request_log WHERE collection_name = %s",
                            [cname]).fetchone()[0]

    with connect() as pooled:  # a connection kept between requests, as the service's pool does
        first = resolve(cname, req, conn=pooled)
        again = resolve(cname, req, conn=pooled)
        assert "shortlist" in first["timings_ms"] and "shortlist" not in again["timings_ms"]  # one statement
        assert again["cached"] and np.array_equal(first["item_ids"], again["item_ids"])
        assert again["codes_data"] == first["codes_data"] and again["request_log_id"] > first["request_log_id"]
        assert logged() == 2
        gone = np.asarray(first["item_ids"], np.int64)[:3].tolist()
        db.delete_items(cname, item_ids=gone)
        after = resolve(cname, req, conn=pooled)
        assert "shortlist" in after["timings_ms"] and not set(np.asarray(after["item_ids"]).tolist()) & set(gone)
        assert logged() == 3
        assert "shortlist" not in resolve(cname, req, conn=pooled)["timings_ms"] and logged() == 4



def test_a_collection_without_payloads_answers_codes_alone_until_one_is_stored(db, cname, conn):
    """A collection that never stored a payload builds its answers from the codes alone (no join of
    the items); once an update stores a payload on an answered item, the next answer of the same
    report, on the same kept connection, carries it -- and the codes stay the same."""
    from pm_vector.client.location import PrivateLocationKNN
    from pm_vector.db.postgres import connect
    from pm_vector.db.resolve import location_resolution
    from pm_vector.db.resolve.resolution import public_anchor, resolve
    from pm_vector.manifold.public_cells import PublicCells

    X, y = _blobs(400, 8)
    _small_run(db, cname, X, y, np.s_[:300], np.s_[300:380], np.s_[380:], delta=True)
    info = public_anchor(cname)[1]
    req = PrivateLocationKNN(PublicCells.from_dict(info["public_locations"]), 8.0, n_items=300, widths=(16, 32),
                             collection=cname, max_bytes=3_000)._inject_generator(np.random.default_rng(2)).request(
        X[0].astype(float))
    with connect() as pooled:
        location_resolution.CACHE.clear()
        first = resolve(cname, req, conn=pooled)
        assert first["payloads"] is None and len(first["item_ids"])
        item = int(np.asarray(first["item_ids"], np.int64)[0])
        db.update_items(cname, item_ids=[item], payloads=[{"tag": "x"}])
        after = resolve(cname, req, conn=pooled)
    assert after["payloads"] is not None and not after["cached"]
    k = np.asarray(after["item_ids"], np.int64).tolist().index(item)
    assert after["payloads"][k] == {"tag": "x"} and sum(p is not None for p in after["payloads"]) == 1
    assert after["codes_data"] == first["codes_data"] and np.array_equal(after["item_ids"], first["item_ids"])


class _Calls:
    """A connection that counts what a resolve asks of it: statements, cursors and commits; ``then``
    runs after the statement numbered ``at`` (1-based)."""

    def __init__(self, conn, at=None, then=None):
        self._conn, self.statements, self.other = conn, 0, 0
        self._at, self._then = at, then

    def execute(self, query, *a, **kw):
        cur = self._conn.execute(query, *a, **kw)
        self.statements += 1
        if self.statements == self._at:
            self._then()
        return cur

    def cursor(self, *a, **kw):
        self.other += 1
        return self._conn.cursor(*a, **kw)

    def commit(self):
        self.other += 1
        return self._conn.commit()

    def __getattr__(self, name):
        return getattr(self._conn, name)

    @property
    def autocommit(self):
        return self._conn.autocommit

    @autocommit.setter
    def autocommit(self, value):
        self._conn.autocommit = value


def test_a_miss_of_a_known_run_takes_three_statements_and_a_write_in_between_discards_it(db, cname, conn):
    """Once a process knows the collection's run, a report it has not answered yet is built and logged
    in three statements (the row, the codes, the conditional log: no BEGIN, snapshot read or COMMIT),
    answers the full path's bytes, and is cached; built again with the base row and codes held
    (location_cache.ROWS, CODES), in two (the cell's delta entries, the log), the same bytes; a write that commits between the build and the log
    (here a delete of one of the answer's items) discards what was built: the answer comes from the
    full path, holds no deleted item, and each request is logged once."""
    from pm_vector.client.location import PrivateLocationKNN
    from pm_vector.db.postgres import connect
    from pm_vector.db.resolve import location_cache, location_resolution
    from pm_vector.db.resolve.resolution import public_anchor, resolve
    from pm_vector.manifold.public_cells import PublicCells
    from pm_vector.protocol.location import LocationRequest

    X, y = _blobs(400, 8)
    _small_run(db, cname, X, y, np.s_[:300], np.s_[300:380], np.s_[380:], delta=True)
    info = public_anchor(cname)[1]
    cells = PublicCells.from_dict(info["public_locations"])
    base = PrivateLocationKNN(cells, 8.0, n_items=300, widths=(16, 32), collection=cname, max_bytes=3_000)._inject_generator(
        np.random.default_rng(2)).request(X[0].astype(float)).to_dict()
    M = int(base["level"])
    reqs = [LocationRequest.from_dict({**base, "report": r}) for r in range(M)]
    assert M >= 3

    def logged():
        return conn.execute("SELECT count(*) FROM pm_vector.request_log WHERE collection_name = %s",
                            [cname]).fetchone()[0]

    location_resolution.CACHE.clear()
    with connect() as pooled:
        resolve(cname, reqs[0], conn=pooled)  # the process learns the run
        want = resolve(cname, reqs[1], log=False)  # the full path (no log: no known path), on its own connection
        location_cache.clear_all()
        location_resolution._KNOWN.clear()
        resolve(cname, reqs[0], conn=pooled)  # (learnt again: the caches of rows and codes emptied)
        location_resolution.CACHE.clear()
        location_cache.ROWS.clear()
        location_cache.CODES.clear()
        seen = _Calls(pooled)
        got = resolve(cname, reqs[1], conn=seen)
        assert (seen.statements, seen.other) == (3, 0) and not got["cached"]
        assert np.array_equal(got["item_ids"], want["item_ids"]) and got["codes_data"] == want["codes_data"]
        assert got["payloads"] == want["payloads"] and got["n_items"] == want["n_items"]
        location_resolution.CACHE.clear()  # built again on the row and codes the miss kept
        seen = _Calls(pooled)
        again = resolve(cname, reqs[1], conn=seen)
        assert (seen.statements, seen.other) == (2, 0) and not again["cached"]
        assert np.array_equal(again["item_ids"], want["item_ids"]) and again["codes_data"] == want["codes_data"]
        assert resolve(cname, reqs[1], conn=pooled)["cached"] and logged() == 5

        full = resolve(cname, reqs[2], log=False)
        location_resolution.CACHE.clear()
        victim = int(np.asarray(full["item_ids"], np.int64)[0])
        seen = _Calls(pooled, at=1, then=lambda: db.delete_items(cname, item_ids=[victim]))
        got = resolve(cname, reqs[2], conn=seen)
        assert victim not in set(np.asarray(got["item_ids"], np.int64).tolist()) and not got["cached"]
        assert "shortlist" in got["timings_ms"] and seen.other > 0  # the full path answered
        assert logged() == 6
        again = resolve(cname, reqs[2], conn=pooled)
        assert again["cached"] and np.array_equal(again["item_ids"], got["item_ids"]) and logged() == 7

def test_the_downgrade_of_migration_0018_joins_each_rows_parts(lserved, db):
    """sql/0018_location_parts_drop.sql (in a transaction rolled back): each (level, cell) becomes one
    row holding exactly its parts' entries, the top hubs keep their order, and the rows of level -1
    go."""
    from pm_vector.db.postgres.migrate import execute_sql_file

    rid = lserved["info"]["run_id"]
    t = f"pm_vector.run_{rid}_locations"
    with db.connect() as c:
        before = {}
        for lv, cell, ids, h, ch in c.execute(f"SELECT level, cell, item_ids, hubs, chubs FROM {t} WHERE level >= 0 "
                                              "ORDER BY level, cell, part").fetchall():
            before.setdefault((lv, cell), []).extend(zip(ids, h, ch))
        n_book = c.execute(f"SELECT count(*) FROM {t} WHERE level = -1").fetchone()[0]
        assert n_book > 0 and len(before) < c.execute(f"SELECT count(*) FROM {t} WHERE level >= 0").fetchone()[0]
        execute_sql_file(c, "0018_location_parts_drop.sql")
        after = {(lv, cell): list(zip(ids, h, ch)) for lv, cell, ids, h, ch in c.execute(
            f"SELECT level, cell, item_ids, hubs, chubs FROM {t}").fetchall()}
        cols = [r[0] for r in c.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                                        "AND NOT attisdropped", [t]).fetchall()]
        c.rollback()
    assert "part" not in cols and set(after) == set(before)  # no level -1 row, one row per (level, cell)
    assert after[(0, 0)] == before[(0, 0)]  # the top hubs in rank order
    assert all(sorted(after[k]) == sorted(v) for k, v in before.items())


def test_placing_new_items_refuses_rows_that_do_not_place_their_neighbours(db, cname, conn):
    """A run whose level -1 rows lost items (a damaged table): placing new items stops with a clear
    error naming the fix, and the run is unchanged (nothing placed where an erasure would miss it)."""
    from dbtest_helpers import make_extend_fn

    from pm_vector.db.errors import EmbeddingJobError

    X, y = _blobs(400, 4)
    _, rid = _small_run(db, cname, X, y, np.s_[:300], np.s_[:60], np.s_[60:90])
    conn.execute(f"DELETE FROM pm_vector.run_{rid}_locations WHERE level = -1")
    db.ingest(cname, X[300:], y[300:])
    with pytest.raises(EmbeddingJobError, match="run a full embedding job"):
        db.embed_new_items(cname, make_extend_fn())
    assert conn.execute(f"SELECT count(*) FROM pm_vector.run_{rid}_items").fetchone()[0] == 300


def test_an_erasure_reaches_items_the_part_lists_lost(db, cname, conn):
    """An erased item that the level -1 rows no longer place (a damaged table) still leaves every
    location row: the erasure reads every row that lists it instead of its part's."""
    X, y = _blobs(400, 8)
    ids, rid = _small_run(db, cname, X, y, np.s_[:300], np.s_[300:380], np.s_[380:])
    t = f"pm_vector.run_{rid}_locations"
    gone = ids[[5]]
    conn.execute(f"UPDATE {t} SET item_ids = array_remove(item_ids, %s), hubs = hubs[1:cardinality(item_ids) - 1], "
                 f"chubs = chubs[1:cardinality(item_ids) - 1] WHERE level = -1 AND %s = ANY(item_ids)",
                 [int(gone[0]), int(gone[0])])
    assert conn.execute(f"SELECT count(*) FROM {t} WHERE level > 0 AND item_ids && %s::bigint[]",
                        [gone.tolist()]).fetchone()[0] > 0
    db.delete_items(cname, item_ids=gone.tolist())
    assert conn.execute(f"SELECT count(*) FROM {t} WHERE item_ids && %s::bigint[]", [gone.tolist()]).fetchone()[0] == 0
