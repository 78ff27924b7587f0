"""KAHM roles: stored class models with per-item class-matching scores, membership audits,
and the provenance of anchor sets (e.g. differentially private fabricated anchors).

* ``kahm_models``: one fitted KAHM classifier per row (one wide KAHM per class, Definition 7),
  of kind ``raw`` (fitted on the items), ``noisy`` (Definition 12) or ``fabricated``
  (Definition 15). The model itself is the bytes of :meth:`pm_vector.kahm.KAHMClassifier.save`
  (tensors + JSON, read back with ``torch.load(weights_only=True)``). A collection's newest
  model is the one that serves.
* ``kahm_item_scores``: the class-matching scores (Definition 8) of every item under a model,
  written with it in one transaction, so a resolved request returns them by primary-key lookups
  instead of running the models per request.
* ``kahm_audits``: membership-inference audit reports (eq 69), raw vs fabricated.
* ``anchor_sets.provenance``: how a set was made (``NULL`` = registered by the user; for a
  fabricated anchor the mechanism, epsilon, delta, sensitivity, clipping range, sizes).

Views and SQL functions are read from ``sql/0004_kahm.sql``.

Revision ID: 0004_kahm
Revises: 0003_request_log_storage
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0004_kahm"
down_revision = "0003_request_log_storage"
branch_labels = None
depends_on = None

S = "pm_vector"
NOW = sa.text("now()")


def upgrade() -> None:
    op.add_column("anchor_sets", sa.Column("provenance", pg.JSONB, nullable=True), schema=S)

    op.create_table(
        "kahm_models",
        sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("collection_id", sa.BigInteger,
                  sa.ForeignKey(f"{S}.collections.id", ondelete="CASCADE", name="fk_kahm_models_collection"),
                  nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("params", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("privacy", pg.JSONB, nullable=True),
        sa.Column("classes", pg.ARRAY(sa.BigInteger), nullable=False),
        sa.Column("n_features", sa.Integer, nullable=False),
        sa.Column("n_items", sa.Integer, nullable=False),
        sa.Column("model", sa.LargeBinary, nullable=False),
        sa.Column("timings", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("worker", pg.JSONB, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.CheckConstraint("kind IN ('raw', 'noisy', 'fabricated')", name="ck_kahm_models_kind"),
        sa.CheckConstraint("cardinality(classes) >= 1", name="ck_kahm_models_classes"),
        schema=S,
    )
    op.create_index("ix_kahm_models_collection_id", "kahm_models", ["collection_id", "id"], schema=S)

    op.create_table(
        "kahm_item_scores",
        sa.Column("model_id", sa.BigInteger,
                  sa.ForeignKey(f"{S}.kahm_models.id", ondelete="CASCADE", name="fk_kahm_item_scores_model"),
                  primary_key=True),
        # no foreign key to items: scores of a deleted item are never looked up and go with the model
        sa.Column("item_id", sa.BigInteger, primary_key=True),
        sa.Column("predicted", sa.BigInteger, nullable=False),
        sa.Column("scores", pg.ARRAY(sa.REAL), nullable=False),
        schema=S,
    )

    op.create_table(
        "kahm_audits",
        sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("collection_id", sa.BigInteger,
                  sa.ForeignKey(f"{S}.collections.id", ondelete="CASCADE", name="fk_kahm_audits_collection"),
                  nullable=False),
        sa.Column("params", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("report", pg.JSONB, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        schema=S,
    )
    op.create_index("ix_kahm_audits_collection_id", "kahm_audits", ["collection_id", "id"], schema=S)

    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0004_kahm.sql")


def downgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0004_kahm_drop.sql")
    op.drop_table("kahm_audits", schema=S)
    op.drop_table("kahm_item_scores", schema=S)
    op.drop_table("kahm_models", schema=S)
    op.drop_column("anchor_sets", "provenance", schema=S)
    execute_sql_file(driver, "0001_views.sql")   # pm_anchor_sets as 0001 installed it
