"""Migration 0020 on a database with attached collections: the upgrade makes their triggers again
the new way (no trigger arguments; BEFORE TRUNCATE too), records their columns and writes their
keys canonically (numeric 1.50 -> 1.5); the downgrade puts back 0016's triggers (the collection id
and the columns as arguments) and functions, and a second upgrade the new ones again."""

from __future__ import annotations

import psycopg


def _triggers(c, table):
    return sorted((r[0], bytes(r[1])) for r in c.execute(
        "SELECT tgname, tgargs FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal", [table]).fetchall())


def test_upgrade_and_downgrade_remake_the_triggers_of_attached_collections(fresh_url):
    from alembic import command

    from pm_vector.db import postgres
    from pm_vector.db.postgres.migrate import alembic_config, upgrade_to_head

    with psycopg.connect(fresh_url, autocommit=True) as c:
        postgres.ensure_pgvector(c)
    command.upgrade(alembic_config(fresh_url), "0019_attach_status")
    with psycopg.connect(fresh_url, autocommit=True) as c:
        c.execute("CREATE TABLE public.docs (id numeric PRIMARY KEY, embedding vector(3), title text)")
        c.execute("INSERT INTO public.docs VALUES (1.50, '[1,0,0]', 'a'), (2, '[0,1,0]', 'b')")
        cid = c.execute("SELECT pm_vector.pm_attach_table('docs', 'public.docs', 'id', 'embedding', NULL, "
                        "'{title}')").fetchone()[0]["collection_id"]
        old = _triggers(c, "public.docs")
        assert [n for n, _ in old] == [f"pm_attach_{cid}_d", f"pm_attach_{cid}_i", f"pm_attach_{cid}_u"]
        assert all(a.startswith(str(cid).encode()) for _, a in old)  # the collection id as the first argument
        assert {r[0] for r in c.execute("SELECT external_id FROM pm_vector.items").fetchall()} == {"1.50", "2"}
    upgrade_to_head(fresh_url)
    with psycopg.connect(fresh_url, autocommit=True) as c:
        new = _triggers(c, "public.docs")
        assert [n for n, _ in new] == [f"pm_attach_{cid}_{op}" for op in "ditu"] and all(a == b"" for _, a in new)
        assert {r[0] for r in c.execute("SELECT external_id FROM pm_vector.items").fetchall()} == {"1.5", "2"}
        att = c.execute("SELECT settings -> 'attached' FROM pm_vector.collections WHERE id = %s", [cid]).fetchone()[0]
        assert set(att["columns"]) == {"id", "embedding", "title"} and att["relid"] > 0
        c.execute("UPDATE public.docs SET title = 'c' WHERE id = 1.5000")
        assert c.execute("SELECT op, key FROM pm_vector.attach_changes").fetchall() == [("P", "1.5")]
        assert c.execute("SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'pm_vector_attach_%'").fetchone()[0] == 3
    command.downgrade(alembic_config(fresh_url), "0019_attach_status")
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert _triggers(c, "public.docs") == old
        assert c.execute("SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'pm_vector_attach_%'").fetchone()[0] == 0
        assert c.execute("SELECT to_regprocedure('pm_vector.pm_attach_key(bigint)')").fetchone()[0] is None
        assert "to_jsonb" in c.execute("SELECT prosrc FROM pg_proc WHERE oid = 'pm_vector.pm_attach_capture'::regproc"
                                       ).fetchone()[0]  # 0016's capture again
        c.execute("INSERT INTO public.docs VALUES (3, '[0,0,1]', 'd')")
        assert ("I", "3") in c.execute("SELECT op, key FROM pm_vector.attach_changes").fetchall()
        assert "broken" not in c.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = "
                                         "'pm_vector' AND table_name = 'attach_status'").fetchall()
    upgrade_to_head(fresh_url)
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert [n for n, _ in _triggers(c, "public.docs")] == [f"pm_attach_{cid}_{op}" for op in "ditu"]
        c.execute("DROP TABLE public.docs")
