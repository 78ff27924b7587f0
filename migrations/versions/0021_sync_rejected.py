"""The attached tables' rejected changes (``pm_vector.attach_rejected``) and the collection-name
rule as a check constraint.

A change the sync cannot apply (a label that is not an integer, a NULL vector or one of another
dimension, a payload over ingest's bounds, a vector the active run cannot place) no longer stops
the queue: its key goes to ``attach_rejected`` with the reason, and the rest of the batch, deletes
included, is applied (:mod:`pm_vector.db.store.sync`). Owner only (PUBLIC and ``pm_vector_query``
get nothing). ``ck_collections_name_chars`` (NOT VALID: older names stay) holds every new
collection, ``pm_attach_table`` called from SQL included, to ``_names.NAME_PATTERN``.

Read from ``sql/0021_sync_rejected.sql``; the downgrade (``sql/0021_sync_rejected_drop.sql``)
drops the table and the constraint.

Revision ID: 0021_sync_rejected
Revises: 0020_capture
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0021_sync_rejected"
down_revision = "0020_capture"
branch_labels = None
depends_on = None


def upgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0021_sync_rejected.sql")


def downgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0021_sync_rejected_drop.sql")
