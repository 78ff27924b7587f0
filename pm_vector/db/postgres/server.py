"""Which PostgreSQL pm_vector talks to: an external server, the local cluster, or the embedded one.

Two modes (:mod:`pm_vector.db.postgres.config` reads them):

**embedded** (the default, nothing to configure)
    pm_vector runs a private PostgreSQL 18 + pgvector 0.8 (:mod:`pm_vector.db.postgres.embedded`)
    with its files under ``PM_VECTOR_HOME`` (default ``~/.local/share/pm_vector``). The first
    use in a process (``database_url()``, any API call) starts the server if it is not running
    and applies the migrations. The server then keeps running after the process exits, for the
    next process to reuse, until ``stop()`` (``pm-vector db stop``). With a local cluster in
    ``PM_VECTOR_HOME`` (:mod:`pm_vector.db.postgres.cluster`), its coordinator is the database.

**external** (``PM_VECTOR_DATABASE_URL`` is set)
    Any PostgreSQL with pgvector >= 0.7, e.g.
    ``PM_VECTOR_DATABASE_URL=postgresql://user:secret@db.example.org:5432/pm``. On first connect
    pm_vector runs ``CREATE EXTENSION IF NOT EXISTS vector`` and checks the version; a missing
    extension, missing privileges or an old version raise :class:`PgvectorMissingError` /
    :class:`PgvectorVersionError` naming the fix. pm_vector never starts or stops that
    server, and never migrates it on its own: run ``upgrade()`` (``pm-vector db upgrade``) once,
    and after upgrading pm_vector.

The functions here return plain data (dicts, strings) and print nothing; the CLI wires them to
``pm-vector db start|stop|status|url|upgrade``. This module holds no connection pool:
:mod:`pm_vector.db.postgres` (the package face) wraps :func:`stop` and :func:`upgrade` so that
the engine's pools and checks are cleared too.
"""

from __future__ import annotations

from typing import Any, Callable

import psycopg

from ..errors import DatabaseConfigError
from . import cluster, embedded
from .config import EMBEDDED_DATABASE, ENV_URL, external_url, home, libpq_url, mode, pgdata_dir, redact
from .pgvector import ensure_pgvector
from .migrate import current_revision, head_revision, upgrade_to_head


def database_url() -> str:
    """The libpq URL of pm_vector's database.

    External mode: ``PM_VECTOR_DATABASE_URL`` (driver suffix removed). Embedded mode: starts
    the embedded server if needed and applies pending migrations first (once per process, as its
    superuser), then logs in as the owner role ``pm_vector_owner`` (no superuser); with a
    local cluster in ``PM_VECTOR_HOME`` (:mod:`pm_vector.db.postgres.cluster`), its coordinator.
    """
    ext = external_url()
    if ext:
        return libpq_url(ext)
    if cluster.topology() is not None:
        return cluster.ensure_running()
    return embedded.ensure_embedded(migrate=True)


def admin_url() -> str:
    """The URL that may create roles and databases: the embedded server's superuser (started and
    migrated if needed) or the local cluster coordinator's, else the same as :func:`database_url`
    (external: your URL). For migrations, role management and tests; pm_vector runs on
    :func:`database_url`."""
    ext = external_url()
    if ext:
        return libpq_url(ext)
    if cluster.topology() is not None:
        cluster.ensure_running()
        return cluster.admin_url()
    return embedded.admin_url()


def _check_external(url: str) -> None:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        ensure_pgvector(conn, where=redact(url))


def start(progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Start (or reuse) the embedded server and migrate it to head; return :func:`status`.

    A server still recovering from a crash is waited for (up to ``PM_VECTOR_START_TIMEOUT_S``,
    default 600 s), ``progress`` (default: a logged warning) told so; it fails only if the
    postmaster exits or that limit passes. External mode starts nothing: it checks the
    connection and pgvector and returns the status.
    """
    ext = external_url()
    if ext:
        url = libpq_url(ext)
        try:
            _check_external(url)
        except psycopg.OperationalError as exc:
            raise DatabaseConfigError(
                f"cannot connect to {redact(url)} ({str(exc).strip()}). Check {ENV_URL}, or unset it to use the "
                "embedded server.") from exc
        return status()
    embedded.ensure_embedded(migrate=True, progress=progress)
    return status()


def stop(before_stop: Callable[[], None] | None = None) -> dict[str, Any]:
    """Stop the embedded server (fast shutdown: open sessions are ended). Returns what happened.

    In external mode nothing is stopped (``{"mode": "external", "stopped": False, ...}``).
    ``before_stop``: see :func:`pm_vector.db.postgres.embedded.stop`.
    """
    if external_url():
        return {"mode": "external", "stopped": False, "was_running": None,
                "message": f"{ENV_URL} is set: pm_vector does not manage that server."}
    return embedded.stop(before_stop)


def status() -> dict[str, Any]:
    """Where the database is and what state it is in. Never starts anything.

    Keys: ``mode``, ``url`` (password redacted), ``running``, ``pid`` (embedded), ``home``,
    ``pgdata`` (embedded), ``server_version``, ``pgvector_version``, ``schema_revision``,
    ``head_revision``, ``schema_up_to_date``, ``error`` (a connection problem, else ``None``).
    """
    out: dict[str, Any] = {"mode": mode(), "url": None, "running": False, "pid": None, "home": None,
                           "pgdata": None, "server_version": None, "pgvector_version": None,
                           "schema_revision": None, "head_revision": head_revision(),
                           "schema_up_to_date": False, "error": None}
    if out["mode"] == "external":
        url = libpq_url(external_url())
    else:
        pgdata = pgdata_dir()
        out["home"], out["pgdata"] = str(home()), str(pgdata)
        info = embedded.postmaster(pgdata)
        if info is None:
            return out
        out["pid"] = info.pid
        url = info.get_uri(database=EMBEDDED_DATABASE)
    out["url"] = redact(url)
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            out["running"] = True
            out["server_version"] = conn.execute("SHOW server_version").fetchone()[0]
            row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
            out["pgvector_version"] = row[0] if row else None
            out["schema_revision"] = current_revision(conn)
    except psycopg.Error as exc:
        out["error"] = f"{exc.__class__.__name__}: {str(exc).strip()}"
    out["schema_up_to_date"] = out["schema_revision"] is not None and out["schema_revision"] == out["head_revision"]
    return out


def upgrade() -> dict[str, Any]:
    """Migrate the database to the newest schema (alembic ``upgrade head``).

    Returns ``{"mode", "url", "from_revision", "to_revision", "head_revision"}``. Embedded mode
    starts the server if needed.
    """
    ext = external_url()
    if ext:
        url = libpq_url(ext)
        _check_external(url)
        res = upgrade_to_head(url)
    else:
        url, res = embedded.upgrade()
    return {"mode": mode(), "url": redact(url), **res, "head_revision": head_revision()}


def url_for_migrations() -> str:
    """URL for ``migrations/env.py`` when alembic is run by hand: external URL, or the embedded
    server (started if needed) without applying migrations."""
    ext = external_url()
    if ext:
        return libpq_url(ext)
    return embedded.ensure_embedded(migrate=False)
