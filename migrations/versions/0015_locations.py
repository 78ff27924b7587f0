"""The location release: one public cell of the whole collection per request.

* ``embedding_runs.public_locations`` (json, kept verbatim): the run's location cells
  (:class:`~pm_vector.manifold.cells.PublicCells` of the whole public anchor as one class), fit by
  the embedding job on the run's public anchor set only; its digest and levels are in
  ``embedding_runs.class_rows -> 'locations'``;
* ``run_<id>_locations(level, cell, item_ids, hubs, chubs)`` per run (created by the job through
  ``pm_vector.pm_create_locations_table``, dropped with the run by ``pm_drop_run_tables``), and the
  ranking of a report (``pm_location_shortlist_core``, ``pm_location_shortlist``).

Read from ``sql/0015_locations.sql``; 0013's ``pm_drop_run_tables`` is kept as
``pm_drop_run_tables_0013`` (the new one calls it). The downgrade runs
``sql/0015_locations_drop.sql`` and renames it back.

Revision ID: 0015_locations
Revises: 0014_cell_statement
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0015_locations"
down_revision = "0014_cell_statement"
branch_labels = None
depends_on = None

S = "pm_vector"


def upgrade() -> None:
    op.add_column("embedding_runs", sa.Column("public_locations", pg.JSON, nullable=True), schema=S)
    op.execute("ALTER FUNCTION pm_vector.pm_drop_run_tables(bigint) RENAME TO pm_drop_run_tables_0013")
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0015_locations.sql")
    # a round trip below 0015 dropped the runs' location tables: those runs say so (a location
    # request gets a clear 503 naming the fix, a new embedding job) instead of a missing table
    op.execute("UPDATE pm_vector.embedding_runs SET class_rows = jsonb_set(class_rows, '{locations}', "
               "jsonb_build_object('status', 'unavailable', 'error', 'its location rows were dropped by a "
               "migration downgrade; run a new embedding job')) "
               "WHERE class_rows -> 'locations' ->> 'status' = 'ready' "
               "AND to_regclass(format('pm_vector.%I', 'run_' || id || '_locations')) IS NULL")


def downgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0015_locations_drop.sql")
    op.execute("ALTER FUNCTION pm_vector.pm_drop_run_tables_0013(bigint) RENAME TO pm_drop_run_tables")
    op.drop_column("embedding_runs", "public_locations", schema=S)
