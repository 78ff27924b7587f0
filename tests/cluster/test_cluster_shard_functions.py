"""No role gets EXECUTE on pm_vector's functions on a cluster's shards but what the matrix says
(migration 0030): ``pm_vector.pm_shard_install`` copies every function to a shard with
``pg_get_functiondef``, which carries no ACL, so before 0030 every copy had PostgreSQL's default
ACL there, EXECUTE for PUBLIC (the ``SECURITY DEFINER`` ones included), and the shard's query login
could run all of them. Now the install revokes PUBLIC's EXECUTE on every function of the shard's
schema ``pm_vector``, the owner's future functions there are not executable by PUBLIC, and the query
login may execute exactly :data:`pm_vector.db.postgres.privileges.SHARD_QUERY_FUNCTIONS`: what a
sharded answer calls on the shard (the class-rows and the cell statements, answered here as the
query role)."""

from __future__ import annotations

import psycopg
import pytest

SHARDS = ("shard0", "shard1")
KP = 16
#: a shard's functions: signature, qualified name, executable by PUBLIC (a NULL proacl is the default:
#: EXECUTE for PUBLIC), executable by the role %s, SECURITY DEFINER
FUNCTIONS = ("SELECT p.oid::regprocedure::text, n.nspname || '.' || p.proname, "
             "p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0 "
             "AND a.privilege_type = 'EXECUTE'), has_function_privilege(%s, p.oid, 'EXECUTE'), p.prosecdef "
             "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pm_vector'")


def _shard_login_url(local_cluster, shard: str) -> str:
    from pm_vector.db.postgres.cluster_logins import passwords
    from pm_vector.db.postgres.config import with_login
    from pm_vector.db.postgres.privileges import SHARD_QUERY_ROLE

    node = next(n for n in local_cluster.topology()["nodes"] if n["name"] == shard)
    return with_login(f"postgresql://127.0.0.1:{int(node['port'])}/pm_vector", SHARD_QUERY_ROLE,
                      passwords(local_cluster.cluster_dir())[SHARD_QUERY_ROLE])


def _assert_shards_as_the_matrix(admin_urls) -> None:
    from pm_vector.db.postgres.privileges import SHARD_QUERY_FUNCTIONS, SHARD_QUERY_ROLE

    for shard in SHARDS:
        with psycopg.connect(admin_urls[shard], autocommit=True) as c:
            rows = c.execute(FUNCTIONS, [SHARD_QUERY_ROLE]).fetchall()
        names = {name for _, name, *_ in rows}
        assert SHARD_QUERY_FUNCTIONS <= names, (shard, SHARD_QUERY_FUNCTIONS - names)  # the job installed them
        assert len(names) > 2 * len(SHARD_QUERY_FUNCTIONS), (shard, len(names))  # every function, not only these
        assert [sig for sig, _, public, _, _ in rows if public] == [], shard
        assert {name for _, name, _, query, _ in rows if query} == SHARD_QUERY_FUNCTIONS, shard
        definers = [sig for sig, _, _, _, definer in rows if definer]
        assert definers and all(name not in SHARD_QUERY_FUNCTIONS for _, name, _, _, d in rows if d), (shard, definers)


def test_no_shard_function_is_executable_by_public_and_the_query_login_runs_the_matrixs(both, admin_urls):
    from pm_vector.db.postgres.privileges import QUERY_FUNCTIONS, SHARD_QUERY_FUNCTIONS

    assert SHARD_QUERY_FUNCTIONS < QUERY_FUNCTIONS  # what a shard runs of an answer, the query role runs too
    _assert_shards_as_the_matrix(admin_urls)


def test_the_owners_next_function_on_a_shard_is_not_executable_by_public(both, node_urls):
    """The default privileges of the owner on the shard (the role the coordinator's mapping logs in
    as, which creates the copies): a function it makes there later starts with no EXECUTE for PUBLIC."""
    for shard in SHARDS:
        with psycopg.connect(node_urls[shard], autocommit=True) as c:  # the owner, on the shard
            c.execute("CREATE OR REPLACE FUNCTION pm_vector.pm_test_later() RETURNS int LANGUAGE sql AS 'SELECT 1'")
            try:
                assert c.execute("SELECT proacl IS NOT NULL AND NOT EXISTS (SELECT 1 FROM aclexplode(proacl) a "
                                 "WHERE a.grantee = 0) FROM pg_proc WHERE oid = "
                                 "'pm_vector.pm_test_later()'::regprocedure").fetchone()[0] is True, shard
            finally:
                c.execute("DROP FUNCTION pm_vector.pm_test_later()")


