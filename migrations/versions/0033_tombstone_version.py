"""Each tombstone records the run's ``delta_version`` its write makes visible (issue 36, writes at
database speed).

A resolving process holds a run's tombstones per ``delta_version``; under a stream the version moves
several times a second, and each move read every tombstone again (about 35 ms of the server's CPU
at 324,000 tombstones). ``sql/0033_tombstone_version.sql`` adds ``delta_tombstones.version`` (set by
the ``BEFORE INSERT`` trigger ``pm_tombstone_version``, which locks the run's row: the file says why
the version it records is above every version committed without the tombstone) and the index
``(run_id, version)``, so that a process reads only the tombstones of the versions after the set it
holds (:mod:`pm_vector.db.resolve.location_resolution`). Rows written before stay NULL: a set read
whole holds them.

Downgrade: ``sql/0033_tombstone_version_drop.sql``.

Revision ID: 0033_tombstone_version
Revises: 0032_capture_static
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0033_tombstone_version"
down_revision = "0032_capture_static"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from pm_vector.db.postgres import privileges

    conn = op.get_bind().connection.driver_connection
    execute_sql_file(conn, "0033_tombstone_version.sql")
    privileges.apply(conn, privileges.schema_owner(conn))


def downgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0033_tombstone_version_drop.sql")
