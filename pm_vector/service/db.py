"""The service's database access: one psycopg ConnectionPool per app, each connection set up by
:func:`pm_vector.db.postgres.configure` (as every connection pm_vector opens).

:func:`pm_vector.db.postgres.connect` opens a fresh connection per call, which costs a TCP/TLS
handshake and a backend start-up per request; the service instead borrows connections from a
:class:`psycopg_pool.ConnectionPool` (``pool_min`` .. ``pool_max`` connections), so concurrent
requests share a bounded set of sessions. Readiness (pgvector present, schema at head) is
checked once with :func:`pm_vector.db.postgres.connect` before the pool opens. While the database
is down there is no pool and requests fail at once; a fresh pool opens as soon as the database
answers again (:mod:`pm_vector.service.dbhealth`).
"""

from __future__ import annotations

import select
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from psycopg import sql
from psycopg_pool import ConnectionPool
from urllib.parse import unquote, urlsplit

from ..db.errors import DatabaseConfigError
from ..db.postgres.config import with_login  # noqa: F401 - the service's import path of it
from .errors import database_down
from ..db.postgres import configure, database_url, engine, libpq_url
from .dbhealth import DatabaseHealth, DatabaseUnavailableError




def _session_as(conn, role: str | None) -> None:
    """Make ``conn``'s session run as ``role`` (None: the service user), with a round trip only
    when it runs as another one: a session keeps its role between requests, so a run of requests
    of one kind pays nothing (a SET ROLE and a RESET ROLE per request cost two round trips)."""
    if getattr(conn, "_pm_session_role", None) == role:
        return
    if conn.info.transaction_status != 0:  # psycopg.pq.TransactionStatus.IDLE
        conn.rollback()
    conn.execute("RESET ROLE" if role is None else sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    if not conn.autocommit:
        conn.commit()
    conn._pm_session_role = role


#: seconds a request waits for a pooled connection before the service answers 503
GETCONN_TIMEOUT = 5.0
#: a connection back in the pool for less than this is lent without a round trip, unless its
#: socket has something to read (a server that stopped or was killed closes it or says why)
FRESH_S = 1.0


def _check(conn) -> None:
    """The check before lending ``conn`` (:meth:`ServicePool._get`): a round trip (psycopg_pool's
    check_connection) unless the connection was returned less than :data:`FRESH_S` ago and its
    socket is quiet.
    Under load connections come back within milliseconds, so a request costs no ping; the session
    of a server that went away is still replaced before a request gets it."""
    if time.monotonic() - getattr(conn, "_pm_returned", float("-inf")) < FRESH_S:
        try:
            if not select.select([conn.fileno()], [], [], 0)[0]:
                return
        except (OSError, ValueError):
            pass
    ConnectionPool.check_connection(conn)


class ServicePool:
    """The service's connections: a psycopg ConnectionPool while the database is up, none while it
    is down (:mod:`pm_vector.service.dbhealth` watches it).

    While the database is down every request fails at once with
    :class:`~pm_vector.service.dbhealth.DatabaseUnavailableError` (a psycopg.OperationalError: the
    service answers 503); as soon as a connection succeeds again a fresh pool is opened. A
    request that loses its connection, or whose pooled connection fails its check, asks the
    monitor to look at once, so an outage is noticed within milliseconds of the first failure
    (and within ``heartbeat_s`` without any request)."""

    def __init__(self, url: str | None = None, *, min_size: int = 1, max_size: int = 10, timeout: float = 30.0,
                 heartbeat_s: float = 0.5, probe_s: float = 0.25):
        self.url = libpq_url(url or database_url())
        self.min_size, self.max_size = min_size, max_size
        engine.connect(self.url).close()  # pgvector + schema at head, with pm_vector's own error messages
        self._lock = threading.Lock()
        self._pool = None
        self._open_timeout = timeout
        self.health = DatabaseHealth(self.url, heartbeat_s=heartbeat_s, probe_s=probe_s,
                                     on_down=self._close_pool, on_up=self._reopen_pool)
        try:
            self._pool = self._open_pool(self._open_timeout)
        except Exception as exc:  # pragma: no cover - depends on the server
            raise DatabaseConfigError(f"the service's connection pool could not connect: {exc}") from exc
        self.health.start()

    def _open_pool(self, timeout: float):
        # no check= here: _borrow checks each connection itself, so that a failed check asks the
        # health monitor at once instead of psycopg_pool's retry back-off (1 s and more)
        pool = ConnectionPool(self.url, min_size=self.min_size, max_size=self.max_size, timeout=GETCONN_TIMEOUT,
                              configure=configure, open=False, name="pm_vector_service",
                              kwargs={"connect_timeout": 5})
        pool.open(wait=True, timeout=timeout)
        return pool

    def _close_pool(self) -> None:
        """The database went down: requests waiting for a connection fail now (PoolClosed)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:  # closing joins the pool's threads: not on the monitor's time
            threading.Thread(target=pool.close, name="pm_vector-pool-close", daemon=True).start()

    def _reopen_pool(self) -> None:
        """The database answers again: a fresh pool (no reconnection back-off inherited)."""
        pool = self._open_pool(timeout=5.0)
        with self._lock:
            old, self._pool = self._pool, pool
        if old is not None:
            old.close()

    def _get(self, timeout: float | None):
        """A checked connection and its pool. A connection that fails its check (:func:`_check`:
        the sessions of a server that was restarted or killed) is dropped and the database probed
        at once: down, DatabaseUnavailableError; up, the next connection is tried."""
        deadline = time.monotonic() + (GETCONN_TIMEOUT if timeout is None else timeout)
        while True:
            self.health.check()
            with self._lock:
                pool = self._pool
            if pool is None:
                raise DatabaseUnavailableError("the database is unreachable; the service reconnects by itself")
            try:
                conn = pool.getconn(timeout=max(0.001, deadline - time.monotonic()))
            except Exception as exc:
                if database_down(exc):
                    self.health.report_failure()
                raise
            try:
                _check(conn)
                return pool, conn
            except Exception:  # noqa: BLE001 - a dead session: the pool replaces a closed connection
                conn.close()
                pool.putconn(conn)
            if not self.health.probe_now():
                self.health.check()

    @contextmanager
    def _borrow(self, timeout: float | None = None) -> Iterator:
        """A pooled connection (committed on success, rolled back on error, then returned); a
        request that loses its connection asks the health monitor to look at once."""
        pool, conn = self._get(timeout)
        try:
            with conn:
                yield conn
        except Exception as exc:
            if database_down(exc):
                self.health.report_failure()
            raise
        finally:
            # stamped here for _check, not by a pool ``reset`` callback: with one, psycopg_pool hands
            # every returned connection to its worker thread (a queue and a thread switch a request)
            conn._pm_returned = time.monotonic()
            pool.putconn(conn)

    @contextmanager
    def connection(self) -> Iterator:
        """A pooled psycopg connection whose session runs as the service user; the transaction is
        committed on success, rolled back on error."""
        with self._borrow() as conn:
            _session_as(conn, None)
            yield conn

    def usable_role(self, role: str) -> bool:
        """May this pool's sessions ``SET ROLE role`` (it exists, the user is a member) and may the role
        use every foreign server (shards: a resolve reads them)? Checked at start-up."""
        if not role:
            return False
        with self.connection() as conn:
            r = conn.execute("SELECT pg_has_role(current_user, oid, 'MEMBER') AND coalesce((SELECT "
                             "bool_and(has_server_privilege(r.oid, s.oid, 'USAGE')) FROM pg_foreign_server s), true) "
                             "FROM pg_roles r WHERE rolname = %s", [role]).fetchone()
            conn.commit()
        return bool(r and r[0])

    @contextmanager
    def connection_as(self, role: str | None) -> Iterator:
        """A pooled connection whose session runs as ``role`` (None: the service user); idle on
        entry. The session keeps the role when it goes back to the pool (:func:`_session_as`);
        :meth:`connection` puts it back to the service user before lending it again."""
        with self._borrow() as conn:
            _session_as(conn, role or None)
            yield conn

    def ping(self, timeout: float = 2.0) -> str | None:
        """None when the database answers ``SELECT 1`` within ``timeout`` seconds, else why not."""
        why = self.health.reason()
        if why is not None:  # known to be down: no wait
            return why
        try:
            with self._borrow(timeout=timeout) as conn:
                conn.execute("SELECT 1")
            return None
        except Exception as exc:  # noqa: BLE001 - any failure means unreachable; the reason is reported
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".strip(": ")

    def stats(self) -> dict:
        pool = self._pool
        return dict(pool.get_stats()) if pool is not None else {}

    def close(self) -> None:
        self.health.close()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def query_login(pool: ServicePool, query_db_url: str = "") -> tuple[str, str | None] | None:
    """The login (user, password) of query keys' own pool: the one ``query_db_url`` gives, else the
    login role migration 0017 made for this database (``pm_vector_service.query_login``), else None
    (the migrating user could not create roles: query keys use ``SET ROLE``)."""
    if query_db_url:
        parts = urlsplit(query_db_url)
        return (unquote(parts.username), unquote(parts.password) if parts.password else None) \
            if parts.username else None
    with pool.connection() as conn:
        row = conn.execute("SELECT role_name, password FROM pm_vector_service.query_login").fetchone()
        conn.commit()
    return (row[0], row[1]) if row else None
