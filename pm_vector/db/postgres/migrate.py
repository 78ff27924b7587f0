"""Alembic, driven from code: where the migrations and SQL files are, head and current revision, upgrade.

The migration scripts live in ``migrations/`` and the user-readable SQL they install in
``sql/``, both at the top of the source tree; a wheel installs copies under
``<prefix>/share/pm_vector/``, which is searched next. ``PM_VECTOR_MIGRATIONS_DIR`` and
``PM_VECTOR_SQL_DIR`` override the locations (e.g. for an installation that ships them
elsewhere). ``migrations/alembic.ini`` is only needed to run the ``alembic`` command line by
hand; pm_vector builds its :class:`alembic.config.Config` in code (:func:`alembic_config`).

The alembic version table is ``pm_vector.alembic_version``.
"""

from __future__ import annotations

import functools

import re
import sys
import sysconfig
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from ..errors import DatabaseConfigError
from .config import libpq_url, settings

SCHEMA = "pm_vector"
VERSION_TABLE_SCHEMA = SCHEMA
#: advisory lock (bigint key) serialising concurrent migrations on one database: "PM" << 48 | 0xA1E
MIGRATION_LOCK_KEY = (0x504D << 48) | 0xA1E

_REPO_ROOT = Path(__file__).resolve().parents[3]


def _candidates(name: str) -> list[Path]:
    """The source tree (editable install, checkout), then ``<prefix>/share/pm_vector/<name>``
    where a wheel installs them (pyproject's data-files)."""
    out = [_REPO_ROOT / name]
    for prefix in dict.fromkeys([sysconfig.get_path("data"), sys.prefix, sys.base_prefix]):
        out.append(Path(prefix) / "share" / "pm_vector" / name)
    return out


def _locate(configured: Path | None, name: str, ok) -> Path:
    if configured is not None:
        return configured
    cands = _candidates(name)
    return next((d for d in cands if ok(d)), cands[0])


def migrations_dir() -> Path:
    """Directory of the alembic environment (``env.py``, ``versions/``)."""
    d = _locate(settings().migrations_dir, "migrations", lambda p: (p / "env.py").is_file())
    if not (d / "env.py").is_file():
        raise DatabaseConfigError(
            f"pm_vector's migrations were not found at {d} (no env.py). Set PM_VECTOR_MIGRATIONS_DIR to the "
            "'migrations' directory of the pm_vector source tree.")
    return d


def sql_dir() -> Path:
    """Directory of the SQL files installed by the migrations."""
    d = _locate(settings().sql_dir, "sql", lambda p: (p / "0001_functions.sql").is_file())
    if not d.is_dir():
        raise DatabaseConfigError(
            f"pm_vector's SQL files were not found at {d}. Set PM_VECTOR_SQL_DIR to the 'sql' directory of the "
            "pm_vector source tree.")
    return d


def alembic_config(url: str | None = None, connection: Any = None):
    """An :class:`alembic.config.Config` for pm_vector's migrations.

    ``url`` (a libpq or SQLAlchemy URL) is handed to ``env.py`` through ``Config.attributes`` (no
    ini interpolation of ``%`` in passwords); ``connection`` (a SQLAlchemy Connection) is used as is.
    """
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        cfg.attributes["pm_vector_url"] = url
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.lru_cache(maxsize=1)
def head_revision() -> str:
    """The newest revision among the migration scripts (read once a process: the scripts ship with
    the package. A local cluster's every connection compares it with the coordinator's revision,
    and reading the scripts each time made an exhaustive resolve check of a sharded run take
    minutes: 236 s for ``tests/cluster/test_cluster_delta.py``'s, most of it in alembic)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(conn) -> str | None:
    """The revision the database is at (``None`` for an empty database).

    ``conn`` is a psycopg connection; only a read of ``pm_vector.alembic_version``.
    """
    row = conn.execute("SELECT to_regclass('pm_vector.alembic_version') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return None
    rows = conn.execute("SELECT version_num FROM pm_vector.alembic_version").fetchall()
    return rows[0][0] if rows else None


def upgrade_to_head(url: str) -> dict[str, Any]:
    """Run ``alembic upgrade head`` against ``url`` and return ``{"from_revision", "to_revision"}``.

    Concurrent upgrades of one database serialise on an advisory lock taken in ``env.py``.
    """
    from alembic import command

    with psycopg.connect(libpq_url(url), autocommit=True, connect_timeout=10) as conn:
        before = current_revision(conn)
    command.upgrade(alembic_config(url), "head")
    with psycopg.connect(libpq_url(url), autocommit=True, connect_timeout=10) as conn:
        after = current_revision(conn)
        out: dict[str, Any] = {"from_revision": before, "to_revision": after}
        # runs whose public parts an earlier downgrade dropped (migration 0013): their collections need a job
        stale = [r[0] for r in conn.execute(
            "SELECT c.name FROM pm_vector.collections c JOIN pm_vector.embedding_runs r ON r.id = c.active_run_id "
            "WHERE r.class_rows -> 'cells' ->> 'status' = 'dropped' ORDER BY c.name")] if after else []
    if stale:
        out["needs_new_job"] = stale
        out["note"] = (f"the active run of {len(stale)} collection(s) lost its cells in an earlier schema downgrade; "
                       "their cell requests are refused (503) until a new embedding job: pm-vector embed "
                       + ", pm-vector embed ".join(stale[:5]) + (" ..." if len(stale) > 5 else ""))
    return out


_PLACEHOLDER = re.compile(r"@vector_schema@")


def execute_sql_file(driver_connection, name: str) -> None:
    """Execute ``sql/<name>`` on a psycopg connection (inside the caller's transaction).

    ``@vector_schema@`` in the file is replaced by the (quoted) schema of the pgvector
    extension, so the functions find the ``vector`` type wherever it was installed.
    """
    path = sql_dir() / name
    text = path.read_text(encoding="utf-8")
    row = driver_connection.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'vector'").fetchone()
    if row is None:
        raise DatabaseConfigError("the pgvector extension is not installed; run CREATE EXTENSION vector first.")
    schema = sql.Identifier(row[0]).as_string(driver_connection)
    text = _PLACEHOLDER.sub(schema, text)
    # No parameters: psycopg sends the text as is (several statements allowed, '%' untouched).
    driver_connection.execute(text.encode("utf-8"))
