"""The capture of attached tables is complete (issue #35, finding 3): one canonical key text per
supported key type, whatever the writing session's TimeZone / DateStyle / extra_float_digits (the
rest refused at attach, naming the type); TRUNCATE; changes made on a partition directly, also of
a partition made later; DDL that changes the table marks the collection broken (queries and syncs
refused, naming the reason; sync-status shows it) until a resync rebuilds it."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from test_db_attach import _ids_of, _served, _vec, user_table  # noqa: F401  (fixture)


def _session(db, **settings):
    c = db.connect(autocommit=True)
    for k, v in settings.items():
        c.execute(sql.SQL("SELECT set_config({}, {}, false)").format(sql.Literal(k), sql.Literal(v)))
    return c


def _table(conn, ddl: str) -> str:
    t = "k_" + uuid.uuid4().hex[:8]
    conn.execute(sql.SQL(ddl).format(sql.Identifier(t)))
    return t


#: (key type, three keys as SQL literals of that type, the same first key written another way)
KEYS = [
    ("integer", ["1", "2", "3"], "1"),
    ("smallint", ["1", "2", "3"], "1"),
    ("bigint", ["9007199254740993", "2", "3"], "9007199254740993"),
    ("text", ["'a''b'", "'é x'", "'3'"], "'a''b'"),
    ("varchar(20)", ["'a'", "'b'", "'c'"], "'a'"),
    ("uuid", ["'6f1c2a3e-0000-4000-8000-000000000001'", "'6f1c2a3e-0000-4000-8000-000000000002'",
              "'6f1c2a3e-0000-4000-8000-000000000003'"], "'6F1C2A3E-0000-4000-8000-000000000001'"),
    ("numeric", ["1.50", "2", "1e3"], "1.5000"),
    ("timestamptz", ["'2026-03-01 10:00:00.123456+00'", "'2026-03-02 00:00:00+00'", "'infinity'"],
     "'2026-03-01 11:00:00.123456+01'"),
    ("timestamp", ["'2026-03-01 10:00:00.5'", "'2026-03-02 00:00:00'", "'2026-03-03 00:00:00'"],
     "'2026-03-01T10:00:00.500'"),
    ("date", ["'2026-03-01'", "'2026-03-02'", "'2026-03-03'"], "'2026-03-01'"),
]

SESSIONS = [dict(TimeZone="UTC", DateStyle="ISO, MDY"),
            dict(TimeZone="America/New_York", DateStyle="SQL, DMY", extra_float_digits="0"),
            dict(TimeZone="Asia/Kolkata", DateStyle="German, DMY", extra_float_digits="3")]


@pytest.mark.parametrize("typ,keys,same", KEYS, ids=[k[0] for k in KEYS])
def test_every_key_type_syncs_inserts_updates_and_deletes_from_any_session(db, cname, conn, typ, keys, same):
    a, b, c = (_session(db, **s) for s in SESSIONS)
    t = _table(a, "CREATE TABLE public.{} (id " + typ + " PRIMARY KEY, embedding vector(3), title text)")
    try:
        a.execute(sql.SQL("INSERT INTO public.{} VALUES (" + keys[0] + ", '[1,0,0]', 'x')").format(sql.Identifier(t)))
        db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding", payload_columns=["title"])
        # from other sessions: an insert, an update of the first row (its key written another way), a delete
        b.execute(sql.SQL("INSERT INTO public.{} VALUES (" + keys[1] + ", '[0,1,0]', 'y'), (" + keys[2]
                          + ", '[0,0,1]', 'z')").format(sql.Identifier(t)))
        c.execute(sql.SQL("UPDATE public.{} SET title = 'renamed' WHERE id = " + same).format(sql.Identifier(t)))
        b.execute(sql.SQL("DELETE FROM public.{} WHERE id = " + keys[1]).format(sql.Identifier(t)))
        out = db.sync(cname)
        assert out["rejected"] == [] and out["applied"] == 4
        have = _ids_of(conn, cname)
        assert len(have) == 2  # every change applied: the delete too, nothing lost
        got = db.fetch_items(cname, [have[k] for k in sorted(have)])["payloads"]
        assert sorted(p["title"] for p in got) == ["renamed", "z"]
        # the key reads back as the row under any session's settings
        for s in (a, b, c):
            assert s.execute(sql.SQL("SELECT count(*) FROM public.{} WHERE id = ANY(%s::" + typ + "[])")
                             .format(sql.Identifier(t)), [sorted(have)]).fetchone()[0] == 2
        assert db.sync(cname)["applied"] == 0
    finally:
        db.drop_collection(cname, missing_ok=True)
        conn.execute(sql.SQL("DROP TABLE public.{}").format(sql.Identifier(t)))
        for s in (a, b, c):
            s.close()


@pytest.mark.parametrize("typ,name", [("double precision", "double precision"), ("real", "real"),
                                      ("pg_temp_enum", "mood"), ("bytea", "bytea")])
def test_other_key_types_are_refused_at_attach_naming_the_type(db, cname, conn, typ, name):
    from pm_vector.errors import InvalidInputError

    e = "e_" + uuid.uuid4().hex[:6]
    if typ == "pg_temp_enum":
        conn.execute(sql.SQL("CREATE TYPE public.{} AS ENUM ('a')").format(sql.Identifier(e)))
        typ, name = f"public.{e}", e
    t = _table(conn, "CREATE TABLE public.{} (id " + typ + " PRIMARY KEY, embedding vector(3))")
    try:
        with pytest.raises(InvalidInputError, match=f"key column id of .* is of type .*{name}"):
            db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding")
        conn.execute(sql.SQL("ALTER TABLE public.{} ADD COLUMN k bigint, ADD COLUMN f float8").format(sql.Identifier(t)))
        with pytest.raises(InvalidInputError, match="label column f of .* is of type double precision"):
            db.attach_table(cname, table=f"public.{t}", id_column="k", vector_column="embedding", label_column="f")
        with pytest.raises(InvalidInputError, match="must be a pgvector vector or halfvec column, not double"):
            db.attach_table(cname, table=f"public.{t}", id_column="k", vector_column="f")
    finally:
        conn.execute(sql.SQL("DROP TABLE public.{}").format(sql.Identifier(t)))
        conn.execute(sql.SQL("DROP TYPE IF EXISTS public.{}").format(sql.Identifier(e)))


def test_partitions_directly_and_later_and_truncate(db, cname, conn):
    t = _table(conn, "CREATE TABLE public.{} (id bigint, embedding vector(3), title text) PARTITION BY RANGE (id)")
    T = sql.Identifier(t)
    try:
        conn.execute(sql.SQL("CREATE TABLE public.{} PARTITION OF public.{} FOR VALUES FROM (0) TO (100)")
                     .format(sql.Identifier(t + "_a"), T))
        conn.execute(sql.SQL("CREATE TABLE public.{} PARTITION OF public.{} FOR VALUES FROM (100) TO (200)")
                     .format(sql.Identifier(t + "_b"), T))
        conn.execute(sql.SQL("INSERT INTO public.{} SELECT g, '[1,2,3]', 't' FROM generate_series(1, 150, 10) g").format(T))
        db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding", payload_columns=["title"])
        assert len(_ids_of(conn, cname)) == 15
        # on a partition directly: an insert, an update, a delete
        conn.execute(sql.SQL("INSERT INTO public.{} VALUES (2, '[1,1,1]', 'direct')").format(sql.Identifier(t + "_a")))
        conn.execute(sql.SQL("UPDATE public.{} SET embedding = '[3,2,1]' WHERE id = 101").format(sql.Identifier(t + "_b")))
        conn.execute(sql.SQL("DELETE FROM public.{} WHERE id = 11").format(sql.Identifier(t + "_a")))
        # a partition made later, and one attached later (its rows from before are the resync's)
        conn.execute(sql.SQL("CREATE TABLE public.{} PARTITION OF public.{} FOR VALUES FROM (200) TO (300)")
                     .format(sql.Identifier(t + "_c"), T))
        conn.execute(sql.SQL("INSERT INTO public.{} VALUES (201, '[1,1,1]', 'later')").format(sql.Identifier(t + "_c")))
        conn.execute(sql.SQL("CREATE TABLE public.{} (LIKE public.{})").format(sql.Identifier(t + "_d"), T))
        conn.execute(sql.SQL("ALTER TABLE public.{} ATTACH PARTITION public.{} FOR VALUES FROM (300) TO (400)")
                     .format(T, sql.Identifier(t + "_d")))
        conn.execute(sql.SQL("INSERT INTO public.{} VALUES (301, '[1,1,1]', 'attached later')").format(sql.Identifier(t + "_d")))
        out = db.sync(cname)
        assert out["inserted"] == 3 and out["replaced"] == 1 and out["deleted"] == 1
        want = {str(r[0]) for r in conn.execute(sql.SQL("SELECT id FROM public.{}").format(T)).fetchall()}
        assert set(_ids_of(conn, cname)) == want
        # TRUNCATE of a partition (a later one too), then of the whole table
        conn.execute(sql.SQL("TRUNCATE public.{}").format(sql.Identifier(t + "_c")))
        assert db.sync(cname)["deleted"] == 1 and "201" not in _ids_of(conn, cname)
        conn.execute(sql.SQL("TRUNCATE public.{}").format(T))
        assert db.sync_status(cname)["queued"] == len(want) - 1
        db.sync(cname)
        assert _ids_of(conn, cname) == {}
    finally:
        db.drop_collection(cname, missing_ok=True)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{}").format(T))


@pytest.mark.slow
def test_truncate_empties_the_collection_and_its_run_at_the_next_sync(db, cname, conn, user_table):  # noqa: F811
    t, X, y = user_table
    db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding",
                    label_column="category", payload_columns=["title"], dim=6)
    rid = _served(db, cname, X, y)
    conn.execute(sql.SQL("TRUNCATE public.{}").format(sql.Identifier(t)))
    assert db.sync_status(cname)["queued"] == 402
    db.sync(cname)
    assert _ids_of(conn, cname) == {}
    assert conn.execute(f"SELECT count(*) FROM pm_vector.run_{int(rid)}_items").fetchone()[0] == 0
