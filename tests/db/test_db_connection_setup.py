"""One connection setup: :func:`pm_vector.db.postgres.configure` sets up every connection
pm_vector opens (``db.connect()``, the SQLAlchemy engines, the service's pools), once per
connection, and nothing else registers types on a connection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pm_vector


def _floats(v) -> list[float]:
    """A vector as read back (pgvector's Vector or a numpy array) as floats."""
    return [float(x) for x in (v.to_list() if hasattr(v, "to_list") else v)]


def test_connect_engine_and_pool_connections_are_set_up_once(db, monkeypatch):
    import psycopg
    import pgvector.psycopg

    from pm_vector.db.postgres import configure, get_engine
    from pm_vector.db.postgres.adapt import Float8Array, Int4Array, Int8Array
    from pm_vector.service.db import ServicePool

    with db.connect() as conn:
        assert conn._pm_configured and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        v, j, ids = conn.execute("SELECT '[1,2,3]'::vector, '{\"a\": [1, 2.5]}'::jsonb, %s::bigint[]",
                                 [Int8Array(np.array([3, 1, 2**40], dtype=np.int64))]).fetchone()
        assert _floats(v) == [1, 2, 3] and j == {"a": [1, 2.5]} and ids == [3, 1, 2**40]
        # the other binary arrays: their values exactly (a float8's every bit), their types, empty ones
        fl = np.array([0.1, -2.5e-300, 1 / 3, 7.0, np.nextafter(1.0, 2.0)])
        i4, f8, t4, t8, e4 = conn.execute(
            "SELECT %s, %s, pg_typeof(%s)::text, pg_typeof(%s)::text, %s::integer[]",
            [Int4Array(np.array([-2**31, 0, 2**31 - 1])), Float8Array(fl), Int4Array(np.array([1])),
             Float8Array(np.array([1.0])), Int4Array(np.zeros(0, np.int64))]).fetchone()
        assert i4 == [-2**31, 0, 2**31 - 1] and f8 == fl.tolist() and (t4, t8) == ("integer[]", "double precision[]")
        assert e4 == []
        with pytest.raises(OverflowError):
            Int4Array(np.array([2**31]))

        def boom(conn):
            raise AssertionError("registered twice")

        monkeypatch.setattr(pgvector.psycopg, "register_vector", boom)
        configure(conn)  # already set up: no look-up, no query
        monkeypatch.undo()

    raw = get_engine().raw_connection()
    try:
        assert raw.driver_connection._pm_configured
    finally:
        raw.close()

    pool = ServicePool(min_size=1, max_size=1)
    try:
        with pool.connection() as conn:
            assert conn._pm_configured
            assert _floats(conn.execute("SELECT '[4,5]'::vector").fetchone()[0]) == [4, 5]
    finally:
        pool.close()


def test_a_plain_connection_is_set_up_on_first_use_and_keeps_its_transaction(db):
    import psycopg

    from pm_vector.db.postgres import configure, database_url, libpq_url

    with psycopg.connect(libpq_url(database_url())) as conn:
        conn.execute("SELECT 1")
        configure(conn)  # inside the caller's transaction: it stays open
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert _floats(conn.execute("SELECT '[7]'::vector").fetchone()[0]) == [7]
        conn.rollback()


def test_nothing_else_registers_types_on_a_connection():
    root = Path(pm_vector.__file__).parent
    hits = sorted(str(f.relative_to(root)) for f in root.rglob("*.py")
                  if any(s in f.read_text() for s in ("register_vector(", "set_json_loads(", "register_dumper(")))
    assert hits == ["db/postgres/adapt.py"]
