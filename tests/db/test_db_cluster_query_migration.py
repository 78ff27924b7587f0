"""Migration 0028: ``pm_register_shard`` takes the shard's query login (the query role's USAGE on the
shard's server and its user mappings), and the query role may read what a sharded answer reads on
the coordinator (``pm_vector.shards``' names and addresses, ``pm_shard_reset``); its downgrade brings
back migration 0025's function and matrix, its upgrade this one. (Registration itself needs a shard
that asks for a password: ``tests/cluster/test_cluster_query_login.py``.)"""

from __future__ import annotations

import psycopg

NEW = "pm_vector.pm_register_shard(text,text,text,text,text,text,text,text)"
OLD = "pm_vector.pm_register_shard(text,text,text,text,text,text)"
RIGHTS = ("SELECT to_regprocedure(%s) IS NOT NULL, to_regprocedure(%s) IS NOT NULL, "
          "has_column_privilege('pm_vector_query', 'pm_vector.shards', 'host', 'SELECT'), "
          "has_column_privilege('pm_vector_query', 'pm_vector.shards', 'dbname', 'SELECT'), "
          "has_function_privilege('pm_vector_query', 'pm_vector.pm_shard_reset(text[])', 'EXECUTE')")


def test_0028_down_and_up(fresh_url):
    from alembic import command

    from pm_vector.db import postgres
    from pm_vector.db.postgres.migrate import alembic_config, upgrade_to_head

    with psycopg.connect(fresh_url, autocommit=True) as c:
        postgres.ensure_pgvector(c)
    upgrade_to_head(fresh_url)
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert c.execute(RIGHTS, [NEW, OLD]).fetchone() == (True, False, True, False, True)
        src = c.execute("SELECT prosrc FROM pg_proc WHERE oid = %s::regprocedure", [NEW]).fetchone()[0]
        acl = c.execute("SELECT proacl::text[], pg_get_userbyid(proowner)::text FROM pg_proc "
                        "WHERE oid = %s::regprocedure", [NEW]).fetchone()
    assert "GRANT USAGE ON FOREIGN SERVER" in src and "query_login" in src and "MAPPING FOR PUBLIC" not in src
    assert acl[1] == "pm_vector_owner" and not any(a.startswith("=") for a in acl[0] or [])  # PUBLIC: nothing
    command.downgrade(alembic_config(fresh_url), "0025_cluster_owner")
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert c.execute(RIGHTS, [NEW, OLD]).fetchone() == (False, True, False, False, False)
    upgrade_to_head(fresh_url)
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert c.execute(RIGHTS, [NEW, OLD]).fetchone() == (True, False, True, False, True)
