"""API key changes are announced: a statement trigger on ``pm_vector_service.api_keys`` sends
``NOTIFY pm_vector_keys`` (``sql/0012_key_changes.sql``), so that service processes may keep
verified keys in memory and forget them the moment a key is revoked
(:class:`pm_vector.service.keycache.KeyCache`). The downgrade runs
``sql/0012_key_changes_drop.sql``.

Revision ID: 0012_key_changes
Revises: 0011_cluster
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0012_key_changes"
down_revision = "0011_cluster"
branch_labels = None
depends_on = None


def upgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0012_key_changes.sql")


def downgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0012_key_changes_drop.sql")
