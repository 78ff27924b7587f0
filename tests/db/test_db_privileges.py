"""Least privilege (issue 35, finding 8): the catalog says exactly what the privilege matrix
(:mod:`pm_vector.db.postgres.privileges`) declares, and the query keys' login role is refused what
an answer does not need.

On the code before migration 0022 every one of these failed: ``pm_vector_query`` could SELECT
every table of the schema (raw features, the request log, the KAHM models, the change queue), by
default also future ones, every function was executable by PUBLIC, and the schemas belonged to
the superuser ``postgres``.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

SCHEMAS = ["pm_vector", "pm_vector_service"]


@pytest.fixture(scope="module")
def collections(pm_home):
    """Two small digits collections with an active run: one without raw features, one with."""
    from pm_vector import db
    from pm_vector.bench.demo import prepare_collection
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    split = split_dataset(load_dataset("digits"), 300, 200, 100, 20, seed=1)
    names = {"closed": "priv_" + uuid.uuid4().hex[:8], "open": "priv_" + uuid.uuid4().hex[:8]}
    for kind, name in names.items():
        prepare_collection(name, split, allow_raw_features=kind == "open")
    db.run_embedding_job(names["closed"], {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
    yield names
    for name in names.values():
        db.drop_collection(name, missing_ok=True)


def _acl(conn, sql_text: str, params=()) -> dict:
    """{object: {(grantee, privilege)}} from a query of (object, owner, acl[] as text of aclexplode)."""
    out: dict = {}
    for obj, grantee, priv in conn.execute(sql_text, params).fetchall():
        out.setdefault(obj, set())
        if grantee is not None:
            out[obj].add((grantee, priv))
    return out


_WHO = "CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END"


def test_catalog_is_the_privilege_matrix(conn, collections):
    """Schemas, relations, columns, functions and default privileges of pm_vector's schemas: every
    object is named by the matrix, owned by the owner, and grants exactly what the matrix says."""
    from pm_vector.db.postgres import privileges as pv
    from pm_vector.db.runs.kinds import KINDS, answer_tables

    ANSWER_TABLES = answer_tables()

    assert list(pv.SCHEMAS) == SCHEMAS

    owner = conn.execute("SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'pm_vector'").fetchone()[0]
    assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [owner]).fetchone()[0] is False
    others = lambda rights: {r for r in rights if r[0] != owner}  # noqa: E731 - the owner holds all

    # schemas
    ns = _acl(conn, f"SELECT n.nspname, {_WHO}, a.privilege_type FROM pg_namespace n "
                    "LEFT JOIN LATERAL aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a ON true "
                    "WHERE n.nspname = ANY(%s)", [SCHEMAS])
    assert set(ns) == set(SCHEMAS)
    for schema, rights in ns.items():
        assert others(rights) == {(pv.QUERY_ROLE, p) for p in pv.QUERY_SCHEMAS.get(schema, ())}, schema

    # relations (tables, views, sequences, foreign tables) and their columns
    rels = conn.execute(
        "SELECT n.nspname, c.relname, pg_get_userbyid(c.relowner), "
        f"  array(SELECT ({_WHO}, a.privilege_type)::text FROM aclexplode(coalesce(c.relacl, "
        "         acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::\"char\", c.relowner))) a), "
        f"  array(SELECT (at.attname, {_WHO}, a.privilege_type)::text FROM pg_attribute at, "
        "         aclexplode(at.attacl) a WHERE at.attrelid = c.oid AND at.attacl IS NOT NULL) "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')", [SCHEMAS]).fetchall()
    run_tables = 0
    for schema, name, rel_owner, rights, col_rights in rels:
        want = pv.expected_relation_rights(schema, name, ANSWER_TABLES, KINDS)
        assert want is not None, f"{schema}.{name} is not in the privilege matrix (pm_vector/db/postgres/privileges.py)"
        run_tables += pv.RUN_TABLE.match(name) is not None
        assert rel_owner == owner, f"{schema}.{name} is owned by {rel_owner}, not {owner}"
        got = {tuple(r.strip("()").split(",")) for r in rights}
        assert others(got) == {(pv.QUERY_ROLE, p) for p in want[0]}, f"{schema}.{name}"
        cols: dict = {}
        for r in col_rights:
            col, who, priv = r.strip("()").split(",")
            assert who == pv.QUERY_ROLE, f"{schema}.{name}({col}): {who} {priv}"
            cols.setdefault(priv, set()).add(col)
        assert {p: tuple(sorted(c)) for p, c in cols.items()} == (want[1] or {}), f"{schema}.{name} columns"
    assert run_tables >= len(ANSWER_TABLES) - 1, "the job's run tables were checked"

    # functions
    funcs = conn.execute(
        "SELECT n.nspname, p.proname, p.oid::regprocedure::text, pg_get_userbyid(p.proowner), "
        f"  array(SELECT ({_WHO}, a.privilege_type)::text FROM aclexplode(coalesce(p.proacl, "
        "         acldefault('f', p.proowner))) a) "
        "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ANY(%s)",
        [SCHEMAS]).fetchall()
    assert len(funcs) >= len(pv.FUNCTIONS)
    for schema, name, sig, fn_owner, rights in funcs:
        want = pv.expected_function_rights(schema, name)
        assert want is not None, f"{sig} is not in the privilege matrix (pm_vector/db/postgres/privileges.py)"
        assert fn_owner == owner, f"{sig} is owned by {fn_owner}"
        got = {tuple(r.strip("()").split(",")) for r in rights}
        assert others(got) == {(pv.QUERY_ROLE, p) for p in want}, sig

    # default privileges: none in the schemas; the owner's new functions not executable by PUBLIC
    in_schemas = conn.execute("SELECT count(*) FROM pg_default_acl d JOIN pg_namespace n ON n.oid = d.defaclnamespace "
                              "WHERE n.nspname = ANY(%s)", [SCHEMAS]).fetchone()[0]
    assert in_schemas == 0
    fdefault = conn.execute(
        f"SELECT array(SELECT {_WHO} FROM aclexplode(coalesce((SELECT d.defaclacl FROM pg_default_acl d "
        "  WHERE d.defaclrole = r.oid AND d.defaclnamespace = 0 AND d.defaclobjtype = 'f'), acldefault('f', r.oid))) a) "
        "FROM pg_roles r WHERE r.rolname = %s", [owner]).fetchone()[0]
    assert "PUBLIC" not in fdefault


def test_an_object_outside_the_matrix_is_named(conn):
    """The matrix knows its objects, and nothing else: a new table or function is not in it."""
    from pm_vector.db.postgres import privileges as pv
    from pm_vector.db.runs.kinds import KINDS, answer_tables

    ANSWER_TABLES = answer_tables()

    assert pv.expected_relation_rights("pm_vector", "new_table", ANSWER_TABLES, KINDS) is None
    assert pv.expected_relation_rights("pm_vector", "run_7_secrets", ANSWER_TABLES, KINDS) is None
    assert pv.expected_relation_rights("pm_vector", "run_7_codes", ANSWER_TABLES, KINDS) == (("SELECT",), None)
    assert pv.expected_relation_rights("pm_vector", "run_7_prior_0", ANSWER_TABLES, KINDS) == ((), None)
    # a kind a test registers is known to the matrix through the registry, with no list of its own
    assert pv.expected_relation_rights("pm_vector", "run_7_test_marks", {"test_marks"}, {"test_marks"}) == (("SELECT",), None)
    assert pv.expected_function_rights("pm_vector", "pm_new_function") is None


@pytest.fixture
def query_conn(db):
    """A connection as query keys' own login role (migration 0017's ``pm_vector_query_<oid>``)."""
    from pm_vector.db.postgres import database_url
    from pm_vector.service.db import with_login

    with db.connect() as c:
        role, password = c.execute("SELECT role_name, password FROM pm_vector_service.query_login").fetchone()
    with psycopg.connect(with_login(database_url(), role, password), autocommit=True) as c:
        assert c.execute("SELECT session_user").fetchone()[0] == role
        yield c


REFUSED = {
    "raw features": "SELECT features FROM pm_vector.items WHERE collection_id = {closed} LIMIT 1",
    "raw features (half)": "SELECT features_half FROM pm_vector.items LIMIT 1",
    "every column of items": "SELECT * FROM pm_vector.items LIMIT 1",
    "the change queue": "SELECT * FROM pm_vector.attach_changes LIMIT 1",
    "the change queue's old vectors": "SELECT old_vector FROM pm_vector.attach_changes LIMIT 1",
    "reading the request log": "SELECT request FROM pm_vector.request_log LIMIT 1",
    "counting the request log": "SELECT count(*) FROM pm_vector.request_log",
    "the KAHM models": "SELECT model FROM pm_vector.kahm_models LIMIT 1",
    "every column of the KAHM models": "SELECT * FROM pm_vector.kahm_models LIMIT 1",
    "the KAHM audits": "SELECT * FROM pm_vector.kahm_audits LIMIT 1",
    "the ingests": "SELECT * FROM pm_vector.ingests LIMIT 1",
    "the anchor sets": "SELECT * FROM pm_vector.anchor_sets LIMIT 1",
    "the shards": "SELECT * FROM pm_vector.shards LIMIT 1",
    "a view": "SELECT * FROM pm_vector.pm_requests LIMIT 1",
    "the service's schema": "SELECT * FROM pm_vector_service.api_keys LIMIT 1",
    "a function it does not call": "SELECT pm_vector.pm_orphan_run_tables()",
    "writing a table": "UPDATE pm_vector.collections SET updated_at = now() WHERE false",
    "deleting the log": "DELETE FROM pm_vector.request_log WHERE false",
    "a table in pm_vector": "CREATE TABLE pm_vector.mine (x int)",
}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_query_login_is_refused(query_conn, collections, what):
    from pm_vector import db

    closed = db.collection_info(collections["closed"])["id"]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        query_conn.execute(REFUSED[what].format(closed=int(closed)))


def test_query_login_reads_features_only_where_the_collection_allows_them(query_conn, collections):
    from pm_vector import db

    ids = {}
    for kind, name in collections.items():
        cid = db.collection_info(name)["id"]
        ids[kind] = query_conn.execute("SELECT id FROM pm_vector.items WHERE collection_id = %s ORDER BY id LIMIT 3",
                                       [cid]).fetchall()
        assert len(ids[kind]) == 3  # ids and payloads: what an answer carries
    got = lambda kind: [query_conn.execute("SELECT vector_dims(pm_vector.pm_item_features(%s))", [i]).fetchone()[0]  # noqa: E731
                        for (i,) in ids[kind]]
    assert got("closed") == [None] * 3
    assert got("open") == [64] * 3


def test_answer_tables_are_granted_per_run_never_by_default(conn, collections):
    """A table the owner makes in pm_vector is not readable by the query role (no default privilege),
    nor a new function executable by PUBLIC; the run's answer tables are readable, from
    answer_tables() at the job's switch."""
    from pm_vector import db

    name = "t_" + uuid.uuid4().hex[:8]
    conn.execute(f"CREATE TABLE pm_vector.{name} (x int)")
    try:
        assert conn.execute("SELECT has_table_privilege('pm_vector_query', %s, 'SELECT')",
                            [f"pm_vector.{name}"]).fetchone()[0] is False
        conn.execute(f"CREATE FUNCTION pm_vector.{name}() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        assert conn.execute("SELECT has_function_privilege('public', %s, 'EXECUTE')",
                            [f"pm_vector.{name}()"]).fetchone()[0] is False
    finally:
        conn.execute(f"DROP FUNCTION IF EXISTS pm_vector.{name}()")
        conn.execute(f"DROP TABLE pm_vector.{name}")
    from pm_vector.db.runs.kinds import answer_tables

    ANSWER_TABLES = answer_tables()

    run = db.collection_info(collections["closed"])["active_run_id"]
    granted = {r[0] for r in conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'pm_vector' "
        "AND c.relname LIKE %s AND has_table_privilege('pm_vector_query', c.oid, 'SELECT')",
        [f"run_{int(run)}_%"]).fetchall()}
    assert {g.split("_", 2)[2] for g in granted} == ANSWER_TABLES


