"""The payload bound (a collection setting): checked at every ingest, at the limit and one byte
over, nothing written when refused; changed by an admin; a concurrent lowering wins cleanly."""

from __future__ import annotations

import json

import pytest
from dbtest_helpers import data

from pm_vector.db.store.payloads import DEFAULT_MAX_PAYLOAD_BYTES, payload_bytes
from pm_vector.errors import InvalidInputError


def _sized(n: int) -> dict:
    """A payload of exactly ``n`` bytes of compact JSON, with a 2-byte UTF-8 character in it."""
    v = {"s": "é" + "x" * (n - 10)}  # {"s":""} is 8 bytes, é is 2
    assert len(json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode()) == n == payload_bytes(v)
    return v


def _rows(conn, name):
    return conn.execute("SELECT count(*), count(i.payload) FROM pm_vector.items i JOIN pm_vector.collections c "
                        "ON c.id = i.collection_id WHERE c.name = %s", [name]).fetchone()


def test_at_the_limit_ok_one_byte_over_refused_nothing_written(db, cname, conn):
    db.create_collection(cname, 5, [0, 1, 2], max_payload_bytes=40)
    assert db.collection_info(cname)["settings"]["max_payload_bytes"] == 40
    X, y = data(6, 5)
    first = db.ingest(cname, X[:2], y[:2], payloads=[_sized(40), None])
    assert _rows(conn, cname) == (2, 1)
    with pytest.raises(InvalidInputError) as ei:
        db.ingest(cname, X[2:6], y[2:6], payloads=[_sized(40), None, _sized(41), _sized(12)], batch_size=1)
    msg = str(ei.value)
    assert "payloads[2]" in msg and "41 bytes" in msg and "max_payload_bytes of 40" in msg and cname in msg
    assert _rows(conn, cname) == (2, 1)  # the earlier ingest keeps serving, nothing of the refused one is kept
    got = db.fetch_items(cname, first["item_ids"].tolist())
    assert got["payloads"] == [_sized(40), None]
    out = db.ingest(cname, X[2:4], y[2:4], payloads=[_sized(40), _sized(39)])
    assert db.fetch_items(cname, out["item_ids"].tolist())["payloads"] == [_sized(40), _sized(39)]


def test_default_bound_and_create_in_the_ingest(db, cname, conn):
    X, y = data(3, 5)
    with pytest.raises(InvalidInputError, match=f"max_payload_bytes of {DEFAULT_MAX_PAYLOAD_BYTES}"):
        db.ingest(cname, X, y, payloads=[None, _sized(DEFAULT_MAX_PAYLOAD_BYTES + 1), None],
                  create={"labels": [0, 1, 2]})
    assert cname not in [c["name"] for c in db.list_collections()]  # a failed first ingest leaves no collection
    db.ingest(cname, X, y, payloads=[None, _sized(DEFAULT_MAX_PAYLOAD_BYTES), None], create={"labels": [0, 1, 2]})
    assert db.collection_info(cname)["settings"]["max_payload_bytes"] == DEFAULT_MAX_PAYLOAD_BYTES
    db.drop_collection(cname)
    with pytest.raises(InvalidInputError, match="payloads\\[0\\] is 11 bytes"):
        db.ingest(cname, X, y, payloads=[_sized(11), None, None], create={"labels": [0, 1, 2], "max_payload_bytes": 10})
    assert cname not in [c["name"] for c in db.list_collections()]


@pytest.mark.parametrize("bad", [-1, 65_537, True, "256", 1.5, None])
def test_bound_validated(db, cname, bad):
    if bad is not None:
        with pytest.raises(InvalidInputError, match="max_payload_bytes must be an integer"):
            db.create_collection(cname, 4, [0], max_payload_bytes=bad)
    with pytest.raises(InvalidInputError, match="max_payload_bytes must be an integer"):
        db.create_collection(cname, 4, [0], settings={"max_payload_bytes": bad if bad is not None else "x"})
    assert cname not in [c["name"] for c in db.list_collections()]
    db.create_collection(cname, 4, [0], max_payload_bytes=0)
    if bad is not None:
        with pytest.raises(InvalidInputError, match="max_payload_bytes must be an integer"):
            db.set_max_payload_bytes(cname, bad)
    assert db.collection_info(cname)["settings"]["max_payload_bytes"] == 0


def test_admin_changes_the_bound(db, cname, conn):
    db.create_collection(cname, 5, [0, 1, 2], max_payload_bytes=20)
    X, y = data(4, 5)
    with pytest.raises(InvalidInputError, match="over collection"):
        db.ingest(cname, X[:1], y[:1], payloads=[_sized(30)])
    out = db.set_max_payload_bytes(cname, 30)
    assert out == {"collection": cname, "max_payload_bytes": 30, "previous": 20}
    ids = db.ingest(cname, X[:2], y[:2], payloads=[_sized(30), {"a": [1, 2, 3]}])["item_ids"]
    with pytest.raises(InvalidInputError) as ei:  # below a stored payload: refused, the bound stays
        db.set_max_payload_bytes(cname, 29)
    assert f"item {int(ids[0])}" in str(ei.value) and "30 bytes" in str(ei.value) and "stays 30" in str(ei.value)
    assert db.collection_info(cname)["settings"]["max_payload_bytes"] == 30
    assert db.set_max_payload_bytes(cname, 30)["max_payload_bytes"] == 30  # exactly the largest stored: fine
    with pytest.raises(db.CollectionNotFoundError):
        db.set_max_payload_bytes(cname + "_none", 10)


