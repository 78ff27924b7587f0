"""SIGKILL of the process during a delete, an update or a sync: the old state stays (the run tables,
the items, the attached table's queue), and the next call applies everything once."""

from __future__ import annotations

import signal

import pytest
from dbtest_helpers import start_child, wait_ready

from test_db_attach import _ids_of, _served, _vec, user_table  # noqa: F401  (fixture)
from test_db_erase import _collection, _tables

#: a child that runs one call and stops (READY, then sleeps) inside its transaction, before the commit
CHILD = """
import sys, time
import pm_vector.db as db
from pm_vector.db.runs import erase
name, what = sys.argv[1], sys.argv[2]
real = erase.erase_from_run
def stop(conn, p):
    out = real(conn, p)
    print("READY", flush=True)
    time.sleep(600)
    return out
erase.erase_from_run = stop
if what == "delete":
    db.delete_items(name, external_ids=["e1", "e2", "e3"])
elif what == "update":
    import numpy as np
    db.update_items(name, external_ids=["e4"], features=np.ones((1, 6)), labels=[1])
else:
    db.sync(name)
"""


def _kill(child):
    child.send_signal(signal.SIGKILL)
    child.wait(30)


@pytest.mark.parametrize("what", ["delete", "update"])
def test_a_killed_delete_or_update_leaves_the_old_state(db, cname, conn, what):
    X, y, ids, rid = _collection(db, cname, n=300)
    before = _tables(conn, rid)
    n0 = db.collection_info(cname)["n_items"]
    child = start_child(CHILD, cname, what)
    try:
        wait_ready(child)  # the run tables are rewritten, not committed
    finally:
        _kill(child)
    assert _tables(conn, rid) == before and db.collection_info(cname)["n_items"] == n0
    out = db.delete_items(cname, external_ids=["e1", "e2", "e3"])  # the next call goes through
    assert out["deleted"] == 3 and not set(ids[1:4].tolist()) & set(_tables(conn, rid)["items"])


def test_a_killed_sync_leaves_its_queue_and_the_next_sync_applies_it_once(db, cname, conn, user_table):  # noqa: F811
    t, X, y = user_table
    db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding", label_column="category",
                    dim=6)
    rid = _served(db, cname, X, y)
    conn.execute(f"DELETE FROM public.{t} WHERE id IN (3, 4)")
    conn.execute(f"UPDATE public.{t} SET category = 0 WHERE id = 5")
    before_ids = _ids_of(conn, cname)
    before = {r[0] for r in conn.execute(f"SELECT item_id FROM pm_vector.run_{rid}_items").fetchall()}
    child = start_child(CHILD, cname, "sync")
    try:
        wait_ready(child)
    finally:
        _kill(child)
    assert conn.execute("SELECT count(*) FROM pm_vector.attach_changes").fetchone()[0] == 3
    assert _ids_of(conn, cname) == before_ids
    assert {r[0] for r in conn.execute(f"SELECT item_id FROM pm_vector.run_{rid}_items").fetchall()} == before
    from dbtest_helpers import make_extend_fn

    res = db.sync(cname, embed_fn_extend=make_extend_fn())
    assert res["applied"] == 3 and res["replaced"] == 1
    after = _ids_of(conn, cname)
    assert "3" not in after and "4" not in after and after["5"] != before_ids["5"]
    assert db.sync(cname)["applied"] == 0
