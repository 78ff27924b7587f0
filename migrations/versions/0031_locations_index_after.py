"""A run's locations table gets its indexes after its rows (issue 36, writes at database speed).

``pm_create_locations_table`` made the table with its primary key and its index on ``part``, so the
job's COPY of its rows kept both B-trees row by row. ``sql/0031_locations_index_after.sql`` makes
it create the bare table, and adds ``pm_index_locations_table(run_id)``, which builds the two
indexes (same names) once the rows are in (:func:`pm_vector.db.runs.locations.write`, in the
transaction that created and filled the table). Runs built before keep their indexes.

The matrix is applied again (the new function owned by the owner, executable by nobody else).

Downgrade: ``sql/0031_locations_index_after_drop.sql`` (the function as migration 0018 made it; the
new one dropped).

Revision ID: 0031_locations_index_after
Revises: 0030_shard_functions
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0031_locations_index_after"
down_revision = "0030_shard_functions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from pm_vector.db.postgres import privileges

    conn = op.get_bind().connection.driver_connection
    execute_sql_file(conn, "0031_locations_index_after.sql")
    privileges.apply(conn, privileges.schema_owner(conn))  # (the new function: the owner's, nobody else's, as the matrix says)


def downgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0031_locations_index_after_drop.sql")