def test_pm_vector_runs_as_an_owner_that_is_no_superuser(db):
    """The embedded default: the URL pm_vector uses logs in as the owner role, which owns the schemas
    and is no superuser; the migrations' superuser URL is admin_url()'s only."""
    from pm_vector.db.postgres import database_url, embedded

    with db.connect() as c:
        row = c.execute("SELECT current_user, r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolbypassrls, "
                        "pg_get_userbyid(n.nspowner) FROM pg_roles r, pg_namespace n "
                        "WHERE r.rolname = current_user AND n.nspname = 'pm_vector'").fetchone()
    assert row[1:] == (False, False, False, False, row[0])
    with psycopg.connect(embedded.url_if_running()) as c:  # the server's superuser: migrations only
        assert c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0] is True
    assert database_url() != embedded.url_if_running()


def test_downgrade_gives_the_old_grants_back_and_upgrade_the_matrix(fresh_url):
    """0022's downgrade: the grants of before (the query role reads every table, PUBLIC executes every
    function), the objects back with the migrating superuser; the upgrade: the matrix again. The
    embedded database itself stays the owner role's (no REASSIGN OWNED of its shared objects)."""
    from alembic import command

    from pm_vector.db import postgres
    from pm_vector.db.postgres.migrate import alembic_config, upgrade_to_head

    def state(c):
        return c.execute(
            "SELECT pg_get_userbyid(n.nspowner), has_table_privilege('pm_vector_query', 'pm_vector.request_log', "
            "'SELECT'), has_column_privilege('pm_vector_query', 'pm_vector.items', 'features', 'SELECT'), "
            "has_function_privilege('public', 'pm_vector.pm_knn_batch(text, vector[], integer, integer)', "
            "'EXECUTE'), (SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'pm_vector') "
            "FROM pg_namespace n WHERE n.nspname = 'pm_vector'").fetchone()

    with psycopg.connect(fresh_url, autocommit=True) as c:
        postgres.ensure_pgvector(c)
    upgrade_to_head(fresh_url)
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert state(c) == ("pm_vector_owner", False, False, False, "pm_vector_owner")
    command.downgrade(alembic_config(fresh_url), "0021_sync_rejected")
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert state(c) == ("postgres", True, True, True, "pm_vector_owner")
    upgrade_to_head(fresh_url)
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert state(c) == ("pm_vector_owner", False, False, False, "pm_vector_owner")
