"""Query keys reach the shards as a read-only login of their own (issue 35, build 1).

``pm_vector.pm_register_shard`` (``sql/0028_cluster_query.sql``) takes the shard's query login
(``query_user``, ``query_password``: a role on the shard that may read only what a sharded answer
reads there, :data:`pm_vector.db.postgres.privileges.SHARD_QUERY_TABLES`) and gives the query role
``pm_vector_query`` USAGE on the shard's foreign server and a user mapping to that login, for
``pm_vector_query`` and for query keys' login role of migration 0017: a query key's session on a
cluster logs in to the shards as the query login, never as the owner. Shards registered before keep
their servers until registered again (the local cluster does so at its next start).

The privilege matrix grows by what a sharded answer reads on the coordinator (``pm_vector.shards``'
names and addresses, ``pm_shard_reset``): applied again (``privileges.apply``, then
``grant_answer_tables`` for every run, which now grants the shards' query login too).

Downgrade: ``sql/0028_cluster_query_drop.sql`` (the query roles' mappings and USAGE dropped, the
function's new signature dropped), then ``sql/0025_cluster_owner.sql`` (the function as 0025 made it).

Revision ID: 0028_cluster_query
Revises: 0026_run_table_kind
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0028_cluster_query"
down_revision = "0026_run_table_kind"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from pm_vector.db.postgres import privileges
    from pm_vector.db.runs.kinds import grant_answer_tables

    conn = op.get_bind().connection.driver_connection
    execute_sql_file(conn, "0028_cluster_query.sql")
    # the matrix grew (the query role reads pm_vector.shards' names and addresses, runs pm_shard_reset),
    # and every run's answer tables on the shards are granted to their query login
    owner = privileges.schema_owner(conn)
    privileges.apply(conn, owner)
    for (run_id,) in conn.execute("SELECT id FROM pm_vector.embedding_runs ORDER BY id").fetchall():
        grant_answer_tables(conn, run_id)


def downgrade() -> None:
    conn = op.get_bind().connection.driver_connection
    execute_sql_file(conn, "0028_cluster_query_drop.sql")
    execute_sql_file(conn, "0025_cluster_owner.sql")
