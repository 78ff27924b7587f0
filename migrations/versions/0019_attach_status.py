"""How far behind the sync of attached tables is: the view ``pm_vector.attach_status``.

One row per attached collection: ``collection``, ``source_table``, ``queued`` (changes queued in
``attach_changes``), ``oldest_queued_at`` and ``lag_s`` (seconds the oldest queued change has
waited, by ``clock_timestamp()``; both NULL when nothing is queued). The oldest change is read
through the ``(collection_id, seq)`` index, one row per collection. The owner's only (PUBLIC and
``pm_vector_query`` get nothing): it names the users' tables and shows their change rates.
``pm_vector.db.sync_status``, ``pm-vector sync-status`` and ``GET /collections/{name}/sync``
read it.

Read from ``sql/0019_attach_status.sql``; the downgrade (``sql/0019_attach_status_drop.sql``)
drops the view.

Revision ID: 0019_attach_status
Revises: 0018_location_parts
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0019_attach_status"
down_revision = "0018_location_parts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0019_attach_status.sql")


def downgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0019_attach_status_drop.sql")
