"""No role gets EXECUTE on pm_vector's functions on a cluster's shards but what the matrix says.

``pm_vector.pm_shard_install`` copied every pm_vector function to a shard with ``pg_get_functiondef``,
which carries no ACL: there every copy had PostgreSQL's default ACL, EXECUTE for PUBLIC (the
``SECURITY DEFINER`` ones too), so the shard's query login could run all of them.
``sql/0030_shard_functions.sql`` makes it ``pm_shard_install(shard, query_role, query_functions)``:
the shard login's default privileges give PUBLIC no EXECUTE on its functions, every function of the
shard's schema ``pm_vector`` is revoked from PUBLIC and the query login, and the query login gets
EXECUTE on :data:`pm_vector.db.postgres.privileges.SHARD_QUERY_FUNCTIONS` (passed in by
:func:`~pm_vector.db.postgres.privileges.install_on_shards`: what a sharded answer calls there).

Clusters already installed: the upgrade runs the install again on every registered shard (one
statement per shard, milliseconds), so it needs the shards up, as migration 0028's grants did. The
matrix is applied again (the function is new: owned by the owner, not executable by PUBLIC), then
every run's answer tables granted (``privileges.apply`` revokes them).

Downgrade: ``sql/0030_shard_functions_drop.sql`` (the function as ``sql/0011_cluster.sql`` made it;
the shards keep the ACL the last install gave them).

Revision ID: 0030_shard_functions
Revises: 0029_index_upto
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0030_shard_functions"
down_revision = "0029_index_upto"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from pm_vector.db.postgres import privileges
    from pm_vector.db.run_tables import shard_names
    from pm_vector.db.runs.kinds import grant_answer_tables

    conn = op.get_bind().connection.driver_connection
    execute_sql_file(conn, "0030_shard_functions.sql")
    privileges.apply(conn, privileges.schema_owner(conn))
    for (run_id,) in conn.execute("SELECT id FROM pm_vector.embedding_runs ORDER BY id").fetchall():
        grant_answer_tables(conn, run_id)
    privileges.install_on_shards(conn, shard_names(conn))


def downgrade() -> None:
    from pm_vector.db.postgres import privileges
    from pm_vector.db.runs.kinds import grant_answer_tables

    conn = op.get_bind().connection.driver_connection
    execute_sql_file(conn, "0030_shard_functions_drop.sql")
    privileges.apply(conn, privileges.schema_owner(conn))
    for (run_id,) in conn.execute("SELECT id FROM pm_vector.embedding_runs ORDER BY id").fetchall():
        grant_answer_tables(conn, run_id)
