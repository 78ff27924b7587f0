"""Migration 0030: ``pm_shard_install`` takes the shard's query login and the functions it may
execute there (``sql/0030_shard_functions.sql``); its downgrade brings back migration 0011's
function exactly, its upgrade this one, each owned by the owner and not executable by PUBLIC or the
query role. (The install itself needs a cluster: ``tests/cluster/test_cluster_shard_functions.py``.)"""

from __future__ import annotations

import psycopg

NEW = "pm_vector.pm_shard_install(text,text,text[])"
OLD = "pm_vector.pm_shard_install(text)"
STATE = ("SELECT p.oid::regprocedure::text, pg_get_userbyid(p.proowner)::text, p.prosrc, "
         "EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a WHERE a.grantee = 0), "
         "has_function_privilege('pm_vector_query', p.oid, 'EXECUTE') FROM pg_proc p "
         "WHERE p.oid IN (to_regprocedure(%s), to_regprocedure(%s))")


def _body_0011() -> str:
    from pm_vector.db.postgres.migrate import sql_dir

    text = (sql_dir() / "0011_cluster.sql").read_text(encoding="utf-8")
    start = text.index("CREATE OR REPLACE FUNCTION pm_vector.pm_shard_install(shard text)")
    return text[text.index("AS $$", start) + len("AS $$"):text.index("END $$;", start) + len("END ")]


def test_0030_down_and_up(fresh_url):
    from alembic import command

    from pm_vector.db import postgres
    from pm_vector.db.postgres.migrate import alembic_config, upgrade_to_head

    def state():
        with psycopg.connect(fresh_url, autocommit=True) as c:
            return c.execute(STATE, [NEW, OLD]).fetchall()

    with psycopg.connect(fresh_url, autocommit=True) as c:
        postgres.ensure_pgvector(c)
    upgrade_to_head(fresh_url)
    ((sig, owner, src, public, query),) = state()
    assert (sig, owner, public, query) == (NEW, "pm_vector_owner", False, False)
    assert "REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pm_vector FROM PUBLIC" in src and "GRANT EXECUTE" in src
    command.downgrade(alembic_config(fresh_url), "0029_index_upto")
    ((sig, owner, src, public, query),) = state()
    assert (sig, owner, public, query) == (OLD, "pm_vector_owner", False, False)
    assert src == _body_0011()  # 0011's body, exactly
    upgrade_to_head(fresh_url)
    assert [r[:2] + r[3:] for r in state()] == [(NEW, "pm_vector_owner", False, False)]
