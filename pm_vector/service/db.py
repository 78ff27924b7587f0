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


def _configure(conn) -> None:
    from pgvector.psycopg import register_vector

    register_vector(conn)
    if not conn.autocommit:
        conn.commit()


class ServicePool:
    def __init__(self, url: str | None = None, *, min_size: int = 1, max_size: int = 10, timeout: float = 30.0):
        from psycopg_pool import ConnectionPool

        from ..db import engine
        from ..db.server import database_url, libpq_url

        self.url = libpq_url(url or database_url())
        engine.connect(self.url).close()  # pgvector + schema at head, with pm_vector's own error messages
        self._pool = ConnectionPool(self.url, min_size=min_size, max_size=max_size, timeout=timeout,
                                    configure=_configure, open=False, name="pm_vector_service",
                                    kwargs={"connect_timeout": 10})
        try:
            self._pool.open(wait=True, timeout=timeout)
        except Exception as exc:  # pragma: no cover - depends on the server
            raise DatabaseConfigError(f"the service's connection pool could not connect: {exc}") from exc

    @contextmanager
    def connection(self) -> Iterator:
        """A pooled psycopg connection; the transaction is committed on success, rolled back on error."""
        with self._pool.connection() as conn:
            yield conn

    def stats(self) -> dict:
        return dict(self._pool.get_stats())

    def close(self) -> None:
        self._pool.close()
