"""Initial schema: collections, items, anchor sets, embedding runs, request log; SQL functions and views.

Tables are created here; the functions, triggers and views are read from ``sql/0001_*.sql``.
A later change to those files goes into a new file (``sql/0002_*.sql``, ``CREATE OR REPLACE``)
installed by a new migration, so that this revision always installs what it installed.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import HALFVEC, VECTOR
from sqlalchemy.dialects import postgresql as pg

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

S = "pm_vector"
NOW = sa.text("now()")


def _ts(name: str, nullable: bool = True, default: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable, server_default=NOW if default else None)


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")

    op.create_table(
        "collections",
        sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("feature_dim", sa.Integer, nullable=False),
        sa.Column("feature_type", sa.Text, nullable=False),
        sa.Column("metric", sa.Text, nullable=False),
        sa.Column("labels", pg.ARRAY(sa.BigInteger), nullable=False),
        sa.Column("settings", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("active_run_id", sa.BigInteger, nullable=True),
        _ts("created_at", False, True),
        _ts("updated_at", False, True),
        sa.UniqueConstraint("name", name="uq_collections_name"),
        sa.CheckConstraint("feature_dim BETWEEN 1 AND 16000", name="ck_collections_feature_dim"),
        sa.CheckConstraint("feature_type IN ('vector', 'halfvec')", name="ck_collections_feature_type"),
        sa.CheckConstraint("metric IN ('l2', 'cosine', 'ip')", name="ck_collections_metric"),
        sa.CheckConstraint("cardinality(labels) >= 1", name="ck_collections_labels"),
        sa.CheckConstraint("length(name) BETWEEN 1 AND 128", name="ck_collections_name"),
        schema=S,
    )

    op.create_table(
        "ingests",
        sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("collection_id", sa.BigInteger,
                  sa.ForeignKey(f"{S}.collections.id", ondelete="CASCADE", name="fk_ingests_collection"),
                  nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="running"),
        sa.Column("n_rows", sa.Integer, nullable=False, server_default="0"),
        sa.Column("n_written", sa.Integer, nullable=False, server_default="0"),
        sa.Column("error", sa.Text),
        sa.Column("worker", pg.JSONB),
        _ts("started_at", False, True),
        _ts("finished_at"),
        sa.CheckConstraint("status IN ('running', 'succeeded', 'failed')", name="ck_ingests_status"),
        schema=S,
    )
    op.create_index("ix_ingests_collection_status", "ingests", ["collection_id", "status"], schema=S)

    op.create_table(
        "items",
        sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("collection_id", sa.BigInteger,
                  sa.ForeignKey(f"{S}.collections.id", ondelete="CASCADE", name="fk_items_collection"),
                  nullable=False),
        sa.Column("external_id", sa.Text),
        sa.Column("label", sa.BigInteger, nullable=False),
        sa.Column("features", VECTOR()),
        sa.Column("features_half", HALFVEC()),
        sa.Column("payload", pg.JSONB),
        sa.Column("ingest_id", sa.BigInteger),
        _ts("created_at", False, True),
        sa.UniqueConstraint("collection_id", "external_id", name="uq_items_collection_external_id"),
        sa.CheckConstraint("num_nonnulls(features, features_half) = 1", name="ck_items_one_feature_column"),
        schema=S,
    )
    op.create_index("ix_items_collection_id", "items", ["collection_id", "id"], schema=S)

    op.create_table(
        "anchor_sets",
        sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("collection_id", sa.BigInteger,
                  sa.ForeignKey(f"{S}.collections.id", ondelete="CASCADE", name="fk_anchor_sets_collection"),
                  nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("n_rows", sa.Integer, nullable=False),
        sa.Column("description", sa.Text),
        _ts("created_at", False, True),
        sa.CheckConstraint("role IN ('anchor', 'dummy')", name="ck_anchor_sets_role"),
        schema=S,
    )
    op.create_index("ix_anchor_sets_collection_role", "anchor_sets", ["collection_id", "role", "id"], schema=S)

    op.create_table(
        "anchors",
        sa.Column("anchor_set_id", sa.BigInteger,
                  sa.ForeignKey(f"{S}.anchor_sets.id", ondelete="CASCADE", name="fk_anchors_anchor_set"),
                  primary_key=True),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("label", sa.BigInteger, nullable=False),
        sa.Column("features", VECTOR()),
        sa.Column("features_half", HALFVEC()),
        sa.CheckConstraint("position >= 0", name="ck_anchors_position"),
        sa.CheckConstraint("num_nonnulls(features, features_half) = 1", name="ck_anchors_one_feature_column"),
        schema=S,
    )

    op.create_table(
        "embedding_runs",
        sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("collection_id", sa.BigInteger,
                  sa.ForeignKey(f"{S}.collections.id", ondelete="CASCADE", name="fk_embedding_runs_collection"),
                  nullable=False),
        sa.Column("anchor_set_id", sa.BigInteger,
                  sa.ForeignKey(f"{S}.anchor_sets.id", ondelete="CASCADE", name="fk_embedding_runs_anchor_set"),
                  nullable=True),
        sa.Column("status", sa.Text, nullable=False, server_default="pending"),
        sa.Column("params", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("seed", sa.BigInteger, nullable=False),
        sa.Column("embedding_dim", sa.Integer),
        sa.Column("n_items", sa.Integer),
        sa.Column("n_anchors", sa.Integer),
        sa.Column("timings", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("error", sa.Text),
        sa.Column("worker", pg.JSONB),
        _ts("created_at", False, True),
        _ts("started_at"),
        _ts("finished_at"),
        sa.UniqueConstraint("collection_id", "id", name="uq_embedding_runs_collection_id_id"),
        sa.CheckConstraint("status IN ('pending', 'running', 'succeeded', 'failed')",
                           name="ck_embedding_runs_status"),
        sa.CheckConstraint("embedding_dim BETWEEN 1 AND 4000", name="ck_embedding_runs_embedding_dim"),
        schema=S,
    )
    op.create_index("ix_embedding_runs_collection_status", "embedding_runs", ["collection_id", "status"], schema=S)

    # the active run must be a run of the same collection
    op.create_foreign_key(
        "fk_collections_active_run", "collections", "embedding_runs",
        ["id", "active_run_id"], ["collection_id", "id"],
        source_schema=S, referent_schema=S)

    op.create_table(
        "request_log",
        sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("collection_id", sa.BigInteger,
                  sa.ForeignKey(f"{S}.collections.id", ondelete="SET NULL", name="fk_request_log_collection"),
                  nullable=True),
        sa.Column("collection_name", sa.Text, nullable=False),
        sa.Column("run_id", sa.BigInteger),
        sa.Column("request", pg.JSONB, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="ok"),
        sa.Column("error", sa.Text),
        sa.Column("row_count", sa.Integer),
        _ts("received_at", False, True),
        _ts("finished_at"),
        sa.Column("duration_ms", sa.Float),
        sa.CheckConstraint("status IN ('ok', 'error')", name="ck_request_log_status"),
        schema=S,
    )
    op.create_index("ix_request_log_collection_received", "request_log", ["collection_id", "received_at"], schema=S)

    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0001_functions.sql")
    execute_sql_file(driver, "0001_views.sql")


def downgrade() -> None:
    op.execute(f"""
        DO $$
        DECLARE t text;
        BEGIN
          FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE n.nspname = '{S}' AND c.relkind = 'r' AND c.relname ~ '^run_[0-9]+_(items|anchors)$'
          LOOP
            EXECUTE format('DROP TABLE IF EXISTS {S}.%I', t);
          END LOOP;
        END $$;
    """)
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0001_drop.sql")
    op.drop_constraint("fk_collections_active_run", "collections", schema=S, type_="foreignkey")
    for t in ("request_log", "embedding_runs", "anchors", "anchor_sets", "items", "ingests", "collections"):
        op.drop_table(t, schema=S)
