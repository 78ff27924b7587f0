"""The cell and location rows a syncing process keeps from one batch to the next
(pm_vector.db.runs.row_cache): batches that reuse them leave exactly the rows that batches reading
every row from the tables leave; a row changed behind the process's back, a run changed by another
process, and a batch that fails are never trusted."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from test_db_attach import _served, _vec
from test_db_attach_sync import _changes


def _table(conn, X, y):
    t = "docs_" + uuid.uuid4().hex[:8]
    conn.execute(f"CREATE TABLE public.{t} (id bigint PRIMARY KEY, embedding vector, category int, title text)")
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO public.{t} VALUES (%s, %s::vector, %s, %s)",
                        [(i + 1, _vec(X[i]), int(y[i]), f"doc {i + 1}") for i in range(400)])
    conn.commit()
    return t


def _rows(conn, name, rid):
    """The run's cell and location rows with every item named by its key in the user's table:
    (kind, row key) -> [(key, h_r, h)], in the stored order."""
    ext = {r[0]: r[1] for r in conn.execute(
        "SELECT i.id, i.external_id FROM pm_vector.items i JOIN pm_vector.collections c ON c.id = i.collection_id "
        "WHERE c.name = %s", [name]).fetchall()}
    out = {}
    for kind, keys in (("cells", "level, label, cell"), ("locations", "level, cell, part")):
        for *k, ids, hubs, chubs in conn.execute(f"SELECT {keys}, item_ids, hubs, chubs FROM pm_vector.run_{rid}_{kind}"):
            out[(kind, tuple(k))] = [(ext[i], h, c) for i, h, c in zip(ids, hubs, chubs)]
    conn.rollback()
    return out


@pytest.mark.slow
def test_batches_that_reuse_kept_rows_leave_the_rows_of_batches_that_read_them(db, conn):
    from dbtest_helpers import check_location_parts, make_extend_fn

    from pm_vector.db.runs import row_cache

    rng = np.random.default_rng(5)
    y = rng.integers(0, 3, 400)
    X = rng.normal(size=(400, 6)) + 2.0 * np.eye(6)[y]
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    names, runs, tables = [], [], []
    for _ in range(2):  # the same table twice: one synced with the kept rows, one reading every row
        t = _table(conn, X, y)
        name = "rc_" + uuid.uuid4().hex[:8]
        db.attach_table(name, table=f"public.{t}", id_column="id", vector_column="embedding",
                        label_column="category", payload_columns=["title"], dim=6)
        names.append(name)
        tables.append(t)
        runs.append(_served(db, name, X, y))
    kept_run, cold_run = runs
    try:
        assert _rows(conn, names[0], kept_run) == _rows(conn, names[1], cold_run)  # (the same job)
        rngs = [np.random.default_rng(17), np.random.default_rng(17)]
        nxt = [6000, 6000]
        before = row_cache.reused
        for b in range(4):
            for j in range(2):
                nxt[j] = _changes(conn, tables[j], X, y, rngs[j], 30, nxt[j])
                conn.commit()
            assert db.sync(names[0], embed_fn_extend=make_extend_fn())["applied"] == 30
            row_cache.forget(cold_run)
            assert db.sync(names[1], embed_fn_extend=make_extend_fn())["applied"] == 30
            row_cache.forget(cold_run)
            if b:  # the kept run's batches after the first took their rows from the cache
                assert row_cache.reused > before
            check_location_parts(conn, kept_run)
            assert _rows(conn, names[0], kept_run) == _rows(conn, names[1], cold_run), f"after batch {b + 1}"
        assert row_cache.kept_rows() > 0
    finally:
        for name, t in zip(names, tables):
            db.drop_collection(name)
            conn.execute(f"DROP TABLE IF EXISTS public.{t}")
        conn.commit()


def test_kept_rows_changed_behind_the_process_or_by_another_version_are_not_used(db, cname, conn):
    from dbtest_helpers import make_extend_fn

    from pm_vector.db.run_tables import run_table
    from pm_vector.db.runs import array_rows, row_cache
    from pm_vector.db.store.deletes import runs_with_tables

    rng = np.random.default_rng(5)
    y = rng.integers(0, 3, 400)
    X = rng.normal(size=(400, 6)) + 2.0 * np.eye(6)[y]
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    t = _table(conn, X, y)
    try:
        db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding",
                        label_column="category", payload_columns=["title"], dim=6)
        rid = _served(db, cname, X, y)
        row_cache.forget()
        _changes(conn, t, X, y, np.random.default_rng(3), 20, 6000)
        conn.commit()
        assert db.sync(cname, embed_fn_extend=make_extend_fn())["applied"] == 20
        n = row_cache.kept_rows()
        assert n > 0
        coll = conn.execute("SELECT id FROM pm_vector.collections WHERE name = %s", [cname]).fetchone()[0]

        def seeded():
            runs = runs_with_tables(conn, coll)
            kept = row_cache.Kept(conn, runs)
            with array_rows.deferred(conn):
                got = kept.seed(conn)
                held = {tb: array_rows.held(conn, tb) for tb in kept.tables}
            conn.rollback()  # (a batch that fails: nothing is kept again)
            return got, held

        # one cell row changed by another writer (its xmin changes): every other row is used, not that one
        key = conn.execute(f"SELECT level, label, cell FROM pm_vector.run_{rid}_cells WHERE cardinality(item_ids) > 1 "
                           "ORDER BY level DESC, label, cell LIMIT 1").fetchone()
        conn.execute(f"UPDATE pm_vector.run_{rid}_cells SET item_ids = item_ids[2:], hubs = hubs[2:], chubs = chubs[2:] "
                     "WHERE (level, label, cell) = (%s, %s, %s)", list(key))
        conn.commit()
        got, held = seeded()
        assert got == n - 1
        cells = held[run_table(rid, "cells")]  # (the table as an identifier: pm_vector.db.run_tables)
        assert tuple(key) not in cells[0] and cells[1] is False  # (not every row: the changed one is read again)
        # the entry went with the batch that took it: a failed batch leaves nothing kept
        assert row_cache.kept_rows() == 0 and seeded()[0] == 0
        # a sync rebuilds it; a new version of the run (another process's change) makes it miss
        _changes(conn, t, X, y, np.random.default_rng(4), 5, 7000)
        conn.commit()
        assert db.sync(cname, embed_fn_extend=make_extend_fn())["applied"] == 5
        assert row_cache.kept_rows() > 0
        conn.execute("UPDATE pm_vector.embedding_runs SET class_rows = jsonb_set(class_rows, '{graph_version}', "
                     "to_jsonb((class_rows->>'graph_version')::int + 1)) WHERE id = %s", [rid])
        conn.commit()
        assert seeded()[0] == 0
    finally:
        row_cache.forget()
        conn.execute(f"DROP TABLE IF EXISTS public.{t}")
        conn.commit()
