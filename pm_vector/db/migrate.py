"""Kept for one release: the module moved to :mod:`pm_vector.db.postgres.migrate`; import from there."""

from .postgres.migrate import (  # noqa: F401
    MIGRATION_LOCK_KEY, SCHEMA, VERSION_TABLE_SCHEMA, alembic_config, current_revision, execute_sql_file,
    head_revision, migrations_dir, sql_dir, upgrade_to_head,
)
