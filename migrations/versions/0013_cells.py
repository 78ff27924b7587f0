"""The cell release: public cells published with a run's class frames, per-cell hub counts per run.

* ``embedding_runs.public_cells`` (json, kept verbatim): the run's
  :class:`~pm_vector.manifold.cells.PublicCells` (``to_dict()``), fit by the embedding job on the
  run's public anchor set only; its digest and usable levels are in ``embedding_runs.class_rows ->
  'cells'`` (``{"status", "digest", "levels"}``), and the public anchor document carries both;
* ``run_<id>_cells(level, label, cell, item_ids, hubs, chubs)`` per run (created by the job through
  ``pm_vector.pm_create_cells_table``, dropped with the run by ``pm_drop_run_tables``, here and on
  its shards), and the statement that ranks a cell request (``pm_cell_shortlist_sql``,
  ``pm_cell_shortlist_core``, ``pm_cell_shortlist_sharded``, ``pm_cell_shortlist``).

Read from ``sql/0013_cells.sql``; 0011's ``pm_drop_run_tables`` is kept as
``pm_drop_run_tables_0011`` (the new one calls it). The downgrade runs ``sql/0013_cells_drop.sql``
and renames it back. An upgrade after such a downgrade marks the runs whose cells it dropped
(``class_rows -> 'cells' -> 'status'`` = ``dropped``, with the fix in ``error``): their cell
requests are refused with that message until a new embedding job.

Revision ID: 0013_cells
Revises: 0012_key_changes
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0013_cells"
down_revision = "0012_key_changes"
branch_labels = None
depends_on = None

S = "pm_vector"
#: a run's cells status after a downgrade below 0013 and an upgrade (pm_vector.db.postgres.migrate
#: reports the collections whose active run is in it)
DROPPED = ("its cells were dropped by a schema downgrade below migration 0013; a new embedding job "
           "(pm-vector embed COLLECTION) builds them again")


def upgrade() -> None:
    op.add_column("embedding_runs", sa.Column("public_cells", pg.JSON, nullable=True), schema=S)
    # 0011's pm_drop_run_tables keeps dropping the other tables under its new name (not a copy of its text)
    op.execute("ALTER FUNCTION pm_vector.pm_drop_run_tables(bigint) RENAME TO pm_drop_run_tables_0011")
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0013_cells.sql")
    # after a downgrade below 0013 and back, a run's class_rows still says its cells are ready, but the
    # downgrade dropped its cells table and public_cells: say instead that a new embedding job is needed
    # (a cell request then gets that message -- 503 from the service -- not a missing table)
    op.execute(sa.text(
        "UPDATE pm_vector.embedding_runs SET class_rows = jsonb_set(class_rows, '{cells}', jsonb_build_object("
        "'status', 'dropped', 'error', :why)) WHERE class_rows -> 'cells' ->> 'status' = 'ready'").bindparams(
        why=DROPPED))


def downgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0013_cells_drop.sql")
    op.execute("ALTER FUNCTION pm_vector.pm_drop_run_tables_0011(bigint) RENAME TO pm_drop_run_tables")
    op.drop_column("embedding_runs", "public_cells", schema=S)
