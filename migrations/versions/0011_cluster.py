"""Shards and replicas: ``pm_vector.shards`` and the functions of ``sql/0011_cluster.sql``.

* ``shards (name, server_name, host, port, dbname, created_at)``: the shards registered on this
  coordinator, each a ``postgres_fdw`` foreign server ``pm_shard_<name>`` with a user mapping
  (created by ``pm_vector.pm_register_shard``, with the ``postgres_fdw`` and ``dblink``
  extensions on first use: a single-node database needs neither);
* functions to register shards, run DDL on them and attach shard-resident tables as foreign
  partitions (``pm_shard_partition``).

The downgrade drops the foreign servers of registered shards (their foreign partitions with
them), the functions and the table.

Revision ID: 0011_cluster
Revises: 0010_ingest_integrity
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0011_cluster"
down_revision = "0010_ingest_integrity"
branch_labels = None
depends_on = None

S = "pm_vector"


def upgrade() -> None:
    op.create_table(
        "shards",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("server_name", sa.Text, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("port", sa.Integer, nullable=False),
        sa.Column("dbname", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("name", name="pk_shards"),
        schema=S,
    )
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0011_cluster.sql")


def downgrade() -> None:
    op.execute("DO $$ DECLARE s text; BEGIN FOR s IN SELECT server_name FROM pm_vector.shards LOOP "
               "EXECUTE format('DROP SERVER IF EXISTS %I CASCADE', s); END LOOP; END $$")
    driver = op.get_bind().connection.driver_connection
    execute_sql_file(driver, "0011_cluster_drop.sql")
    # pm_shortlist and pm_drop_run_tables as before 0011 (0005's), then 0009's faster statement on top
    execute_sql_file(driver, "0005_class_rows.sql")
    execute_sql_file(driver, "0009_fast_shortlist.sql")
    op.drop_table("shards", schema=S)
