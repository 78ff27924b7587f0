"""Connections: psycopg connections and SQLAlchemy engines/sessions, with pgvector registered.

Every connection handed out here is set up by :func:`pm_vector.db.postgres.adapt.configure`
(numpy arrays and :class:`pgvector.Vector` go in and out as ``vector``; ``HalfVector`` as
``halfvec``; JSON read by orjson).
The first connection to a URL in a process checks pgvector (>= 0.7) and that the schema is at
the newest migration, and raises :class:`SchemaNotReadyError` naming ``pm-vector db upgrade``
otherwise.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import psycopg

from ..errors import DatabaseConfigError, SchemaNotReadyError
from .adapt import configure
from .config import libpq_url, redact, sqlalchemy_url
from .pgvector import ensure_pgvector
from .server import database_url
from .migrate import current_revision, head_revision

_engines: dict[str, object] = {}
_checked: set[str] = set()
_lock = threading.Lock()


def forget_checks() -> None:
    """Forget which URLs were checked (after an upgrade, or in tests)."""
    with _lock:
        _checked.clear()


def dispose_engines() -> None:
    """Close all pooled connections of the engines made here."""
    with _lock:
        engines = list(_engines.values())
        _engines.clear()
        _checked.clear()
    for e in engines:
        e.dispose()


def _check_ready(conn, url: str) -> None:
    """pgvector present and recent, schema at head. ``conn``: a psycopg connection, idle."""
    if url in _checked:
        return

    ensure_pgvector(conn, where=redact(url))
    at = current_revision(conn)
    if not conn.autocommit:
        conn.rollback()
    head = head_revision()
    if at != head:
        state = "has no pm_vector schema" if at is None else f"is at schema revision {at}, not the newest ({head})"
        raise SchemaNotReadyError(
            f"the database {redact(url)} {state}. Run `pm-vector db upgrade` (or pm_vector.db.upgrade()) to "
            "apply the migrations.")
    with _lock:
        _checked.add(url)


#: ``client_connection_check_interval`` of worker connections (ms): a backend busy on a long
#: statement (an HNSW build, a big DELETE) notices within this time that its client died and
#: aborts, instead of finishing the statement (~25 s for an index) while holding the run's lock.
WATCH_CLIENT_MS = 1000


def connect(url: str | None = None, *, autocommit: bool = False, check: bool = True, watch_client: bool = False,
            application_name: str | None = None):
    """A new psycopg connection (caller closes it), set up by :func:`~pm_vector.db.postgres.adapt.configure`.

    ``url`` defaults to :func:`pm_vector.db.postgres.server.database_url` (which starts and migrates
    the embedded server if that is the mode). ``watch_client``: set
    ``client_connection_check_interval`` (:data:`WATCH_CLIENT_MS`) for the session, for jobs
    and ingests whose statements run long. ``application_name``: the session's, as
    ``pg_stat_activity`` shows it (None: the URL's, else ``PGAPPNAME``'s, else none).
    """
    url = libpq_url(url or database_url())
    try:
        named = {} if application_name is None else {"application_name": application_name}
        conn = psycopg.connect(url, autocommit=autocommit, connect_timeout=10, **named)
    except psycopg.OperationalError as exc:
        raise DatabaseConfigError(
            f"cannot connect to {redact(url)} ({str(exc).strip()}). Check PM_VECTOR_DATABASE_URL, or unset it to "
            "use the embedded server (pm-vector db start).") from exc
    try:
        if check:
            _check_ready(conn, url)
        configure(conn)
        if watch_client and conn.info.server_version >= 140000:  # the setting came with PostgreSQL 14
            # session-level (is_local false) and committed, so a later rollback keeps it
            conn.execute("SELECT set_config('client_connection_check_interval', %s, false)", [str(WATCH_CLIENT_MS)])
            if not autocommit:
                conn.commit()
        if not autocommit:
            conn.rollback()
    except BaseException:
        conn.close()
        raise
    return conn


@contextmanager
def connection(url: str | None = None, *, autocommit: bool = False) -> Iterator:
    """``with connection() as conn:`` a psycopg connection, closed at the end (no implicit commit:
    commit explicitly; anything uncommitted is rolled back)."""
    conn = connect(url, autocommit=autocommit)
    try:
        yield conn
    finally:
        try:
            if not conn.closed and not autocommit:
                conn.rollback()
        finally:
            conn.close()


def get_engine(url: str | None = None):
    """A cached SQLAlchemy engine (psycopg 3 driver) for ``url`` (default: :func:`database_url`)."""
    from sqlalchemy import create_engine, event

    url = libpq_url(url or database_url())
    with _lock:
        eng = _engines.get(url)
    if eng is not None:
        return eng
    # check once with a plain connection, so the error is ours and not a pool traceback
    connect(url).close()
    eng = create_engine(sqlalchemy_url(url), pool_pre_ping=True, pool_size=5, max_overflow=5)

    @event.listens_for(eng, "connect")
    def _on_connect(dbapi_connection, connection_record):  # noqa: ARG001
        configure(dbapi_connection)  # leaves the connection idle for SQLAlchemy

    with _lock:
        _engines.setdefault(url, eng)
        return _engines[url]


@contextmanager
def session_scope(url: str | None = None) -> Iterator:
    """``with session_scope() as s:`` an ORM session committed on success, rolled back on error."""
    from sqlalchemy.orm import Session

    with Session(get_engine(url), expire_on_commit=False) as s:
        try:
            yield s
            s.commit()
        except BaseException:
            s.rollback()
            raise
