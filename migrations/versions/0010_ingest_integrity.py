"""Ingest integrity: the SQL to find run tables that dead or failed jobs left behind.

No table changes: an ingest is now one transaction (:func:`pm_vector.db.store.api.ingest`), so a killed
ingest leaves nothing, and the ``ingests`` table keeps its columns and statuses (``running`` rows
are only those of older versions' abandoned ingests, which :mod:`pm_vector.db.store.maintenance`
finishes). Installs ``pm_vector.pm_orphan_run_tables()`` from ``sql/0010_ingest_integrity.sql``
(used by ``pm-vector db cleanup``); the downgrade runs ``sql/0010_ingest_integrity_drop.sql``.

Revision ID: 0010_ingest_integrity
Revises: 0009_fast_shortlist
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0010_ingest_integrity"
down_revision = "0009_fast_shortlist"
branch_labels = None
depends_on = None


def upgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0010_ingest_integrity.sql")


def downgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0010_ingest_integrity_drop.sql")