def test_the_shards_query_login_cannot_run_what_an_answer_does_not_call(both, local_cluster):
    """Logged in on a shard as its query login: a SECURITY DEFINER copy (the raw features' function)
    and an owner's function (a run's tables dropped) are refused before they run; the statement's
    helpers run."""
    with psycopg.connect(_shard_login_url(local_cluster, "shard0"), autocommit=True) as q:
        assert q.execute("SELECT pm_vector.pm_run_table(7, 'prior')").fetchone()[0] == "pm_vector.run_7_prior"
        for stmt in ("SELECT pm_vector.pm_item_features(1)", "SELECT pm_vector.pm_drop_run_tables(123456)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                q.execute(stmt)


def test_the_query_role_answers_sharded_requests_with_only_those_functions(both, admin_urls, node_urls):
    """A class-rows and a cell request on the coordinator as the query role (its user mapping: the
    shards' query login) give the owner's answer: the granted functions are all a shard runs."""
    with psycopg.connect(node_urls["coordinator"]) as c:
        doc = c.execute("SELECT r.class_rows FROM pm_vector.embedding_runs r JOIN pm_vector.collections k "
                        "ON k.active_run_id = r.id WHERE k.name = 'cl_digits'").fetchone()[0]
    assert doc.get("shards"), doc.keys()
    n_classes, d = len(doc["classes"]), int(doc["n_components"])
    rows = [[0.1 * ((i + j) % 5) for j in range(d)] for i in range(n_classes)]
    queries = [("SELECT row_index, rank, item_id, score FROM pm_vector.pm_shortlist('cl_digits', %s::float8[], "
                "%s::float8[], %s)", [rows, [1.0] * n_classes, KP]),
               ("SELECT row_index, rank, item_id, score FROM pm_vector.pm_cell_shortlist('cl_digits', %s, %s, 2.0, %s)",
                [int(doc["cells"]["levels"][0]), [i % 2 for i in range(n_classes)], KP])]
    with psycopg.connect(node_urls["coordinator"]) as c:
        want = [c.execute(q, args).fetchall() for q, args in queries]
    with psycopg.connect(admin_urls["coordinator"], autocommit=True) as c:
        c.execute("SET ROLE pm_vector_query")
        got = [c.execute(q, args).fetchall() for q, args in queries]
        # (its sessions on the shards are the query login's: what the catalog test checked is what ran)
        who = c.execute("SELECT * FROM dblink(pm_vector.pm_shard_server('shard0'), 'SELECT current_user::text') "
                        "AS t(u text)").fetchone()[0]
    assert who == "pm_vector_query"
    assert all(len(g) == n_classes * KP for g in got)
    assert got == want


def test_the_upgrade_fixes_the_shards_of_a_cluster_installed_before(both, admin_urls, node_urls):
    """A cluster installed before migration 0030 (its shards' copies executable by PUBLIC, the owner's
    default privileges there PostgreSQL's): the coordinator's upgrade installs again on every
    registered shard. (Last in this file: the coordinator goes down to 0029 and back to head.)"""
    from alembic import command

    from pm_vector.db.postgres.migrate import alembic_config, upgrade_to_head

    command.downgrade(alembic_config(admin_urls["coordinator"]), "0029_index_upto")
    for shard in SHARDS:
        with psycopg.connect(node_urls[shard], autocommit=True) as c:  # the owner, on the shard: as before 0030
            c.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pm_vector TO PUBLIC")
            c.execute("ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO PUBLIC")
            assert c.execute("SELECT count(*) FROM pg_default_acl WHERE defaclobjtype = 'f'").fetchone()[0] == 0
    with pytest.raises(AssertionError):
        _assert_shards_as_the_matrix(admin_urls)
    upgrade_to_head(admin_urls["coordinator"])
    _assert_shards_as_the_matrix(admin_urls)
    test_the_owners_next_function_on_a_shard_is_not_executable_by_public(both, node_urls)
