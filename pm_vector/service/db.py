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
    # a connection lent to a query key's resolve goes back to the pool as the service user (only
    # those: a RESET per request would cost every request a round trip)
    if getattr(conn, "_pm_role", None):
        conn.rollback()
        conn.execute("RESET ROLE")
        if not conn.autocommit:
            conn.commit()
        conn._pm_role = None


def _configure(conn) -> None:
    from pgvector.psycopg import register_vector

    register_vector(conn)
    if not conn.autocommit:
        conn.commit()


#: seconds a request waits for a pooled connection before the service answers 503
GETCONN_TIMEOUT = 5.0


class ServicePool:
    def __init__(self, url: str | None = None, *, min_size: int = 1, max_size: int = 10, timeout: float = 30.0):
        from psycopg_pool import ConnectionPool

        from ..db import engine
        from ..db.server import database_url, libpq_url

        self.url = libpq_url(url or database_url())
        engine.connect(self.url).close()  # pgvector + schema at head, with pm_vector's own error messages
        # check: a connection is verified before it is handed out, so that the sessions of a
        # server that was restarted or killed are replaced instead of failing one request each
        self._pool = ConnectionPool(self.url, min_size=min_size, max_size=max_size, timeout=GETCONN_TIMEOUT,
                                    configure=_configure, reset=_reset, open=False, name="pm_vector_service",
                                    check=ConnectionPool.check_connection, kwargs={"connect_timeout": 5})
        self._open_timeout = timeout
        try:
            self._pool.open(wait=True, timeout=self._open_timeout)
        except Exception as exc:  # pragma: no cover - depends on the server
            raise DatabaseConfigError(f"the service's connection pool could not connect: {exc}") from exc

    @contextmanager
    def connection(self) -> Iterator:
        """A pooled psycopg connection; the transaction is committed on success, rolled back on error."""
        with self._pool.connection() as conn:
            yield conn

    def usable_role(self, role: str) -> bool:
        """May this pool's sessions ``SET ROLE role`` (it exists, the user is a member) and may the role
        use every foreign server (shards: a resolve reads them)? Checked at start-up."""
        if not role:
            return False
        with self._pool.connection() as conn:
            r = conn.execute("SELECT pg_has_role(current_user, oid, 'MEMBER') AND coalesce((SELECT "
                             "bool_and(has_server_privilege(r.oid, s.oid, 'USAGE')) FROM pg_foreign_server s), true) "
                             "FROM pg_roles r WHERE rolname = %s", [role]).fetchone()
            conn.commit()
        return bool(r and r[0])

    @contextmanager
    def connection_as(self, role: str | None) -> Iterator:
        """A pooled connection whose session runs as ``role`` (None: the service user); idle on entry.
        The pool's reset puts the session back to the service user when it is returned."""
        from psycopg import sql

        with self._pool.connection() as conn:
            if role:
                conn._pm_role = role  # marks it for _reset before anything can fail
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
                conn.commit()
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
