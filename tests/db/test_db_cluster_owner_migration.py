"""Migration 0025: ``pm_register_shard`` makes the foreign server and its one user mapping the
owner's (no mapping FOR PUBLIC); its downgrade brings back migration 0011's function, its upgrade
this one. (Registration itself needs a shard that asks for a password: ``tests/cluster``.)"""

from __future__ import annotations

import psycopg

SRC = ("SELECT prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
       "WHERE n.nspname = 'pm_vector' AND p.proname = 'pm_register_shard'")


def test_0025_down_and_up(fresh_url):
    from alembic import command

    from pm_vector.db import postgres
    from pm_vector.db.postgres.migrate import alembic_config

    with psycopg.connect(fresh_url, autocommit=True) as c:
        postgres.ensure_pgvector(c)
    command.upgrade(alembic_config(fresh_url), "0025_cluster_owner")  # (0028 gives it a query login: its own test)
    with psycopg.connect(fresh_url, autocommit=True) as c:
        src = c.execute(SRC).fetchone()[0]
        acl = c.execute("SELECT p.proacl::text[], pg_get_userbyid(p.proowner)::text FROM pg_proc p "
                        "WHERE p.oid = 'pm_vector.pm_register_shard(text,text,text,text,text,text)'::regprocedure"
                        ).fetchone()
    assert "MAPPING FOR PUBLIC" not in src and "CREATE USER MAPPING FOR %I" in src and "ALTER SERVER" in src
    assert acl[1] == "pm_vector_owner" and not any(a.startswith("=") for a in acl[0] or [])  # PUBLIC: nothing
    command.downgrade(alembic_config(fresh_url), "0023_delta")
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert "CREATE USER MAPPING FOR PUBLIC" in c.execute(SRC).fetchone()[0]
    command.upgrade(alembic_config(fresh_url), "0025_cluster_owner")
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert c.execute(SRC).fetchone()[0] == src
