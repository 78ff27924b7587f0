"""Alembic environment of pm_vector's schema (PostgreSQL + pgvector only).

Run by :func:`pm_vector.db.upgrade` (which passes the URL or a connection through
``Config.attributes``) or by hand with ``alembic -c migrations/alembic.ini ...``.

All migrations of one ``upgrade`` run in one transaction (PostgreSQL DDL is transactional),
after ``pg_advisory_xact_lock``: processes upgrading the same database at once run one after
the other, and the later ones find the schema at head and do nothing.
"""

from __future__ import annotations

from logging.config import fileConfig

import sqlalchemy as sa
from alembic import context
from sqlalchemy import pool

from pm_vector.db.postgres.migrate import MIGRATION_LOCK_KEY, SCHEMA, VERSION_TABLE_SCHEMA

config = context.config

if config.config_file_name is not None and not config.attributes.get("pm_vector_url"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    from pm_vector.db.postgres import sqlalchemy_url, url_for_migrations

    url = config.attributes.get("pm_vector_url") or config.get_main_option("sqlalchemy.url")
    if not url:
        url = url_for_migrations()
    return sqlalchemy_url(url)


def _include_name(name, type_, parent_names):
    # autogenerate: only pm_vector's own schema, and not the per-run embedding tables
    if type_ == "schema":
        return name == SCHEMA
    if type_ == "table" and name is not None and name.startswith("run_"):
        return False
    return True


def _run(connection) -> None:
    from pm_vector.db.store.models import Base

    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table_schema=VERSION_TABLE_SCHEMA,
        include_schemas=True,
        include_name=_include_name,
    )
    with context.begin_transaction():
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        connection.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        # the functions and column types need pgvector's schema on the search path
        ext_schema = connection.execute(sa.text(
            "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
            "WHERE e.extname = 'vector'")).scalar()
        path = [SCHEMA] + ([ext_schema] if ext_schema else []) + ["public"]
        connection.execute(sa.text("SELECT set_config('search_path', :p, true)"),
                           {"p": ", ".join('"%s"' % p.replace('"', '""') for p in dict.fromkeys(path))})
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = sa.create_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            _run(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("pm_vector's migrations run online only (they read the database, e.g. pgvector's schema).")
run_migrations_online()
