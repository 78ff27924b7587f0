"""The shards' foreign servers and user mappings belong to pm_vector's owner role (issue 35, build 1).

``pm_vector.pm_register_shard`` (``sql/0025_cluster_owner.sql``) makes the foreign server of a shard
the owner's (the owner of the schema ``pm_vector``) with ONE user mapping, for the owner, instead of
a mapping FOR PUBLIC: only the owner's sessions reach a shard, as the registered user with its
password (``postgres_fdw`` and ``dblink`` let a non-superuser connect only with a password the
shard asked for). Shards registered before keep their servers until registered again (the local
cluster does so at its next start: :func:`pm_vector.db.postgres.cluster.start`).

No table or grant changes: the function keeps its signature and its place in the privilege matrix
(the owner's only).

Downgrade: ``sql/0025_cluster_owner_drop.sql`` (the function as migration 0011 made it).

Revision ID: 0025_cluster_owner
Revises: 0023_delta
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0025_cluster_owner"
down_revision = "0023_delta"
branch_labels = None
depends_on = None


def upgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0025_cluster_owner.sql")


def downgrade() -> None:
    execute_sql_file(op.get_bind().connection.driver_connection, "0025_cluster_owner_drop.sql")
