"""A run's delta sets as a process holds them (pm_vector/db/runs/delta_sets.py): at every point checked
-- after this process's own writes, committed, rolled back or still in the caller's transaction,
after another process's write (made here by plain SQL, which records nothing), and after a
rolled-back write whose version another write took again -- what ``DeltaSets.current`` returns is
what the tables hold, read whole in the same transaction; and it reads them whole only when another
process wrote."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from test_db_delta import _cells
from test_db_erase import _collection


@pytest.fixture
def reads(monkeypatch):
    """The connections the sets were read whole on, one per read."""
    from pm_vector.db.runs import delta_sets

    n: list = []
    whole = delta_sets.tombstoned

    def counted(conn, run_id, ids=None):
        if ids is None:
            n.append(conn)
        return whole(conn, run_id, ids)

    monkeypatch.setattr(delta_sets, "tombstoned", counted)
    return n


def _check(conn, sets, rid, level):
    """``sets.current`` in the caller's transaction against the tables read whole in it."""
    from pm_vector.db.runs import delta_sets

    v, x, created = conn.execute("SELECT delta_version, pg_current_xact_id_if_assigned()::text, created_at "
                                 "FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()
    dead, placed = sets.current(conn, rid, created, level, v, x)
    truth = ([r[0] for r in conn.execute("SELECT item_id FROM pm_vector.delta_tombstones WHERE run_id = %s "
                                         "ORDER BY 1", [rid]).fetchall()], delta_sets.placed(conn, rid, level).tolist())
    assert (dead.tolist(), placed.tolist()) == truth
    # what an entry drops by (run_nearest.get): every id tombstoned is in some call's fresh ids since the
    # last call that read the sets whole (fresh None)
    fresh = sets.fresh
    dropped = _DROPPED[id(sets)] = (set(dead.tolist()) if fresh is None
                                    else _DROPPED.get(id(sets), set()) | set(fresh.tolist()))
    assert set(dead.tolist()) <= dropped
    return truth


_DROPPED: dict = {}


def _foreign_write(url, rid, item):
    """Another process's delta write: a tombstone and the version's bump, recorded nowhere here."""
    with psycopg.connect(url) as other:
        other.execute("INSERT INTO pm_vector.delta_tombstones (run_id, item_id) VALUES (%s, %s)", [rid, int(item)])
        other.execute("UPDATE pm_vector.embedding_runs SET delta_version = delta_version + 1, n_items = n_items - 1 "
                      "WHERE id = %s", [rid])


def test_the_held_sets_are_the_tables_after_every_kind_of_write(db, cname, reads):
    from dbtest_helpers import make_extend_fn
    from pm_vector.db.runs import delta
    from pm_vector.db.runs.delta_sets import DeltaSets

    X, y, ids, rid = _collection(db, cname, n=300, delta=True)
    conn = db.connect()  # (transactions: not autocommit)
    assert not conn.autocommit
    try:
        level = int(_cells(cname)[0].levels_[0])
        doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
        conn.rollback()
        sets = DeltaSets()
        assert _check(conn, sets, rid, level) == ([], []) and reads.count(conn) == 1
        conn.rollback()

        # this process's writes, each committed by the API: followed, not read again
        db.delete_items(cname, item_ids=ids[:20].tolist())
        new = np.asarray(db.ingest(cname, X[:15] * 0.9 + X[15:30] * 0.1, y[:15], embed_fn_extend=make_extend_fn())["item_ids"])
        db.delete_items(cname, item_ids=new[:5].tolist())
        dead, placed = _check(conn, sets, rid, level)
        assert dead == sorted(ids[:20].tolist() + new[:5].tolist()) and placed == new[5:].tolist() and reads.count(conn) == 1
        conn.rollback()

        # writes of the caller's own transaction: seen inside it, gone with its rollback
        delta.tombstone(conn, ids[20:30], [(rid, doc)])
        assert set(ids[20:30].tolist()) <= set(_check(conn, sets, rid, level)[0])
        delta.tombstone(conn, new[5:8], [(rid, doc)])
        dead, placed = _check(conn, sets, rid, level)
        assert set(new[5:8].tolist()) <= set(dead) and not set(new[5:8].tolist()) & set(placed)
        conn.rollback()
        assert not set(ids[20:30].tolist()) & set(_check(conn, sets, rid, level)[0]) and reads.count(conn) == 1
        conn.rollback()

        # another process's write: read whole once, then followed again
        _foreign_write(db.database_url(), rid, ids[40])
        assert int(ids[40]) in _check(conn, sets, rid, level)[0] and reads.count(conn) == 2
        conn.rollback()
        db.delete_items(cname, item_ids=ids[41:43].tolist())
        assert set(ids[40:43].tolist()) <= set(_check(conn, sets, rid, level)[0]) and reads.count(conn) == 2
        conn.rollback()

        # a write of this process rolled back, its version taken again by another process's write
        delta.tombstone(conn, ids[50:55], [(rid, doc)])
        conn.rollback()
        _foreign_write(db.database_url(), rid, ids[60])
        dead = _check(conn, sets, rid, level)[0]
        assert int(ids[60]) in dead and not set(ids[50:55].tolist()) & set(dead) and reads.count(conn) == 3
        conn.rollback()

        # sets read whole inside a transaction (another process wrote before it) that then rolls back
        _foreign_write(db.database_url(), rid, ids[70])
        delta.tombstone(conn, ids[71:75], [(rid, doc)])
        assert set(ids[70:75].tolist()) <= set(_check(conn, sets, rid, level)[0]) and reads.count(conn) == 4
        conn.rollback()
        dead = _check(conn, sets, rid, level)[0]
        assert int(ids[70]) in dead and not set(ids[71:75].tolist()) & set(dead) and reads.count(conn) == 5
        conn.rollback()
        # ... and the same, its version then taken again by another process's write
        _foreign_write(db.database_url(), rid, ids[75])
        delta.tombstone(conn, ids[76:78], [(rid, doc)])
        _check(conn, sets, rid, level)
        conn.rollback()
        _foreign_write(db.database_url(), rid, ids[78])
        dead = _check(conn, sets, rid, level)[0]
        assert set(ids[[75, 78]].tolist()) <= set(dead) and not set(ids[76:78].tolist()) & set(dead)
        conn.rollback()

        # and committed: the state read inside it holds after its commit, with the writes after the read
        _foreign_write(db.database_url(), rid, ids[80])
        delta.tombstone(conn, ids[81:83], [(rid, doc)])
        _check(conn, sets, rid, level)
        delta.tombstone(conn, ids[83:85], [(rid, doc)])
        conn.commit()
        n = reads.count(conn)
        assert set(ids[80:85].tolist()) <= set(_check(conn, sets, rid, level)[0]) and reads.count(conn) == n
        conn.rollback()

        # a record of a transaction this database has not seen (another server at the same address: a
        # replica promoted behind the old primary): no error, never applied
        from pm_vector.db.runs import delta_sets

        v, created, later = conn.execute(
            "SELECT delta_version, created_at, (pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 1000000)::text "
            "FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()
        conn.rollback()
        delta_sets.wrote(conn, rid, created, v + 1, later, dead=ids[90:95])
        _foreign_write(db.database_url(), rid, ids[96])
        dead = _check(conn, sets, rid, level)[0]
        assert int(ids[96]) in dead and not set(ids[90:95].tolist()) & set(dead)
        conn.rollback()
    finally:
        conn.close()


def test_a_run_s_estimate_reads_the_sets_whole_only_when_another_process_wrote(db, cname, conn, reads):
    """The sync's path (the delta's estimate, :mod:`pm_vector.db.runs.run_nearest`): ingests and deletes
    of this process follow each other without reading the tombstones whole; another process's write
    makes the next estimate read them once."""
    from dbtest_helpers import make_extend_fn

    X, y, ids, rid = _collection(db, cname, n=300, delta=True)
    db.ingest(cname, X[:5] * 0.9 + X[5:10] * 0.1, y[:5], embed_fn_extend=make_extend_fn())
    n = len(reads)
    for k in range(3):
        db.delete_items(cname, item_ids=ids[10 * k:10 * k + 5].tolist())
        db.ingest(cname, X[20 + k:21 + k] * 0.9, y[:1], embed_fn_extend=make_extend_fn())
    assert len(reads) == n
    _foreign_write(db.database_url(), rid, ids[100])
    db.ingest(cname, X[40:41] * 0.9, y[:1], embed_fn_extend=make_extend_fn())
    db.ingest(cname, X[41:42] * 0.9, y[:1], embed_fn_extend=make_extend_fn())
    assert len(reads) == n + 1
