"""The service's database access: one psycopg ConnectionPool per app, pgvector registered.

:func:`pm_vector.db.engine.connect` opens a fresh connection per call, which costs a TCP/TLS
handshake and a backend start-up per request; the service instead borrows connections from a
:class:`psycopg_pool.ConnectionPool` (``pool_min`` .. ``pool_max`` connections), so concurrent
requests share a bounded set of sessions. Readiness (pgvector present, schema at head) is
checked once with :func:`pm_vector.db.engine.connect` before the pool opens.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from ..db.errors import DatabaseConfigError


def _reset(conn) -> None:
    import time

    conn._pm_returned = time.monotonic()  # for _check


def _configure(conn) -> None:
    from pgvector.psycopg import register_vector

    register_vector(conn)
    if not conn.autocommit:
        conn.commit()


def _session_as(conn, role: str | None) -> None:
    """Make ``conn``'s session run as ``role`` (None: the service user), with a round trip only
    when it runs as another one: a session keeps its role between requests, so a run of requests
    of one kind pays nothing (a SET ROLE and a RESET ROLE per request cost two round trips)."""
    from psycopg import sql

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
    """The pool's check before lending ``conn``: a round trip (psycopg_pool's check_connection)
    unless the connection was returned less than :data:`FRESH_S` ago and its socket is quiet.
    Under load connections come back within milliseconds, so a request costs no ping; the session
    of a server that went away is still replaced before a request gets it."""
    import select
    import time

    from psycopg_pool import ConnectionPool

    if time.monotonic() - getattr(conn, "_pm_returned", float("-inf")) < FRESH_S:
        try:
            if not select.select([conn.fileno()], [], [], 0)[0]:
                return
        except (OSError, ValueError):
            pass
    ConnectionPool.check_connection(conn)


class ServicePool:
    def __init__(self, url: str | None = None, *, min_size: int = 1, max_size: int = 10, timeout: float = 30.0):
        from psycopg_pool import ConnectionPool

        from ..db import engine
        from ..db.server import database_url, libpq_url

        self.url = libpq_url(url or database_url())
        engine.connect(self.url).close()  # pgvector + schema at head, with pm_vector's own error messages
        # check: a connection is verified before it is handed out (_check), so that the sessions of
        # a server that was restarted or killed are replaced instead of failing one request each
        self._pool = ConnectionPool(self.url, min_size=min_size, max_size=max_size, timeout=GETCONN_TIMEOUT,
                                    configure=_configure, reset=_reset, open=False, name="pm_vector_service",
                                    check=_check, kwargs={"connect_timeout": 5})

        self._open_timeout = timeout
        try:
            self._pool.open(wait=True, timeout=self._open_timeout)
        except Exception as exc:  # pragma: no cover - depends on the server
            raise DatabaseConfigError(f"the service's connection pool could not connect: {exc}") from exc

    @contextmanager
    def connection(self) -> Iterator:
        """A pooled psycopg connection whose session runs as the service user; the transaction is
        committed on success, rolled back on error."""
        with self._pool.connection() as conn:
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
        with self._pool.connection() as conn:
            _session_as(conn, role or None)
            yield conn

    def ping(self, timeout: float = 2.0) -> str | None:
        """None when the database answers ``SELECT 1`` within ``timeout`` seconds, else why not."""
        try:
            with self._pool.connection(timeout=timeout) as conn:
                conn.execute("SELECT 1")
            return None
        except Exception as exc:  # noqa: BLE001 - any failure means unreachable; the reason is reported
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".strip(": ")

    def stats(self) -> dict:
        return dict(self._pool.get_stats())

    def close(self) -> None:
        self._pool.close()
