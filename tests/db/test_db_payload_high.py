"""The high-water mark of the payloads a collection stores (``settings["payload_bytes_high"]``,
:mod:`pm_vector.db.store.payloads`; issue #35 item 9, follow-up): 0 for a new collection, raised
in the same transaction by every write that stores payloads (ingest, update_items, attach, sync),
never lowered by a write, and published as ``payload_bytes_max = min(bound, mark)``."""

from __future__ import annotations

import json
import threading
import uuid

import numpy as np
import pytest
from dbtest_helpers import data
from test_db_attach import _vec

from pm_vector.db.store.payloads import HIGH_KEY, high_of, payload_bytes, raise_high
from pm_vector.errors import InvalidInputError


def _sized(n: int) -> dict:
    v = {"s": "é" + "x" * (n - 10)}
    assert payload_bytes(v) == n
    return v


def _mark(db, name):
    return db.collection_info(name)["settings"].get(HIGH_KEY)


def _mark_now(conn, name):
    """The mark as another connection sees it (committed only)."""
    return conn.execute("SELECT settings -> %s FROM pm_vector.collections WHERE name = %s", [HIGH_KEY, name]).fetchone()[0]


def test_ingest_raises_the_mark_never_lowers_it(db, cname, conn):
    X, y = data(8, 5)
    db.create_collection(cname, 5, [0, 1, 2], max_payload_bytes=100)
    assert _mark(db, cname) == 0  # a new collection stores no payload
    db.ingest(cname, X[:2], y[:2])  # no payloads: no raise
    assert _mark(db, cname) == 0
    assert high_of(db.collection_info(cname)) == 0
    db.ingest(cname, X[2:4], y[2:4], payloads=[_sized(40), None])
    assert _mark(db, cname) == 40
    db.ingest(cname, X[4:6], y[4:6], payloads=[_sized(20), _sized(12)])  # smaller: the mark stays
    assert _mark(db, cname) == 40
    out = db.ingest(cname, X[6:8], y[6:8], payloads=[_sized(77), None])
    assert _mark(db, cname) == 77 and high_of(db.collection_info(cname)) == 77
    db.delete_items(cname, item_ids=out["item_ids"].tolist())  # a delete leaves it
    assert _mark(db, cname) == 77
    db.set_max_payload_bytes(cname, 50)  # no payload over 50 is left: the bound may go below the mark
    assert high_of(db.collection_info(cname)) == 50  # published: min(bound, mark)


def test_ingest_with_create_sets_the_mark(db, cname):
    X, y = data(3, 5)
    db.ingest(cname, X, y, payloads=[None, _sized(33), _sized(21)], create={"labels": [0, 1, 2]})
    assert _mark(db, cname) == 33


def test_a_rolled_back_ingest_raises_nothing(db, cname, conn, monkeypatch):
    """The raise is in the ingest's transaction: invisible to others before the commit, gone with
    the rollback."""
    from pm_vector.db.store import payloads

    X, y = data(4, 5)
    db.create_collection(cname, 5, [0, 1, 2], max_payload_bytes=100)
    db.ingest(cname, X[:1], y[:1], payloads=[_sized(20)])
    seen = []

    def fail_at_commit(c, cid, collection, biggest):
        seen.append((_mark_now(conn, cname), c.execute("SELECT settings -> %s FROM pm_vector.collections "
                                                        "WHERE id = %s", [HIGH_KEY, cid]).fetchone()[0]))
        raise InvalidInputError("the bound was lowered (simulated)")

    monkeypatch.setattr(payloads, "recheck_locked", fail_at_commit)
    with pytest.raises(InvalidInputError, match="simulated"):
        db.ingest(cname, X[1:3], y[1:3], payloads=[_sized(90), None])
    assert seen == [(20, 90)]  # raised in the ingest's own transaction, not seen outside it
    assert _mark(db, cname) == 20 and db.collection_info(cname)["n_items"] == 1


def test_update_items_raises_the_mark(db, cname):
    X, y = data(4, 5)
    db.create_collection(cname, 5, [0, 1, 2], max_payload_bytes=200)
    ids = db.ingest(cname, X, y)["item_ids"].tolist()
    assert _mark(db, cname) == 0
    db.update_items(cname, item_ids=ids[:2], payloads=[_sized(60), None])  # payload only
    assert _mark(db, cname) == 60
    db.update_items(cname, item_ids=ids[2:3], features=X[3:4], payloads=[_sized(150)])  # a new item
    assert _mark(db, cname) == 150
    db.update_items(cname, item_ids=ids[:1], payloads=[None])  # a payload removed: the mark stays
    assert _mark(db, cname) == 150
    with pytest.raises(InvalidInputError):  # refused (over the bound): nothing raised
        db.update_items(cname, item_ids=ids[:1], payloads=[_sized(201)])
    assert _mark(db, cname) == 150


