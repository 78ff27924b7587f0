"""The cell release's statement ranks each row on its own with a top-k' sort
(``pm_vector.pm_cell_shortlist_sql``, ``sql/0014_cell_statement.sql``): the same answers, the
ranking 7 ms instead of 12 at 10^6 items (C = 10, k' = 130). The downgrade runs
``sql/0014_cell_statement_drop.sql`` (0013's statement).

Revision ID: 0014_cell_statement
Revises: 0013_cells
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0014_cell_statement"
down_revision = "0013_cells"
branch_labels = None
depends_on = None


def upgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0014_cell_statement.sql")


def downgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0014_cell_statement_drop.sql")
