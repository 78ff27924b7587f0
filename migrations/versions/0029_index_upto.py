"""A run's HNSW index on its items holds the items it was built with (issue 36, writes at database speed).

An item placed in a run's delta (the sync of an attached table, ``ingest``, ``update_items``) was also
inserted into the run's HNSW index in the write's transaction: at 100,000 items about three quarters
of a sync batch's time. ``sql/0029_index_upto.sql`` makes the index partial (``WHERE item_id <=
index_upto``, the largest id at the build, recorded in the new column
``pm_vector.embedding_runs.index_upto``); ``pm_knn`` / ``pm_knn_batch`` search the index and scan the
items above it exactly, and the next merge indexes them. Runs built before keep their full index
(``index_upto`` NULL: the statement as before) until their next job.

Downgrade: ``sql/0029_index_upto_drop.sql`` (the two functions as migration 0001 made them, the
column dropped).

Revision ID: 0029_index_upto
Revises: 0028_cluster_query
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0029_index_upto"
down_revision = "0028_cluster_query"
branch_labels = None
depends_on = None


def upgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0029_index_upto.sql")


def downgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0029_index_upto_drop.sql")
