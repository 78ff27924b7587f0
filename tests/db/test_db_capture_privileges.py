"""The capture of attached tables runs no one's code with pm_vector's rights (issue #35, finding 1):
a role with use of the schema cannot make pm_attach_capture run its cast as pm_vector's owner nor
write into another collection's queue (the capture is bound to the attached table's oid, not to its
trigger arguments), and an attached table's owner cannot either, through a column of its own type."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from test_db_attach import _vec


def _as(role: str):
    """A connection (autocommit) of ``role`` to pm_vector's database (the embedded server trusts local logins)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from pm_vector.db import postgres

    info = conninfo_to_dict(postgres.database_url())
    info["user"] = role
    return psycopg.connect(make_conninfo(**info), autocommit=True)


@pytest.fixture
def admin(db):
    """A superuser's connection (the migrations' URL): pm_vector's own role may not create roles."""
    from pm_vector.db import postgres

    with psycopg.connect(postgres.admin_url(), autocommit=True) as c:
        yield c


@pytest.fixture
def role(admin):
    name = "r_" + uuid.uuid4().hex[:10]
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER").format(sql.Identifier(name)))
    yield name
    admin.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
    admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def victim(db, cname, conn):
    """An attached collection (its table owned by pm_vector's role): the queue an attacker aims at."""
    t = "v_" + uuid.uuid4().hex[:8]
    conn.execute(sql.SQL("CREATE TABLE public.{} (id bigint PRIMARY KEY, embedding vector(3))").format(sql.Identifier(t)))
    conn.execute(sql.SQL("INSERT INTO public.{} VALUES (1, '[1,0,0]'), (2, '[0,1,0]')").format(sql.Identifier(t)))
    cid = db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding")["collection_id"]
    yield cid
    conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{}").format(sql.Identifier(t)))


def _queued(conn, cid) -> int:
    return conn.execute("SELECT count(*) FROM pm_vector.attach_changes WHERE collection_id = %s", [cid]).fetchone()[0]


def test_temporary_objects_of_a_schema_user_run_nothing_as_the_owner(conn, role, victim):
    marker = "pwned_" + uuid.uuid4().hex[:8]
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA pm_vector TO {}").format(sql.Identifier(role)))
    with _as(role) as a:
        a.execute("CREATE TYPE pg_temp.mood AS ENUM ('x')")
        a.execute(sql.SQL("CREATE FUNCTION pg_temp.mood_json(pg_temp.mood) RETURNS json LANGUAGE plpgsql AS $f$ "
                          "BEGIN EXECUTE 'CREATE TABLE IF NOT EXISTS pm_vector.{} ()'; RETURN '1'::json; END $f$")
                  .format(sql.Identifier(marker)))
        a.execute("CREATE CAST (pg_temp.mood AS json) WITH FUNCTION pg_temp.mood_json(pg_temp.mood)")
        a.execute("CREATE TEMP TABLE t (id text, v text, m pg_temp.mood)")
        try:  # (with EXECUTE revoked from PUBLIC, the trigger cannot even be made)
            a.execute(sql.SQL("CREATE TRIGGER {} AFTER INSERT ON t REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
                              "EXECUTE FUNCTION pm_vector.pm_attach_capture({}, 'id', 'v', '')")
                      .format(sql.Identifier(f"pm_attach_{victim}_i"), sql.Literal(str(victim))))
            made = True
        except psycopg.errors.InsufficientPrivilege:
            made = False
        if made:
            try:
                a.execute("INSERT INTO t SELECT g::text, '[1,1,1]', 'x' FROM generate_series(1, 50) g")
            except psycopg.Error:
                pass
    assert conn.execute("SELECT to_regclass(%s)", [f"pm_vector.{marker}"]).fetchone()[0] is None
    assert _queued(conn, victim) == 0


