"""Kept for one release: the module moved to :mod:`pm_vector.db.postgres.engine`; import from there."""

from .postgres.engine import (  # noqa: F401
    WATCH_CLIENT_MS, _check_ready, _register, connect, connection, dispose_engines, forget_checks, get_engine,
    session_scope,
)
