"""Class-rows requests (format ``pm_vector.class-rows/1``): per-run class frames, prior, graph, hubs.

* ``embedding_runs.class_frames`` (json, kept verbatim): the run's :class:`~pm_vector.manifold.class_frames.ClassFrames`
  fit on the run's public anchor set (``frames.to_dict()``), published to clients;
* ``embedding_runs.class_rows`` (jsonb): the parameters of the class-rows part (``n_components``,
  ``clip_quantile``, ``graph_degree``, ``max_prior``), the class order, the class sizes, the
  frames' digest and ``status`` (``ready``, or ``unavailable`` with ``error`` when the anchor set
  cannot give frames);
* ``embedding_runs.public_projection`` (json): the run's
  :class:`~pm_vector.manifold.codes.PublicProjection` fit on its public anchor set, published to
  clients (they re-rank candidates by the items' codes when raw features are not handed out);
* per run, created by the embedding job and dropped with the run: ``run_<id>_prior`` (partitioned
  by class, HNSW per class), ``run_<id>_neighbors``, ``run_<id>_hubs``, ``run_<id>_codes``.

Functions (``pm_shortlist``, its explain, helpers; ``pm_run_table`` and ``pm_drop_run_tables``
now know the new tables) are read from ``sql/0005_class_rows.sql``; the downgrade runs
``sql/0005_class_rows_drop.sql``.

Revision ID: 0005_class_rows
Revises: 0004_kahm
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0005_class_rows"
down_revision = "0004_kahm"
branch_labels = None
depends_on = None

S = "pm_vector"


def upgrade() -> None:
    # json, not jsonb: the document is kept verbatim. jsonb stores numbers as numeric, which has no
    # negative zero, and -0.0 entries of the frames (sign-flipped zero loadings) would come back as
    # 0.0 -- other bytes, so another frames digest than the one the server computed.
    op.add_column("embedding_runs", sa.Column("class_frames", pg.JSON, nullable=True), schema=S)
    op.add_column("embedding_runs", sa.Column("class_rows", pg.JSONB, nullable=True), schema=S)
    op.add_column("embedding_runs", sa.Column("public_projection", pg.JSON, nullable=True), schema=S)
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0005_class_rows.sql")


def downgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0005_class_rows_drop.sql")
    op.drop_column("embedding_runs", "public_projection", schema=S)
    op.drop_column("embedding_runs", "class_rows", schema=S)
    op.drop_column("embedding_runs", "class_frames", schema=S)