def test_a_trigger_on_another_table_writes_no_queue(conn, victim):
    """Even a trigger that names the collection, made by a role that may: bound to the attached table's oid."""
    t = "o_" + uuid.uuid4().hex[:8]
    conn.execute(sql.SQL("CREATE TABLE public.{} (id bigint, embedding vector(3))").format(sql.Identifier(t)))
    try:
        conn.execute(sql.SQL("CREATE TRIGGER {} AFTER INSERT ON public.{} REFERENCING NEW TABLE AS new_rows "
                             "FOR EACH STATEMENT EXECUTE FUNCTION pm_vector.pm_attach_capture({}, 'id', 'embedding', '')")
                     .format(sql.Identifier(f"pm_attach_{victim}_i"), sql.Identifier(t), sql.Literal(str(victim))))
        conn.execute(sql.SQL("INSERT INTO public.{} SELECT g, '[1,1,1]' FROM generate_series(1, 50) g").format(sql.Identifier(t)))
        assert _queued(conn, victim) == 0
    finally:
        conn.execute(sql.SQL("DROP TABLE public.{}").format(sql.Identifier(t)))


def test_the_owner_of_an_attached_table_runs_nothing_as_the_owner(db, cname, conn, admin, role):
    """Its cast would create a table in pm_vector (only pm_vector's owner may) and make itself
    SUPERUSER (only a superuser may: the owner before migration 0022); run as the table's owner
    (the writer's rights) both fail quietly."""
    schema, marker = "s_" + uuid.uuid4().hex[:8], "pwned_" + uuid.uuid4().hex[:8]
    admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(schema), sql.Identifier(role)))
    owner = conn.execute("SELECT current_user").fetchone()[0]
    try:
        with _as(role) as a:
            a.execute(sql.SQL("CREATE TABLE {}.docs (id bigint PRIMARY KEY, embedding vector(3), title text)")
                      .format(sql.Identifier(schema)))
            a.execute(sql.SQL("INSERT INTO {}.docs VALUES (1, %s, 'a'), (2, %s, 'b')").format(sql.Identifier(schema)),
                      [_vec([1, 0, 0]), _vec([0, 1, 0])])
            # what pm_vector's role needs on a table it attaches (docs/guide/attach.md)
            a.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), sql.Identifier(owner)))
            a.execute(sql.SQL("GRANT SELECT, TRIGGER ON {}.docs TO {}").format(sql.Identifier(schema),
                                                                                sql.Identifier(owner)))
        db.attach_table(cname, table=f"{schema}.docs", id_column="id", vector_column="embedding",
                        payload_columns=["title"])
        with _as(role) as a:
            s = sql.Identifier(schema)
            a.execute(sql.SQL("CREATE TYPE {}.mood AS ENUM ('x')").format(s))
            a.execute(sql.SQL("CREATE FUNCTION {s}.mood_json({s}.mood) RETURNS json LANGUAGE plpgsql AS $f$ "
                              "BEGIN BEGIN EXECUTE 'CREATE TABLE IF NOT EXISTS pm_vector.{m} ()'; "
                              "EXCEPTION WHEN insufficient_privilege THEN NULL; END; "
                              "BEGIN EXECUTE format('ALTER ROLE %I SUPERUSER', {r}); "
                              "EXCEPTION WHEN insufficient_privilege THEN NULL; END; RETURN '1'::json; END $f$")
                      .format(s=s, m=sql.Identifier(marker), r=sql.Literal(role)))
            a.execute(sql.SQL("CREATE CAST ({s}.mood AS json) WITH FUNCTION {s}.mood_json({s}.mood)").format(s=s))
            a.execute(sql.SQL("ALTER TABLE {}.docs ADD COLUMN m {}.mood DEFAULT 'x'").format(s, s))
            a.execute(sql.SQL("UPDATE {}.docs SET title = title").format(s))
        superuser = "SELECT rolsuper FROM pg_roles WHERE rolname = %s"
        marked = "SELECT to_regclass(%s) IS NOT NULL"
        assert conn.execute(superuser, [role]).fetchone()[0] is False
        assert conn.execute(marked, [f"pm_vector.{marker}"]).fetchone()[0] is False
        out = db.sync(cname)
        assert out["applied"] == 2 and out["payloads"] == 2
        assert conn.execute(superuser, [role]).fetchone()[0] is False
        assert conn.execute(marked, [f"pm_vector.{marker}"]).fetchone()[0] is False
        # a payload column of its own type is refused at attach, naming it
        with pytest.raises(Exception, match=r"payload column m .*mood.* not a built-in type"):
            db.attach_table(cname + "_m", table=f"{schema}.docs", id_column="id", vector_column="embedding",
                            payload_columns=["m"])
    finally:
        db.drop_collection(cname, missing_ok=True)
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        admin.execute(sql.SQL("DROP TABLE IF EXISTS pm_vector.{}").format(sql.Identifier(marker)))
