"""Each tombstone records the run's ``delta_version`` its write makes visible (sql/0033_tombstone_version.sql),
set by the database whatever wrote it, and above every version committed without it: the rule that lets
a resolving process read only the tombstones of the versions after the set it holds."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from test_db_erase import _collection


def _versions(conn, rid, ids) -> dict[int, int | None]:
    rows = conn.execute("SELECT item_id, version FROM pm_vector.delta_tombstones WHERE run_id = %s AND item_id = ANY(%s)",
                        [rid, [int(i) for i in ids]]).fetchall()
    conn.commit()
    return {int(i): v for i, v in rows}


def _version(conn, rid) -> int:
    v = conn.execute("SELECT delta_version FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    conn.commit()
    return int(v)


def test_a_tombstone_records_the_version_its_write_makes_visible(db, cname, conn):
    """A delete through the API, and a bare INSERT (no code of pm_vector's: the trigger sets it anyway),
    each record the run's version + 1; the delete's commit makes exactly that version visible."""
    from pm_vector.db.postgres import connect

    X, y, ids, rid = _collection(db, cname, n=200, delta=True)
    v0 = _version(conn, rid)
    db.delete_items(cname, item_ids=[int(ids[3]), int(ids[5])])
    v1 = _version(conn, rid)
    assert v1 == v0 + 1 and _versions(conn, rid, ids[[3, 5]]) == {int(ids[3]): v1, int(ids[5]): v1}
    with connect() as c:  # a writer that never bumps: still versioned, above every committed version
        c.execute("INSERT INTO pm_vector.delta_tombstones (run_id, item_id) VALUES (%s, %s)", [rid, int(ids[7])])
        c.commit()
    assert _versions(conn, rid, [ids[7]]) == {int(ids[7]): v1 + 1}


def test_no_version_commits_between_a_tombstone_and_its_commit(db, cname, conn):
    """From its first tombstone to its commit a writer holds the run's row: another transaction's bump of
    the version waits (here: times out), so no set is read at a version between the two; once the writer
    bumps and commits, the other's bump goes on and a later tombstone records a higher version."""
    from pm_vector.db.postgres import connect

    X, y, ids, rid = _collection(db, cname, n=200, delta=True)
    v0 = _version(conn, rid)
    with connect() as t1, connect() as t2:
        t1.execute("INSERT INTO pm_vector.delta_tombstones (run_id, item_id) VALUES (%s, %s)", [rid, int(ids[1])])
        t2.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            t2.execute("UPDATE pm_vector.embedding_runs SET delta_version = delta_version + 1 WHERE id = %s", [rid])
        t2.rollback()
        t1.execute("UPDATE pm_vector.embedding_runs SET delta_version = delta_version + 1 WHERE id = %s", [rid])
        t1.commit()
        t2.execute("INSERT INTO pm_vector.delta_tombstones (run_id, item_id) VALUES (%s, %s)", [rid, int(ids[2])])
        t2.execute("UPDATE pm_vector.embedding_runs SET delta_version = delta_version + 1 WHERE id = %s", [rid])
        t2.commit()
    assert _versions(conn, rid, ids[[1, 2]]) == {int(ids[1]): v0 + 1, int(ids[2]): v0 + 2}
    assert _version(conn, rid) == v0 + 2


def test_a_set_held_and_the_later_versions_read_are_the_set_read_whole(db, cname, conn):
    """At every version of a run through a sequence of deletes and updates, the set held at an earlier
    version joined to the tombstones of the versions after it is the set read whole (the resolve's
    two reads, by its own statement: ``location_resolution._DEAD_SQL``)."""
    from dbtest_helpers import make_extend_fn
    from psycopg import sql

    from pm_vector.db.resolve import location_resolution as lr
    from pm_vector.db.resolve.location_cache import join_sets
    from pm_vector.db.runs.array_rows import unsend_records

    X, y, ids, rid = _collection(db, cname, n=300, delta=True)
    ei = sql.SQL("'{}'::bigint[]")

    def read(since=None):
        q = sql.SQL(lr._DEAD_SQL).format(ei=ei, since=sql.SQL("" if since is None else lr._SINCE))
        got = unsend_records(conn.execute(q, {"run": rid, "since": since or 0}, binary=True).fetchone()[2], "int8")
        conn.commit()
        return int(got[0]), got[1:]

    held = [read()]
    rng = np.random.default_rng(0)
    for step in range(6):
        pick = [int(i) for i in rng.choice(ids, 7, replace=False)]
        if step % 2:
            ids = np.setdiff1d(ids, pick[:3])  # (an updated item is a new item: the old one tombstoned)
            db.update_items(cname, item_ids=pick[:3], features=X[:3], embed_fn_extend=make_extend_fn())
        else:
            ids = np.setdiff1d(ids, pick)
            db.delete_items(cname, item_ids=pick)
        v, whole = read()
        for h, at_h in held:
            v2, new = read(h)
            assert v2 == v and np.array_equal(join_sets(at_h, new), whole)
            assert not set(new.tolist()) & set(at_h.tolist())
        held.append((v, whole))
