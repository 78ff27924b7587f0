"""A faster ``pm_shortlist``: neighbour lists in the prior rows of new runs.

* ``pm_create_class_rows_tables`` now gives ``run_<id>_prior`` a column ``nbrs bigint[]`` (each
  prior item's ``graph_degree`` neighbours, nearest first), written by the embedding job
  (:mod:`pm_vector.db.runs.class_rows`);
* ``pm_shortlist_sql`` answers such runs without joining the graph table (the retained prior rows
  carry their lists) and reads hub counts by primary key; runs built before keep the statement of
  ``sql/0005_class_rows.sql`` (``pm_shortlist_sql_v1``) until a new embedding job;
* ``pm_run_has_nbrs(run_id)``: which of the two a run gets.

Read from ``sql/0009_fast_shortlist.sql``; the downgrade reinstalls ``sql/0005_class_rows.sql``'s
definitions and runs ``sql/0009_fast_shortlist_drop.sql`` (runs with ``nbrs`` keep working: the old
statement reads the graph table, which every run still has).

Revision ID: 0009_fast_shortlist
Revises: 0008_kahm_privacy
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0009_fast_shortlist"
down_revision = "0008_kahm_privacy"
branch_labels = None
depends_on = None


def upgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    # the 0005 statement keeps answering older runs under its new name (not a copy of its text)
    op.execute("ALTER FUNCTION pm_vector.pm_shortlist_sql(bigint, integer) RENAME TO pm_shortlist_sql_v1")
    execute_sql_file(driver, "0009_fast_shortlist.sql")


def downgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0005_class_rows.sql")
    execute_sql_file(driver, "0009_fast_shortlist_drop.sql")
