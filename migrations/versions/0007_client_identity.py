"""Client identity: a stable id per collection (``collections.uuid``).

The client keeps its privacy budget per collection *as the server identifies it*: the service
publishes this id (``collection_uuid`` in the anchor document), and the client's ledger is keyed
by it, so every URL of one server (``127.0.0.1``, ``localhost``, a proxy) is one budget. The id
is random (``gen_random_uuid()``), set once at creation and never changed: it carries nothing
about the data. Existing collections get one at upgrade.

No SQL functions: the id is a column only.

Revision ID: 0007_client_identity
Revises: 0006_service_roles
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0007_client_identity"
down_revision = "0006_service_roles"
branch_labels = None
depends_on = None

S = "pm_vector"


def upgrade() -> None:
    op.add_column("collections", sa.Column("uuid", pg.UUID(as_uuid=True), nullable=False,
                                           server_default=sa.text("gen_random_uuid()")), schema=S)
    op.create_unique_constraint("uq_collections_uuid", "collections", ["uuid"], schema=S)


def downgrade() -> None:
    op.drop_constraint("uq_collections_uuid", "collections", schema=S, type_="unique")
    op.drop_column("collections", "uuid", schema=S)
