"""API keys of the HTTP service (``pm-vector serve``), in their own schema ``pm_vector_service``.

Only a SHA-256 hash of each key is stored (keys are 32 random bytes, so a plain hash is
enough: there is nothing to brute-force), with a short display prefix, a name, and when it
was created and revoked. The table lives outside the ``pm_vector`` data schema: it belongs to
the service, not to the collections, and the ORM models of ``pm_vector.db.store.models`` (which
mirror the ``pm_vector`` schema exactly) need not know it.

Revision ID: 0002_api_keys
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_api_keys"
down_revision = "0001"
branch_labels = None
depends_on = None

S = "pm_vector_service"


def upgrade() -> None:
    op.execute(f"CREATE SCHEMA IF NOT EXISTS {S}")
    op.create_table(
        "api_keys",
        sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("prefix", sa.Text, nullable=False),
        sa.Column("key_hash", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
        sa.CheckConstraint("length(name) BETWEEN 1 AND 200", name="ck_api_keys_name"),
        sa.CheckConstraint("key_hash ~ '^[0-9a-f]{64}$'", name="ck_api_keys_key_hash"),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("api_keys", schema=S)
    op.execute(f"DROP SCHEMA IF EXISTS {S}")
