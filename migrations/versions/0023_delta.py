"""The delta beside the precomputed answers (issue 36): tombstones and new items' location entries.

``pm_vector.delta_tombstones`` (run, item: deleted since the run's rows were built, never answered
from the delete's commit on), ``pm_vector.delta_entries`` (run, level, cell, item, h, h_r: a new item
answered from its cell), ``embedding_runs.delta_version`` (in every cached answer's key), the view
``pm_vector.delta_status`` (the pending purge and its age) and two columns of ``attach_status``
(``pending_purge``, ``purge_age_s``); ``pm_location_shortlist_core`` ranks base minus tombstones with
the cell's delta entries. Python: :mod:`pm_vector.db.runs.delta`.

Ends as migration 0022 does: the privilege matrix applied, then the runs' answer tables granted.
Downgrade: ``sql/0023_delta_drop.sql`` (the view and the ranking of before; the tables and column go).

Revision ID: 0023_delta
Revises: 0022_privileges
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0023_delta"
down_revision = "0022_privileges"
branch_labels = None
depends_on = None


def _privileges(conn) -> None:
    from pm_vector.db.postgres import privileges
    from pm_vector.db.runs.kinds import grant_answer_tables

    owner = privileges.schema_owner(conn)
    privileges.apply(conn, owner)
    for (run_id,) in conn.execute("SELECT id FROM pm_vector.embedding_runs ORDER BY id").fetchall():
        grant_answer_tables(conn, run_id)


def upgrade() -> None:
    conn = op.get_bind().connection.driver_connection
    execute_sql_file(conn, "0023_delta.sql")
    _privileges(conn)


def downgrade() -> None:
    conn = op.get_bind().connection.driver_connection
    execute_sql_file(conn, "0023_delta_drop.sql")  # (dropped objects take their grants with them)
