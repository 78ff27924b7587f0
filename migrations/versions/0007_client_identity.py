"""Client identity: a stable id per collection (``collections.uuid``).

The service publishes this id (``collection_uuid`` in the anchor document). Clients first keyed
their privacy ledgers by it; they no longer do (a server chooses what it publishes, so it could
open fresh budgets): the ledger is keyed by the server's origin as the client configured it
(``pm_vector.client.budget``), and the id is information only. The id is random
(``gen_random_uuid()``), set once at creation and never changed: it carries nothing about the
data. Existing collections get one at upgrade.

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
