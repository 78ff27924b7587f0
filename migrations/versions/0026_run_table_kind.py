"""``pm_vector.pm_run_table`` checks a run table kind's shape, not a list (issue 37, build 1).

The kinds of run tables are one registry, :data:`pm_vector.db.runs.kinds.KINDS`. The SQL function
that names a run's table (``sql/0026_run_table_kind.sql``) repeated the list of kinds (0005, 0013
and 0015 each redefined it to add one) although the SQL side asks it for seven kinds; it now takes
any kind of the shape :data:`pm_vector.db.run_tables.KIND` checks, as the Python namer does, so a
new kind needs no migration. No table or grant changes (``CREATE OR REPLACE`` keeps the function's
owner and its place in the privilege matrix).

Downgrade: ``sql/0026_run_table_kind_drop.sql`` (the function as migration 0015 made it).

Revision ID: 0026_run_table_kind
Revises: 0025_cluster_owner
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0026_run_table_kind"
down_revision = "0025_cluster_owner"
branch_labels = None
depends_on = None


def upgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0026_run_table_kind.sql")


def downgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0026_run_table_kind_drop.sql")