def test_bound_lowered_while_an_ingest_runs(db, cname, conn):
    """The admin's lowering commits mid-ingest (the ingest holds only KEY SHARE on the collection):
    the ingest re-checks under FOR SHARE before its commit and is refused; nothing is written."""
    db.create_collection(cname, 5, [0, 1, 2], max_payload_bytes=50)
    X, y = data(4, 5)
    lowered = []

    def progress(done, total):
        if not lowered:
            lowered.append(db.set_max_payload_bytes(cname, 20))

    with pytest.raises(InvalidInputError, match="lowered while this ingest ran"):
        db.ingest(cname, X, y, payloads=[_sized(40), None, None, None], batch_size=2, progress=progress)
    assert lowered and lowered[0]["previous"] == 50
    assert _rows(conn, cname) == (0, 0)
    st = conn.execute("SELECT status FROM pm_vector.ingests g JOIN pm_vector.collections c ON c.id = g.collection_id "
                      "WHERE c.name = %s", [cname]).fetchall()
    assert st == [("failed",)]


def _nested(depth: int):
    v: object = 1
    for _ in range(depth):
        v = [v]
    return v


def test_depth_bound_names_the_row_and_writes_nothing(db, cname, conn):
    """A payload nested deeper than 16 levels (every answer would nest past the client decoder's
    32 and every query would fail) is refused at ingest, naming its row; 16 levels are stored."""
    from pm_vector.db.store.payloads import MAX_PAYLOAD_DEPTH

    assert MAX_PAYLOAD_DEPTH == 16
    db.create_collection(cname, 5, [0, 1, 2], max_payload_bytes=65_536)
    X, y = data(3, 5)
    for deep in (_nested(17), _nested(120), {"a": _nested(16)}):
        with pytest.raises(InvalidInputError, match=r"payloads\[1\] nests deeper than 16 levels"):
            db.ingest(cname, X, y, payloads=[None, deep, None])
    with pytest.raises(InvalidInputError, match=r"payloads\[0\] nests deeper"):  # no RecursionError either
        db.ingest(cname, X[:1], y[:1], payloads=[_nested(100_000)])
    assert _rows(conn, cname) == (0, 0)
    ids = db.ingest(cname, X[:1], y[:1], payloads=[_nested(16)])["item_ids"]
    assert db.fetch_items(cname, ids.tolist())["payloads"] == [_nested(16)]


@pytest.mark.parametrize("bad, why", [("a\ud800b", "lone surrogate"), ("a\x00b", "NUL character"),
                                      ({"k\x00": 1}, "NUL character"), ({"\udfff": 1}, "lone surrogate"),
                                      ([1e300], "301 digits"), (2 ** 64, "beyond 64 bits"),
                                      ({1: "x"}, "not a string"), ([float("nan")], "NaN")])
def test_values_jsonb_cannot_store_or_no_answer_can_carry_are_refused(db, cname, conn, bad, why):
    db.create_collection(cname, 5, [0, 1, 2], max_payload_bytes=65_536)
    X, y = data(2, 5)
    with pytest.raises(InvalidInputError, match=r"payloads\[1\]") as ei:
        db.ingest(cname, X, y, payloads=[None, bad])
    assert why in str(ei.value) and "Nothing was written" in str(ei.value)
    assert _rows(conn, cname) == (0, 0)


def test_the_bound_counts_what_is_stored(db, cname, conn):
    """``[1e300] x 10`` is 69 bytes as written but 3,030 in jsonb; stored numbers come back in the
    database's notation, and what is counted is their compact JSON."""
    from pm_vector.db.store.payloads import stored_form

    assert payload_bytes([1e18] * 10) == len(json.dumps([10 ** 18] * 10, separators=(",", ":")))
    assert stored_form([1e18, 1.5e-05, 2.5]) == [10 ** 18, 0.000015, 2.5]
    with pytest.raises(InvalidInputError, match="301 digits"):
        payload_bytes([1e300] * 10)
    db.create_collection(cname, 5, [0, 1, 2], max_payload_bytes=100)
    X, y = data(2, 5)
    assert len(json.dumps([1.5e-30] * 10, separators=(",", ":"))) == 81
    (pg,) = conn.execute("SELECT %s::jsonb::text", [json.dumps([1.5e-30] * 10)]).fetchone()
    assert len(pg.replace(", ", ",")) == 341 == payload_bytes([1.5e-30] * 10)  # as PostgreSQL writes it
    (pg,) = conn.execute("SELECT %s::jsonb::text", [json.dumps([1e300] * 10)]).fetchone()
    assert len(pg) == 3030  # the figure
    with pytest.raises(InvalidInputError, match=r"payloads\[0\] is 341 bytes"):  # 81 bytes as written
        db.ingest(cname, X[:1], y[:1], payloads=[[1.5e-30] * 10])
    ids = db.ingest(cname, X, y, payloads=[[1e18] * 4, {"x": 1e-05}])["item_ids"]
    got = db.fetch_items(cname, ids.tolist())["payloads"]
    assert got == [[10 ** 18] * 4, {"x": 1e-05}]
    (stored,) = conn.execute("SELECT max(octet_length(payload::text)) FROM pm_vector.items i JOIN "
                             "pm_vector.collections c ON c.id = i.collection_id WHERE c.name = %s", [cname]).fetchone()
    assert stored <= 100
