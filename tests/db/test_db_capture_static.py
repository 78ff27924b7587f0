"""A plain attached table's capture with its columns written in (sql/0032_capture_static.sql): the
collection's own function queues exactly what ``pm_attach_capture`` queues for the same statements
(every kind of change, several rows a statement, NULL keys, changed keys, awkward column names, with
and without a label column); it is as narrow as ``pm_attach_capture`` (SECURITY DEFINER with the same
settings, owned by its owner even when a superuser made it, executable by nobody); a column renamed
under it takes ``pm_attach_capture``'s path (the write goes through, the collection is marked
broken); detaching drops it."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql


def _table(conn, label: bool, key: str = "id", vec: str = "embedding", lab: str = "category"):
    t = "cs_" + uuid.uuid4().hex[:8]
    cols = [sql.SQL("{} bigint").format(sql.Identifier(key)), sql.SQL("{} vector(3)").format(sql.Identifier(vec)),
            sql.SQL("title text")]
    if label:
        cols.append(sql.SQL("{} integer").format(sql.Identifier(lab)))
    conn.execute(sql.SQL("CREATE TABLE public.{} ({})").format(sql.Identifier(t), sql.SQL(", ").join(cols)))
    return t


def _statements(t, label: bool, key: str, vec: str, lab: str):
    """Every kind of change, several rows a statement, NULL keys and changed keys."""
    T, K, V = sql.Identifier(t), sql.Identifier(key), sql.Identifier(vec)
    L = sql.Identifier(lab)
    s = [
        sql.SQL("INSERT INTO public.{} ({}, {}, title) VALUES (1, '[1,0,0]', 'a'), (2, '[0,1,0]', 'b'), "
                "(3, '[0,0,1]', 'c'), (NULL, '[1,1,1]', 'n')").format(T, K, V),
        sql.SQL("UPDATE public.{} SET {} = '[2,0,0]' WHERE {} = 1").format(T, V, K),
        sql.SQL("UPDATE public.{} SET title = 'bb' WHERE {} = 2").format(T, K),
        sql.SQL("UPDATE public.{} SET {} = {} + 10 WHERE {} = 3").format(T, K, K, K),
        sql.SQL("UPDATE public.{} SET title = title || '!'").format(T),
        sql.SQL("DELETE FROM public.{} WHERE {} IN (2, 13) OR {} IS NULL").format(T, K, K),
        sql.SQL("INSERT INTO public.{} ({}, {}, title) SELECT g, '[1,2,3]', 'g' FROM generate_series(20, 24) g"
                ).format(T, K, V),
        sql.SQL("DELETE FROM public.{} WHERE {} > 21").format(T, K),
    ]
    if label:
        s.insert(3, sql.SQL("UPDATE public.{} SET {} = 7 WHERE {} = 1").format(T, L, K))
        s.insert(4, sql.SQL("UPDATE public.{} SET {} = 7 WHERE {} = 1").format(T, L, K))  # (the same: P)
    return s


def _queue(conn, cid):
    return conn.execute("SELECT op, key, old_vector FROM pm_vector.attach_changes WHERE collection_id = %s "
                        "ORDER BY seq", [cid]).fetchall()


def _own(conn, cid):
    return conn.execute("SELECT DISTINCT p.proname FROM pg_trigger g JOIN pg_proc p ON p.oid = g.tgfoid "
                        "WHERE g.tgname ~ %s", [f"^pm_attach_{cid}_[iud]$"]).fetchall()


@pytest.mark.parametrize("label,key,vec,lab", [(True, "id", "embedding", "category"),
                                                (False, "Key Col", "pm_k", "x"),
                                                (True, "k\"q", "v e", "pm_l")])
def test_the_own_function_queues_what_pm_attach_capture_queues(db, conn, label, key, vec, lab):
    cids, names = [], []
    for own in (True, False):
        t = _table(conn, label, key, vec, lab)
        names.append("cs_" + uuid.uuid4().hex[:8])
        try:
            cid = db.attach_table(names[-1], table=f"public.{t}", id_column=key,
                                  vector_column=vec, label_column=lab if label else None)["collection_id"]
            cids.append(cid)
            assert _own(conn, cid) == [(f"pm_attach_capture_{cid}",)]
            if not own:  # the same triggers on pm_attach_capture itself: what it queues
                for op, spec in (("i", "AFTER INSERT ON {} REFERENCING NEW TABLE AS new_rows"),
                                 ("u", "AFTER UPDATE ON {} REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows"),
                                 ("d", "AFTER DELETE ON {} REFERENCING OLD TABLE AS old_rows")):
                    trg = sql.Identifier(f"pm_attach_{cid}_{op}")
                    conn.execute(sql.SQL("DROP TRIGGER {} ON public.{}").format(trg, sql.Identifier(t)))
                    conn.execute(sql.SQL("CREATE TRIGGER {} " + spec + " FOR EACH STATEMENT EXECUTE FUNCTION "
                                         "pm_vector.pm_attach_capture()").format(trg, sql.SQL("public.{}").format(
                                             sql.Identifier(t))))
                assert _own(conn, cid) == [("pm_attach_capture",)]
            for st in _statements(t, label, key, vec, lab):
                conn.execute(st)
        finally:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{}").format(sql.Identifier(t)))
    mine, theirs = _queue(conn, cids[0]), _queue(conn, cids[1])
    for name in names:  # (their queues with them: no other test's sync meets them)
        db.drop_collection(name, missing_ok=True)
    assert len(mine) >= 15 and mine == theirs
    assert {op for op, _, _ in mine} == {"I", "U", "P", "D"}


def test_the_own_function_is_as_narrow_as_pm_attach_capture(db, conn, admin):
    t, name = _table(conn, True), "cs_" + uuid.uuid4().hex[:8]
    try:
        cid = db.attach_table(name, table=f"public.{t}", id_column="id",
                              vector_column="embedding", label_column="category")["collection_id"]
        q = ("SELECT p.prosecdef, p.proconfig, pg_get_userbyid(p.proowner), "
             "has_function_privilege('public', p.oid, 'EXECUTE') FROM pg_proc p WHERE p.oid = %s::regprocedure")
        generic = conn.execute(q, ["pm_vector.pm_attach_capture()"]).fetchone()
        own = conn.execute(q, [f"pm_vector.pm_attach_capture_{cid}()"]).fetchone()
        assert own == generic and own[0] is True and own[3] is False
        assert sorted(own[1]) == ["row_security=off", "search_path=pg_catalog, pm_vector, pg_temp"]
        # made again by a superuser (the triggers and the function dropped first): handed to
        # pm_attach_capture's owner, no more rights
        admin.execute("SELECT pm_vector.pm_attach_drop_triggers(%s)", [cid])
        assert conn.execute("SELECT to_regprocedure(%s)", [f"pm_vector.pm_attach_capture_{cid}()"]).fetchone()[0] is None
        admin.execute("SELECT pm_vector.pm_attach_triggers(%s)", [cid])
        assert _own(conn, cid) == [(f"pm_attach_capture_{cid}",)]
        assert conn.execute(q, [f"pm_vector.pm_attach_capture_{cid}()"]).fetchone() == generic
        # its text: pm_attach_capture's, with the reads written in before its own
        src = conn.execute("SELECT prosrc FROM pg_proc WHERE oid = %s::regprocedure",
                           [f"pm_vector.pm_attach_capture_{cid}()"]).fetchone()[0]
        base = conn.execute("SELECT prosrc FROM pg_proc WHERE oid = 'pm_vector.pm_attach_capture()'::regprocedure"
                            ).fetchone()[0]
        assert base in src.replace(src[src.index("  -- (made by pm_attach_capture_make"):
                                       src.index("  IF TG_OP = 'TRUNCATE' THEN")], "")
        assert "n.id" in src and "x.embedding::text" in src and "n.category::text" in src
        # a column renamed: pm_attach_capture's path (the write goes through, the collection broken)
        conn.execute(sql.SQL("ALTER TABLE public.{} RENAME COLUMN embedding TO e2").format(sql.Identifier(t)))
        conn.execute(sql.SQL("INSERT INTO public.{} (id, e2, title, category) VALUES (5, '[1,0,0]', 'x', 1)").format(
            sql.Identifier(t)))
        assert conn.execute("SELECT settings ? 'broken' FROM pm_vector.collections WHERE id = %s",
                            [cid]).fetchone()[0] is True
        conn.execute("SELECT pm_vector.pm_detach_table(name) FROM pm_vector.collections WHERE id = %s", [cid])
        assert conn.execute("SELECT to_regprocedure(%s)", [f"pm_vector.pm_attach_capture_{cid}()"]).fetchone()[0] is None
    finally:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{}").format(sql.Identifier(t)))
        db.drop_collection(name, missing_ok=True)


@pytest.fixture
def admin(db):
    """A superuser's connection (the migrations' URL)."""
    from pm_vector.db import postgres

    with psycopg.connect(postgres.admin_url(), autocommit=True) as c:
        yield c
