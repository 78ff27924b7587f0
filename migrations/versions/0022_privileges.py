"""Least privilege: an owner that is no superuser, the query role reads what an answer needs, no
function executable by PUBLIC (issue 35, finding 8).

* **The owner.** Every object of the schemas ``pm_vector`` and ``pm_vector_service`` (the schemas
  too) is owned by the owner role: ``pm_vector_owner`` in the embedded default (created here,
  LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS NOREPLICATION; the embedded server's
  processes log in as it once the migrations ran), ``PM_VECTOR_OWNER_ROLE`` on your own PostgreSQL
  when set, else the role that migrates (as before). Handing the objects to another role needs a
  superuser (or a member of that role); this migration runs as one where it must.
* **The query role** ``pm_vector_query`` loses SELECT on every table and the default privilege
  on future ones (migration 0006), and gets what :mod:`pm_vector.db.postgres.privileges` declares:
  the answer's tables and columns (``items`` without raw features: ``pm_item_features`` /
  ``pm_item_features_half`` of ``sql/0022_privileges.sql`` return them for collections that allow
  them), INSERT on ``request_log``, EXECUTE on the resolve's functions, and SELECT on the answer
  tables of each run (:func:`pm_vector.db.runs.kinds.answer_tables`, granted here for existing runs
  and by each job at its switch). The owner is made a member of it (the service checks it may use it).
* **PUBLIC** loses EXECUTE on every function of the two schemas, and on the owner's future
  functions (``ALTER DEFAULT PRIVILEGES FOR ROLE owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC``).

Every later migration that creates objects ends as :func:`upgrade` here does (``privileges.apply``,
then ``grant_answer_tables`` for every run); the matrix test fails on an object the matrix does
not name.

Downgrade: the grants of before (SELECT on every table and by default to the query role, EXECUTE
to PUBLIC), the two functions dropped, and the objects handed back to the migrating role when it
is a superuser (the owner role is kept: roles are global to the server).

Revision ID: 0022_privileges
Revises: 0021_sync_rejected
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

from pm_vector.db.postgres.migrate import execute_sql_file

revision = "0022_privileges"
down_revision = "0021_sync_rejected"
branch_labels = None
depends_on = None


def _owner(conn) -> str:
    """The owner role (created if missing: the embedded default), member of the query role."""
    from psycopg import sql

    from pm_vector.db.errors import DatabaseConfigError
    from pm_vector.db.postgres.config import settings
    from pm_vector.db.postgres.privileges import QUERY_ROLE

    me, superuser = conn.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    owner = settings().schema_owner or me
    if owner == me:
        return me
    if not superuser:
        raise DatabaseConfigError(
            f"migration 0022 hands pm_vector's schemas to the role {owner!r}, which needs a superuser; run "
            "`pm-vector db upgrade` once as a superuser, or unset PM_VECTOR_OWNER_ROLE to keep them with "
            f"{me!r}.")
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [owner]).fetchone() is None:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS "
                             "NOREPLICATION INHERIT").format(sql.Identifier(owner)))
    elif conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [owner]).fetchone()[0]:
        raise DatabaseConfigError(f"the owner role {owner!r} is a superuser; pm_vector's owner must not be one "
                                  f"(ALTER ROLE {owner} NOSUPERUSER).")
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [QUERY_ROLE]).fetchone() is not None:
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(QUERY_ROLE), sql.Identifier(owner)))
    return owner


def upgrade() -> None:
    from pm_vector.db.postgres import privileges
    from pm_vector.db.runs.kinds import grant_answer_tables

    conn = op.get_bind().connection.driver_connection
    owner = _owner(conn)
    execute_sql_file(conn, "0022_privileges.sql")
    privileges.apply(conn, owner)
    for (run_id,) in conn.execute("SELECT id FROM pm_vector.embedding_runs ORDER BY id").fetchall():
        grant_answer_tables(conn, run_id)


def downgrade() -> None:
    from psycopg import sql

    from pm_vector.db.postgres.privileges import QUERY_ROLE, own, schema_owner

    conn = op.get_bind().connection.driver_connection
    execute_sql_file(conn, "0022_privileges_drop.sql")
    me, superuser = conn.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    owner = schema_owner(conn)
    if owner != me and superuser:
        conn.execute(sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} GRANT EXECUTE ON FUNCTIONS TO PUBLIC").format(
            sql.Identifier(owner)))
        own(conn, me)  # (not REASSIGN OWNED: it would move the role's databases too)
        owner = me
    conn.execute(sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} GRANT EXECUTE ON FUNCTIONS TO PUBLIC").format(
        sql.Identifier(owner)))
    for schema in ("pm_vector", "pm_vector_service"):
        conn.execute(sql.SQL("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {} TO PUBLIC").format(sql.Identifier(schema)))
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [QUERY_ROLE]).fetchone() is None:
        return
    q = sql.Identifier(QUERY_ROLE)
    for stmt in ("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pm_vector FROM {q}",
                 "REVOKE SELECT (id, collection_id, external_id, label, payload) ON pm_vector.items FROM {q}",
                 "REVOKE SELECT (id, collection_id, classes, kind, erased_at) ON pm_vector.kahm_models FROM {q}",
                 # migration 0006's grants
                 "GRANT USAGE ON SCHEMA pm_vector TO {q}",
                 "GRANT SELECT ON ALL TABLES IN SCHEMA pm_vector TO {q}",
                 "ALTER DEFAULT PRIVILEGES IN SCHEMA pm_vector GRANT SELECT ON TABLES TO {q}",
                 "GRANT INSERT ON pm_vector.request_log TO {q}",
                 "GRANT USAGE ON ALL SEQUENCES IN SCHEMA pm_vector TO {q}",
                 # and the exceptions of 0016 (the queue's sequence) and 0019 (the status view)
                 "REVOKE ALL ON SEQUENCE pm_vector.attach_changes_seq_seq FROM {q}",
                 "REVOKE ALL ON pm_vector.attach_status FROM {q}"):
        conn.execute(sql.SQL(stmt).format(q=q))
