"""The pgvector check: that the extension is there, recent enough (>= 0.7), and how to fix it if not."""

from __future__ import annotations

import re

import psycopg

from ..errors import PgvectorMissingError, PgvectorVersionError

MIN_PGVECTOR = (0, 7, 0)



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