def test_concurrent_raises_are_not_lost(db, cname, conn):
    """Two writers raise at once: the second waits for the first's commit, then takes greatest()
    of the committed mark, whichever order they commit in."""
    db.create_collection(cname, 5, [0, 1, 2])
    cid = db.collection_info(cname)["id"]
    for first, second in ((90, 30), (30, 90)):
        conn.execute("UPDATE pm_vector.collections SET settings = jsonb_set(settings, %s, '0') WHERE id = %s",
                     [[HIGH_KEY], cid])
        a, b = db.connect(), db.connect()
        try:
            raise_high(a, cid, first)  # a holds the row
            done = threading.Event()

            def other():
                raise_high(b, cid, second)
                b.commit()
                done.set()

            t = threading.Thread(target=other)
            t.start()
            assert not done.wait(0.5)  # b waits for a's commit
            a.commit()
            t.join(10)
            assert done.is_set()
        finally:
            a.close()
            b.close()
        assert _mark(db, cname) == 90


def test_a_collection_without_mark_counts_the_bound(db, cname, conn):
    """A collection created before the mark (no key): unknown, published as the bound; no write
    sets it (an earlier write may have stored larger payloads)."""
    X, y = data(2, 5)
    db.create_collection(cname, 5, [0, 1, 2], max_payload_bytes=120)
    conn.execute("UPDATE pm_vector.collections SET settings = settings - %s WHERE name = %s", [HIGH_KEY, cname])
    db.ingest(cname, X, y, payloads=[_sized(30), None])
    assert _mark(db, cname) is None and high_of(db.collection_info(cname)) == 120


@pytest.fixture
def pay_table(db, conn):
    t = "hw_" + uuid.uuid4().hex[:8]
    rng = np.random.default_rng(5)
    X = rng.normal(size=(20, 6)).astype(np.float32)
    conn.execute(f"CREATE TABLE public.{t} (id bigint PRIMARY KEY, embedding vector(6), meta jsonb)")
    sizes = [None, 30, 57, 12] * 5
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO public.{t} VALUES (%s, %s::vector, %s::jsonb)",
                        [(i + 1, _vec(X[i]), None if s is None else json.dumps(_sized(s)))
                         for i, s in enumerate(sizes)])
    yield t, X
    conn.execute(f"DROP TABLE IF EXISTS public.{t}")


def test_attach_and_sync_raise_the_mark(db, cname, conn, pay_table):
    """Attach: the exact largest payload it kept (one over the bound is rejected, not counted);
    sync: the payloads a batch inserts or updates, a rejected one not counted."""
    t, X = pay_table
    conn.execute(f"UPDATE public.{t} SET meta = %s::jsonb WHERE id = 2", [json.dumps({"x": "y" * 200})])  # over
    out = db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding",
                          payload_columns=["meta"], max_payload_bytes=100)
    assert [k for k, _ in out["rejected"]] == ["2"]
    assert _mark(db, cname) == 57 + 9  # {"meta":{...}}: the payload as stored, compact JSON
    conn.execute(f"UPDATE public.{t} SET meta = %s::jsonb WHERE id = 4", [json.dumps(_sized(70))])  # payload only
    conn.execute(f"INSERT INTO public.{t} VALUES (101, %s::vector, %s::jsonb)", [_vec(X[0]), json.dumps(_sized(50))])
    conn.execute(f"INSERT INTO public.{t} VALUES (102, %s::vector, %s::jsonb)", [_vec(X[1]), json.dumps(_sized(150))])
    res = db.sync(cname)
    assert [k for k, _ in res["rejected"]] == ["102"]  # over the bound: rejected, not counted
    assert _mark(db, cname) == payload_bytes({"meta": _sized(70)}) == 79
    conn.execute(f"INSERT INTO public.{t} VALUES (103, %s::vector, %s::jsonb)", [_vec(X[2]), json.dumps(_sized(80))])
    db.sync(cname)
    assert _mark(db, cname) == 89
    conn.execute(f"DELETE FROM public.{t} WHERE id = 103")
    db.sync(cname)
    assert _mark(db, cname) == 89  # a delete leaves it
