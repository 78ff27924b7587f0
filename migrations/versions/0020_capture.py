"""The capture of attached tables bound to the table and to typed built-in values; canonical keys;
TRUNCATE and partitions captured; DDL that changes an attached table marks its collection broken.

``pm_attach_capture`` ignores its trigger arguments and finds its collection by the trigger's name
and the table's oid (``pg_partition_root(TG_RELID)``); it reads only the key (through
``pm_attach_key``, one canonical text per supported key type), the vector and the label, never a
whole row (``to_jsonb(row)`` ran the casts of a user's types with pm_vector's rights). Attach refuses
key, vector, label and payload columns of other types, naming the column and its type. Event
triggers (created when the migrating role is a superuser) mark a collection broken when its table
is dropped, a tracked column dropped, renamed or retyped, or the table rewritten by ALTER COLUMN
... TYPE; the sync checks the columns before each batch as well. The view ``attach_status`` gets
``broken`` and ``broken_at``. Existing attached collections get their columns recorded, their keys
made canonical and their triggers made again the new way.

Read from ``sql/0020_capture.sql``; the downgrade (``sql/0020_capture_drop.sql``) puts back 0016's
triggers, then runs ``sql/0016_live_collections.sql`` (0016's functions) and
``sql/0019_attach_status.sql`` (the view) again.

Revision ID: 0020_capture
Revises: 0019_attach_status
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0020_capture"
down_revision = "0019_attach_status"
branch_labels = None
depends_on = None


def upgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0020_capture.sql")


def downgrade() -> None:
    conn = op.get_bind().connection.driver_connection
    execute_sql_file(conn, "0020_capture_drop.sql")
    execute_sql_file(conn, "0016_live_collections.sql")
    execute_sql_file(conn, "0019_attach_status.sql")
