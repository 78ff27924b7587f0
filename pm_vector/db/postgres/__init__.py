"""Which PostgreSQL, keeping it up, connecting, migrating: pm_vector's PostgreSQL layer.

The modules, from the bottom up (each imports only those above it in this list)::

    config     DatabaseSettings (the PM_VECTOR_* environment, read in one place), URLs
    privileges the privilege matrix: who may do what in pm_vector's schemas (migration 0022 applies it)
    pgvector   the extension's check (>= 0.7), with the fix in the message
    recovery   waiting for a server still in crash recovery
    migrate    alembic driven from code: head, current revision, upgrade
    embedded   the embedded server's life cycle (start, stop, the server lock)
    cluster    a local coordinator, shards and streaming replicas on loopback ports
    replicas   ReadRouter: resolves spread over the replicas that keep up
    server     which server: external, the local cluster, or the embedded one
    adapt      configure(conn): the one setup of every connection (pgvector, JSON, int8 arrays)
    engine     psycopg connections and SQLAlchemy engines, each set up by configure
    priority   background sessions: a merge's backend at the lowest CPU priority, where it may

This face is what the rest of pm_vector uses. :func:`stop`, :func:`stop_cluster` and
:func:`upgrade` clear the engine's pools and checks around the server's own functions, so that
the server modules never import the engine (which imports them).
"""

from typing import Any

from . import cluster, priority
from . import server as _server
from .adapt import configure
from .config import EMBEDDED_DATABASE, DatabaseSettings, external_url, libpq_url, mode, redact, settings, sqlalchemy_url
from .engine import connect, connection, dispose_engines, forget_checks, get_engine, session_scope
from .migrate import current_revision, head_revision, upgrade_to_head
from .pgvector import check_pgvector_version, ensure_pgvector
from .server import admin_url, database_url, start, status, url_for_migrations


def stop() -> dict[str, Any]:
    """Stop the embedded server, its engines' pooled connections closed first
    (:func:`pm_vector.db.postgres.server.stop`)."""
    return _server.stop(before_stop=dispose_engines)


def stop_cluster() -> dict[str, Any]:
    """Stop the local cluster's nodes, the engines' pooled connections closed first
    (:func:`pm_vector.db.postgres.cluster.stop`)."""
    return cluster.stop(before_stop=dispose_engines)


def upgrade() -> dict[str, Any]:
    """Migrate to the newest schema (:func:`pm_vector.db.postgres.server.upgrade`), then forget
    which URLs the engine checked, so the next connection checks the new schema."""
    out = _server.upgrade()
    forget_checks()
    return out


__all__ = [
    "DatabaseSettings", "EMBEDDED_DATABASE", "admin_url", "check_pgvector_version", "cluster", "configure", "connect", "connection",
    "current_revision",
    "database_url", "dispose_engines", "ensure_pgvector", "external_url", "forget_checks", "get_engine",
    "head_revision", "libpq_url", "mode", "redact", "session_scope", "settings", "sqlalchemy_url", "start",
    "status", "stop", "stop_cluster", "upgrade", "upgrade_to_head", "url_for_migrations",
]
