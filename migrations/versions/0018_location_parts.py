"""Location rows in parts: erasing or placing an item rewrites the parts it concerns, not whole rows.

``run_<id>_locations`` gains ``part`` (key ``(level, cell, part)``, indexed): the entries of item
``i`` of row ``(level, cell)`` sit in the part of ``i``'s cell at the run's part level, and rows
of level -1 list each part's items (:mod:`pm_vector.db.runs.locations`). The location tables of
runs built before get ``part`` 0 (one part per row) and are served as before.
``pm_location_shortlist`` refuses a level below 1.

Read from ``sql/0018_location_parts.sql``; the downgrade (``sql/0018_location_parts_drop.sql``)
joins each row's parts again.

Revision ID: 0018_location_parts
Revises: 0017_query_login
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0018_location_parts"
down_revision = "0017_query_login"
branch_labels = None
depends_on = None


def upgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0018_location_parts.sql")


def downgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0018_location_parts_drop.sql")
