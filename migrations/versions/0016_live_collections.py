"""Live collections: deleted items and the raw KAHM models that must be refit after an erasure.

* ``kahm_models.erased_at``: set by ``delete_items`` on every raw model that may hold a deleted
  item among its training rows; such a model's outputs are refused until it is refit (noisy and
  fabricated models keep serving).

Self-contained: it only adds (``sql/0016_live_collections.sql``) and drops
(``sql/0016_live_collections_drop.sql``) what it owns.

Revision ID: 0016_live_collections
Revises: 0015_locations
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0016_live_collections"
down_revision = "0015_locations"
branch_labels = None
depends_on = None

S = "pm_vector"


def upgrade() -> None:
    op.add_column("kahm_models", sa.Column("erased_at", sa.DateTime(timezone=True), nullable=True), schema=S)
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0016_live_collections.sql")


def downgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0016_live_collections_drop.sql")
    op.drop_column("kahm_models", "erased_at", schema=S)
