"""Query keys' own login role: a session that no SQL can turn into the service user.

Migration 0006 made ``pm_vector_query`` (NOLOGIN; read the ``pm_vector`` schema, insert into the
request log), and the service switched a query key's resolve to it with ``SET ROLE`` on its shared
pool, which ``RESET ROLE`` undoes. This migration makes a login role for this database,
``pm_vector_query_<database oid>``, a member of ``pm_vector_query`` (it inherits its privileges
and nothing else), with a random password, and keeps the name and password in
``pm_vector_service.query_login``, which only the migrating user reads. The service opens a pool
of its own that logs in as that role (``service/lifespan``), so that a query key's resolve runs
on a session whose login role is the query role's member: ``RESET ROLE`` leaves it there.

Skipped (NOTICE) when the migrating user may not create roles or ``pm_vector_query`` is missing:
the service then keeps ``SET ROLE`` and says so at start-up. Roles are global to the server; the
oid in the name keeps databases of one server apart.

Revision ID: 0017_query_login
Revises: 0016_live_collections
Create Date: 2026-11-27
"""

from __future__ import annotations

import secrets

from alembic import op

revision = "0017_query_login"
down_revision = "0016_live_collections"
branch_labels = None
depends_on = None

S = "pm_vector_service"


def upgrade() -> None:
    password = secrets.token_urlsafe(32)  # [A-Za-z0-9_-]: safe inside a SQL literal
    op.execute(f"""
CREATE TABLE {S}.query_login (
  only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  role_name text NOT NULL,
  password text NOT NULL
);
REVOKE ALL ON {S}.query_login FROM PUBLIC;
DO $$
DECLARE
  r text := 'pm_vector_query_' || (SELECT oid FROM pg_database WHERE datname = current_database());
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pm_vector_query') THEN
    RAISE NOTICE 'pm_vector: no role pm_vector_query; query keys run as the service user';
    RETURN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = current_user AND (rolsuper OR rolcreaterole)) THEN
    RAISE NOTICE 'pm_vector: cannot create a login role (no CREATEROLE); query keys use SET ROLE pm_vector_query';
    RETURN;
  END IF;
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
    EXECUTE format('ALTER ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS '
                   'INHERIT PASSWORD %L', r, '{password}');
  ELSE
    EXECUTE format('CREATE ROLE %I LOGIN INHERIT PASSWORD %L IN ROLE pm_vector_query', r, '{password}');
  END IF;
  EXECUTE format('GRANT pm_vector_query TO %I', r);
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), r);
  INSERT INTO {S}.query_login (role_name, password) VALUES (r, '{password}');
EXCEPTION WHEN insufficient_privilege THEN
  RAISE NOTICE 'pm_vector: could not set up the query login role (%); query keys use SET ROLE', SQLERRM;
END $$;
""")


def downgrade() -> None:
    op.execute(f"""
DO $$
DECLARE
  r text;
BEGIN
  SELECT role_name INTO r FROM {S}.query_login;
  IF r IS NOT NULL AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
    BEGIN
      EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM %I', current_database(), r);
      EXECUTE format('DROP ROLE %I', r);
    EXCEPTION WHEN dependent_objects_still_exist OR insufficient_privilege OR object_in_use THEN
      EXECUTE format('ALTER ROLE %I NOLOGIN', r);  -- in use (a live session): it can no longer log in
    END;
  END IF;
END $$;
DROP TABLE {S}.query_login;
""")
