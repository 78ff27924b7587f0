"""Updating items (pm_vector.db.update_items): a payload-only change touches no run data; a feature or
label change erases the old item from every run table and places a new item under the same external
id in the active run, as embed --new-items does, in one transaction."""

from __future__ import annotations

import numpy as np
import pytest

from test_db_erase import _collection, _tables


def test_payload_only_update_touches_no_run_data(db, cname, conn):
    X, y, ids, rid = _collection(db, cname, n=300)
    before = _tables(conn, rid)
    doc0 = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    out = db.update_items(cname, external_ids=["e3", "e4"], payloads=[{"t": "new"}, None])
    assert out["item_ids"] == {int(ids[3]): int(ids[3]), int(ids[4]): int(ids[4])}
    assert _tables(conn, rid) == before
    # the run's document changes only in answers_version, which the cached answers (they carry payloads) key on
    doc1 = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    assert doc1 == {**doc0, "answers_version": doc0.get("answers_version", 0) + 1}
    got = db.fetch_items(cname, [int(ids[3]), int(ids[4])])
    assert got["payloads"] == [{"t": "new"}, None]


def test_a_feature_change_is_a_delete_and_an_insert_placed_in_the_active_run(db, cname, conn):
    from dbtest_helpers import make_extend_fn

    X, y, ids, rid = _collection(db, cname, n=300)
    db.update_items(cname, external_ids=["e7"], payloads=[{"keep": 1}])
    newX = X[50:51] * 1.0  # moves item e7 onto item 50
    out = db.update_items(cname, external_ids=["e7"], features=newX, labels=[int(y[50])],
                          embed_fn_extend=make_extend_fn())
    old_id = int(ids[7])
    new_id = out["item_ids"][old_id]
    assert new_id != old_id and out["placed"] is True
    t = _tables(conn, rid)
    assert old_id not in t["items"] and old_id not in {i for r in t["prior"] for i in [r[0], *r[2]]}
    assert new_id in t["items"] and new_id in t["codes"] and new_id in {r[0] for r in t["prior"]}
    row = conn.execute("SELECT external_id, label, payload FROM pm_vector.items WHERE id = %s", [new_id]).fetchone()
    assert row == ("e7", int(y[50]), {"keep": 1})
    # its neighbour list is item 50's neighbourhood (it sits on item 50)
    nb = [r[1] for r in t["neighbors"] if r[0] == new_id]
    assert int(ids[50]) in nb
    with pytest.raises(db.ItemNotFoundError):
        db.update_items(cname, external_ids=["e7", "nope"], payloads=[None, None])
    with pytest.raises(Exception, match="nothing to update"):
        db.update_items(cname, external_ids=["e7"])
    with pytest.raises(Exception, match="features"):
        db.update_items(cname, external_ids=["e8"], features=np.full((1, X.shape[1]), np.nan))
    assert conn.execute("SELECT count(*) FROM pm_vector.items WHERE external_id = 'e8'").fetchone()[0] == 1
