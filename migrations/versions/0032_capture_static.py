"""The capture of a plain attached table with its columns written in (issue 36, writes at database
speed).

``pm_attach_capture`` read a statement's rows by ``EXECUTE``, a statement planned again at every
call: 0.2 ms of a single-row commit's 0.63 ms on the writer's backend. ``sql/0032_capture_static.sql``
adds ``pm_attach_capture_make(collection_id)``, which makes the collection's own capture function
``pm_attach_capture_<id>()``: ``pm_attach_capture``'s text with the same reads, the column names
written in, put before its own (taken only while the columns are as recorded), so PL/pgSQL plans
them once a session. A plain table's statement triggers run it; a partitioned table's row trigger
and the TRUNCATE triggers stay on ``pm_attach_capture``. The attached collections' triggers are made
again, and the matrix applied again (the new functions the owner's, executable by nobody else).

Downgrade: ``sql/0032_capture_static_drop.sql`` (0020's ``pm_attach_triggers`` and
``pm_attach_drop_triggers``, the triggers made again with them, the new functions dropped).

Revision ID: 0032_capture_static
Revises: 0031_locations_index_after
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0032_capture_static"
down_revision = "0031_locations_index_after"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from pm_vector.db.postgres import privileges

    conn = op.get_bind().connection.driver_connection
    execute_sql_file(conn, "0032_capture_static.sql")
    privileges.apply(conn, privileges.schema_owner(conn))


def downgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0032_capture_static_drop.sql")
