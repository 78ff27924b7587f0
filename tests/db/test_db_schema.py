"""The schema: migrations at head, ORM models equal to the migrated schema, downgrade/upgrade."""

from __future__ import annotations

import psycopg
import pytest

TABLES = {"collections", "ingests", "items", "anchor_sets", "anchors", "embedding_runs", "request_log",
          "kahm_models", "kahm_item_scores", "kahm_audits", "alembic_version"}
FUNCTIONS = {"pm_knn", "pm_knn_batch", "pm_knn_batch_explain", "pm_active_run", "pm_create_run_tables",
             "pm_build_run_indexes", "pm_drop_run_tables", "pm_class_scores"}
VIEWS = {"pm_collections", "pm_runs", "pm_anchor_sets", "pm_requests", "pm_kahm_models", "pm_kahm_audits",
         "attach_status"}


def _objects(c):
    tables = {r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'pm_vector'").fetchall()}
    funcs = {r[0] for r in c.execute("SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                                     "WHERE n.nspname = 'pm_vector'").fetchall()}
    views = {r[0] for r in c.execute("SELECT viewname FROM pg_views WHERE schemaname = 'pm_vector'").fetchall()}
    return tables, funcs, views


def test_schema_at_head(conn):
    from pm_vector.db.postgres.migrate import current_revision, head_revision

    assert current_revision(conn) == head_revision()
    tables, funcs, views = _objects(conn)
    assert TABLES <= tables and FUNCTIONS <= funcs and VIEWS <= views


def test_models_match_migrated_schema(db):
    """alembic autogenerate finds nothing to change: the ORM models are the migrated schema."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from pm_vector.db.store.models import Base

    def include_name(name, type_, parent_names):
        if type_ == "schema":
            return name == "pm_vector"
        if type_ == "table":
            return name != "alembic_version" and not name.startswith("run_")
        return True

    with db.get_engine().connect() as c:
        ctx = MigrationContext.configure(c, opts={"include_schemas": True, "include_name": include_name,
                                                  "compare_type": True, "compare_server_default": False})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []


def test_sql_files_are_installed_verbatim(conn):
    """The functions in the database are those of sql/0001_functions.sql."""
    from pm_vector.db.postgres.migrate import sql_dir

    text = (sql_dir() / "0001_functions.sql").read_text()
    src = conn.execute("SELECT prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                       "WHERE n.nspname = 'pm_vector' AND p.proname = 'pm_knn'").fetchone()[0]
    assert src.strip() in text
    cfg = conn.execute("SELECT proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                       "WHERE n.nspname = 'pm_vector' AND p.proname = 'pm_knn'").fetchone()[0]
    assert any(c.startswith("search_path=pm_vector") and "public" in c for c in cfg)


def test_downgrade_and_upgrade_again(fresh_url):
    import numpy as np
    from alembic import command

    from pm_vector.db import postgres
    from pm_vector.db.postgres.migrate import alembic_config, head_revision, upgrade_to_head

    with psycopg.connect(fresh_url, autocommit=True) as c:
        postgres.ensure_pgvector(c)
    assert upgrade_to_head(fresh_url) == {"from_revision": None, "to_revision": head_revision()}
    with psycopg.connect(fresh_url, autocommit=True) as c:
        # a run table, created the way jobs do, must go with the downgrade too
        c.execute("INSERT INTO pm_vector.collections (name, feature_dim, feature_type, metric, labels) "
                  "VALUES ('m', 2, 'vector', 'l2', '{0}')")
        c.execute("INSERT INTO pm_vector.embedding_runs (collection_id, seed, embedding_dim) "
                  "SELECT id, 1, 2 FROM pm_vector.collections")
        rid = c.execute("SELECT max(id) FROM pm_vector.embedding_runs").fetchone()[0]
        c.execute("SELECT pm_vector.pm_create_run_tables(%s)", [rid])
        assert c.execute("SELECT to_regclass(%s) IS NOT NULL", [f"pm_vector.run_{rid}_items"]).fetchone()[0]
    command.downgrade(alembic_config(fresh_url), "base")
    with psycopg.connect(fresh_url, autocommit=True) as c:
        tables, funcs, views = _objects(c)
        assert tables == {"alembic_version"} and not funcs and not views
    assert upgrade_to_head(fresh_url)["to_revision"] == head_revision()
    with psycopg.connect(fresh_url, autocommit=True) as c:
        tables, funcs, views = _objects(c)
        assert TABLES <= tables and FUNCTIONS <= funcs and VIEWS <= views
        assert np.isclose(c.execute("SELECT '[1,2]'::vector <-> '[1,3]'::vector").fetchone()[0], 1.0)


def test_orm_models_query_the_schema(db, cname):
    import numpy as np
    from sqlalchemy import func, select

    from pm_vector.db.store.models import AnchorSet, Collection, EmbeddingRun, Item

    db.create_collection(cname, 3, [0, 1])
    db.ingest(cname, np.eye(3), [0, 1, 0], external_ids=["a", "b", "c"])
    db.register_anchor_set(cname, np.eye(3), [0, 1, 1])
    with db.session_scope() as s:
        c = s.scalars(select(Collection).where(Collection.name == cname)).one()
        assert c.feature_dim == 3 and c.labels == [0, 1] and c.runs == []
        items = s.scalars(select(Item).where(Item.collection_id == c.id).order_by(Item.id)).all()
        assert [i.external_id for i in items] == ["a", "b", "c"]
        assert np.allclose(items[1].features, [0, 1, 0])  # pgvector type registered on connect
        near = s.scalars(select(Item).where(Item.collection_id == c.id)
                         .order_by(Item.features.l2_distance([0, 0.9, 0.1])).limit(1)).one()
        assert near.external_id == "b"
        aset = s.scalars(select(AnchorSet).where(AnchorSet.collection_id == c.id)).one()
        assert [a.position for a in aset.anchors] == [0, 1, 2] and [a.label for a in aset.anchors] == [0, 1, 1]
        assert s.scalar(select(func.count()).select_from(EmbeddingRun).where(EmbeddingRun.collection_id == c.id)) == 0
