"""KAHM privacy records (issue #11): the KAHM views show each record's unit and the audit's new figures.

No table changes: the privacy records live in the existing JSON columns (``kahm_models.privacy``,
``anchor_sets.provenance``, ``kahm_audits.params`` / ``report``). Every record now states its
``unit`` (``row`` / ``element`` / ``none``), its ``grid`` and ``outside_guarantee``.
``sql/0008_kahm_privacy.sql`` appends to ``pm_vector.pm_kahm_models`` the columns ``unit``,
``epsilon``, ``row_epsilon``, and to ``pm_vector.pm_kahm_audits`` ``n_repeats``,
``configuration``, ``unit`` and the attack's TPR at FPR 1 % / 0.1 % of the raw and fabricated
models. The downgrade (``sql/0008_kahm_privacy_drop.sql``) restores the 0004 views.

Revision ID: 0008_kahm_privacy
Revises: 0007_client_identity
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0008_kahm_privacy"
down_revision = "0007_client_identity"
branch_labels = None
depends_on = None


def upgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0008_kahm_privacy.sql")


def downgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0008_kahm_privacy_drop.sql")
