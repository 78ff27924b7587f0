"""Service roles, scopes and rate limits on API keys; embedding jobs persisted by the service.

``pm_vector_service.api_keys`` gains:

* ``role`` (``query`` | ``admin``): a query key reads collections, the anchor document and KAHM
  model listings, and resolves / asks KAHM distances; an admin key also fetches items by id,
  starts jobs and manages keys. Keys that existed before this migration had every right and
  become ``admin`` (nothing that worked stops working); new keys default to ``query``.
* ``collections`` (text[], NULL = every collection): the collections the key may see; any other
  collection answers 404 as if it did not exist.
* ``rate_per_minute`` (NULL = the service's setting): the key's request budget per minute.

``pm_vector_service.jobs`` holds the service's embedding jobs (status, stage progress, result or
error, the key that started them), so a restarted service still shows them; a job found
``queued`` or ``running`` at start-up is marked ``interrupted`` unless the service process that
owns it still holds its advisory lock (another worker of the same service). Its database side is
kill-safe: the previous run keeps serving.

PostgreSQL role ``pm_vector_query`` (NOLOGIN; created only when the migrating user may create
roles): SELECT on the ``pm_vector`` schema (and, by default privileges, on the run tables the
same user creates later), INSERT on ``request_log`` only. The service switches a query key's
resolve to it (``SET ROLE``), so that session cannot write anything but the request log.

Revision ID: 0006_service_roles
Revises: 0005_class_rows
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0006_service_roles"
down_revision = "0005_class_rows"
branch_labels = None
depends_on = None

S = "pm_vector_service"


def upgrade() -> None:
    # existing keys were all-powerful: they stay admin; the default then becomes query
    op.add_column("api_keys", sa.Column("role", sa.Text, nullable=False, server_default="admin"), schema=S)
    op.alter_column("api_keys", "role", server_default="query", schema=S)
    op.create_check_constraint("ck_api_keys_role", "api_keys", "role IN ('query', 'admin')", schema=S)
    op.add_column("api_keys", sa.Column("collections", pg.ARRAY(sa.Text), nullable=True), schema=S)
    op.add_column("api_keys", sa.Column("rate_per_minute", sa.Integer, nullable=True), schema=S)
    op.create_check_constraint("ck_api_keys_rate", "api_keys",
                               "rate_per_minute IS NULL OR rate_per_minute >= 1", schema=S)
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.Text, primary_key=True),
        sa.Column("collection", sa.Text, nullable=False),
        sa.Column("key_id", sa.BigInteger, sa.ForeignKey(f"{S}.api_keys.id", ondelete="SET NULL",
                                                         name="fk_jobs_key"), nullable=True),
        sa.Column("params", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("seed", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("status", sa.Text, nullable=False, server_default="queued"),
        sa.Column("stage", sa.Text, nullable=True),
        sa.Column("done", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("total", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("stages", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("result", pg.JSONB, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        # the service process that runs it; it holds an advisory lock while alive (see service/jobs.py)
        sa.Column("owner", sa.Text, nullable=True),
        sa.CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed', 'interrupted')",
                           name="ck_jobs_status"),
        schema=S,
    )
    op.create_index("ix_jobs_created", "jobs", ["created_at"], schema=S)
    op.execute(_query_role_sql())


QUERY_ROLE = "pm_vector_query"


def _query_role_sql() -> str:
    # roles are global to the server: create it once, grant in this database; skipped (NOTICE)
    # when the migrating user cannot create roles -- the service then runs without it
    r = QUERY_ROLE
    return f"""
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{r}') THEN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = current_user AND (rolsuper OR rolcreaterole)) THEN
      RAISE NOTICE 'pm_vector: cannot create role {r} (no CREATEROLE); query keys run as the service user';
      RETURN;
    END IF;
    CREATE ROLE {r} NOLOGIN;
  END IF;
  EXECUTE format('GRANT {r} TO %I', current_user);
  GRANT USAGE ON SCHEMA pm_vector TO {r};
  GRANT SELECT ON ALL TABLES IN SCHEMA pm_vector TO {r};
  ALTER DEFAULT PRIVILEGES IN SCHEMA pm_vector GRANT SELECT ON TABLES TO {r};
  GRANT INSERT ON pm_vector.request_log TO {r};
  GRANT USAGE ON ALL SEQUENCES IN SCHEMA pm_vector TO {r};
EXCEPTION WHEN insufficient_privilege THEN
  RAISE NOTICE 'pm_vector: could not set up role {r} (%); query keys run as the service user', SQLERRM;
END $$;
"""


def downgrade() -> None:
    r = QUERY_ROLE
    op.execute(f"""
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{r}') THEN
    ALTER DEFAULT PRIVILEGES IN SCHEMA pm_vector REVOKE SELECT ON TABLES FROM {r};
    REVOKE ALL ON ALL TABLES IN SCHEMA pm_vector FROM {r};
    REVOKE ALL ON ALL SEQUENCES IN SCHEMA pm_vector FROM {r};
    REVOKE ALL ON SCHEMA pm_vector FROM {r};
    BEGIN
      DROP ROLE {r};
    EXCEPTION WHEN dependent_objects_still_exist OR insufficient_privilege THEN
      NULL;  -- still granted in another database of this server: keep it
    END;
  END IF;
END $$;
""")
    op.drop_index("ix_jobs_created", "jobs", schema=S)
    op.drop_table("jobs", schema=S)
    op.drop_constraint("ck_api_keys_rate", "api_keys", schema=S)
    op.drop_column("api_keys", "rate_per_minute", schema=S)
    op.drop_column("api_keys", "collections", schema=S)
    op.drop_constraint("ck_api_keys_role", "api_keys", schema=S)
    op.drop_column("api_keys", "role", schema=S)
