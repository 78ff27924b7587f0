"""Query keys on a cluster run as the query role on the shards too (issue 35, build 1; migration
0028): the service's query keys resolve on their own login (not the owner's sessions), a sharded
answer reaches each shard as the shard's query login ``pm_vector_query`` through the query roles'
user mappings, and that login may read only what a sharded answer reads there (the privilege
matrix's shard side, :func:`pm_vector.db.postgres.privileges.expected_shard_relation_rights`,
compared with each shard's catalog). Before 0028 only the owner had a mapping: the service ran
query keys' resolves as the owner, and no shard had a query login."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

SHARDS = ("shard0", "shard1")


@pytest.fixture(scope="module")
def qsvc(local_cluster, both):
    from pm_vector.service.auth import create_key
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    key = create_key("cluster query keys")  # role query, the default
    with ServiceThread(ServiceSettings(pool_max=4)) as s:
        yield s, key["key"]


def _shard_login_url(local_cluster, shard: str) -> str:
    from pm_vector.db.postgres.cluster_logins import passwords
    from pm_vector.db.postgres.config import with_login
    from pm_vector.db.postgres.privileges import SHARD_QUERY_ROLE

    node = next(n for n in local_cluster.topology()["nodes"] if n["name"] == shard)
    return with_login(f"postgresql://127.0.0.1:{int(node['port'])}/pm_vector", SHARD_QUERY_ROLE,
                      passwords(local_cluster.cluster_dir())[SHARD_QUERY_ROLE])


def test_a_query_keys_sharded_answer_reaches_the_shards_as_the_query_login(qsvc, both, admin_urls):
    import httpx

    from pm_vector.client.budget import MemoryBudget
    from pm_vector.client.http import Client

    service, key = qsvc
    state = service.app.state.service_state
    # the service may use the query role on the cluster (USAGE on every shard's server), and its
    # query keys have their own login: before 0028 both were None (resolved as the owner, warned)
    assert state.query_role == "pm_vector_query"
    assert state.query_pool is not None and state.query_login is not None
    Xq, yq = both["split"].query
    with Client(service.url, key, budget=MemoryBudget()) as c:  # the two releases answered on the shards
        reqs = [c.build_request("cl_digits", np.asarray(Xq[4], np.float64), int(yq[4]), epsilon=1.0, shortlist=32,
                                release=release)[0] for release in ("gaussian", "cells")]
    for req in reqs:
        for _ in range(3):  # on the primary's query pool or the replica's, in rotation
            r = httpx.post(f"{service.url}/collections/cl_digits/resolve", headers={"Authorization": f"Bearer {key}"},
                           json={"request": req.to_dict(), "k": 8}, timeout=60)
            assert r.status_code == 200, (req.release, r.text)
    # the shard connections the answers opened (dblink keeps them per session) log in as the query login
    for shard in SHARDS:
        with psycopg.connect(admin_urls[shard], autocommit=True) as c:
            users = {u for (u,) in c.execute("SELECT usename::text FROM pg_stat_activity WHERE "
                                             "backend_type = 'client backend' AND pid <> pg_backend_pid()")}
        assert "pm_vector_query" in users, (shard, users)
    # a query key's session reaches each shard as the query login, whatever it runs
    with state.query_pool.connection() as conn:
        assert conn.execute("SELECT session_user::text").fetchone()[0] == state.query_login[0]
        for shard in SHARDS:
            got = conn.execute("SELECT * FROM dblink(pm_vector.pm_shard_server(%s), %s) AS t(s text, c text)",
                               [shard, "SELECT session_user::text, current_user::text"]).fetchone()
            assert got == ("pm_vector_query", "pm_vector_query"), (shard, got)


def test_the_shards_query_login_reads_only_what_a_sharded_answer_reads(qsvc, both, local_cluster, node_urls):
    rid = int(both["run"]["run_id"])
    with psycopg.connect(node_urls["shard0"], autocommit=True) as owner:  # the owner, on the shard
        owner.execute("CREATE TABLE IF NOT EXISTS pm_vector.not_for_answers (secret text)")
        owner.execute("INSERT INTO pm_vector.not_for_answers VALUES ('x')")
        (partition,) = owner.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                                     "WHERE i.inhparent = %s::regclass LIMIT 1",
                                     [f"pm_vector.run_{rid}_prior"]).fetchone()
    try:
        with psycopg.connect(_shard_login_url(local_cluster, "shard0"), autocommit=True) as q:
            assert q.execute("SELECT session_user::text").fetchone()[0] == "pm_vector_query"
            assert q.execute(f"SELECT count(*) FROM pm_vector.run_{rid}_prior").fetchone()[0] > 0
            assert q.execute("SELECT count(*) FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0] == 1
            for stmt in ("SELECT * FROM pm_vector.not_for_answers",  # a table the owner made: no default grant
                         f"SELECT * FROM pm_vector.{partition}",  # a partition: read through its parent only
                         "CREATE TABLE pm_vector.mine (x int)",  # no CREATE in the schema
                         f"DELETE FROM pm_vector.run_{rid}_prior"):  # reads only
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    q.execute(stmt)
    finally:
        with psycopg.connect(node_urls["shard0"], autocommit=True) as owner:
            owner.execute("DROP TABLE IF EXISTS pm_vector.not_for_answers")


def test_the_shards_catalog_says_what_the_matrix_says(qsvc, both, admin_urls):
    """Every relation of each shard's schema ``pm_vector`` gives the query login exactly the rights
    the matrix's shard side names (none for a relation it does not name), no column privilege, no
    default privilege; USAGE on the schema, no CREATE."""
    from pm_vector.db.postgres.privileges import SHARD_QUERY_ROLE, expected_shard_relation_rights, shard_answer_tables
    from pm_vector.db.runs.kinds import KINDS

    kinds = shard_answer_tables(KINDS)
    assert kinds == {"items", "prior", "neighbors", "hubs", "cells"}
    for shard in SHARDS:
        with psycopg.connect(admin_urls[shard], autocommit=True) as c:
            rows = c.execute(
                "SELECT c.relname, array(SELECT DISTINCT a.privilege_type FROM aclexplode(c.relacl) a "
                "WHERE a.grantee = %s::regrole ORDER BY 1), EXISTS (SELECT 1 FROM pg_attribute t WHERE "
                "t.attrelid = c.oid AND t.attacl IS NOT NULL) FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = 'pm_vector' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')",
                [SHARD_QUERY_ROLE]).fetchall()
            granted = {name for name, privs, _ in rows if privs}
            assert f"run_{int(both['run']['run_id'])}_prior" in granted and "embedding_runs" in granted, granted
            for name, privs, column_acl in rows:
                want = expected_shard_relation_rights(name, kinds) or ()
                assert tuple(privs) == tuple(want), (shard, name, privs, want)
                assert not column_acl, (shard, name)
            assert c.execute("SELECT has_schema_privilege(%s, 'pm_vector', 'USAGE'), "
                             "has_schema_privilege(%s, 'pm_vector', 'CREATE')",
                             [SHARD_QUERY_ROLE, SHARD_QUERY_ROLE]).fetchone() == (True, False)
            assert c.execute("SELECT count(*) FROM pg_default_acl d, aclexplode(d.defaclacl) a "
                             "WHERE a.grantee = %s::regrole", [SHARD_QUERY_ROLE]).fetchone()[0] == 0
            assert c.execute("SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolbypassrls FROM pg_roles "
                             "WHERE rolname = %s", [SHARD_QUERY_ROLE]).fetchone()[0] is False


def test_an_older_clusters_logins_gain_the_shards_query_password(tmp_path):
    """A cluster made before migration 0028 has no password for the shards' query login: the first
    read adds one (a CSPRNG's), keeps the others, and the file stays mode 0600."""
    import json
    import os

    from pm_vector.db.postgres.cluster_logins import passwords

    (tmp_path / "logins.json").write_text(json.dumps({"postgres": "p" * 43, "pm_vector_owner": "o" * 43}))
    os.chmod(tmp_path / "logins.json", 0o600)
    got = passwords(tmp_path)
    assert got["postgres"] == "p" * 43 and got["pm_vector_owner"] == "o" * 43
    assert len(got["pm_vector_query"]) >= 43 and passwords(tmp_path) == got
    assert os.stat(tmp_path / "logins.json").st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logins.json"]
