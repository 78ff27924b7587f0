"""Which PostgreSQL pm_vector talks to, read from the environment in one place; database URLs.

A leaf: it imports nothing of pm_vector but the error classes, so the embedded server, the local
cluster, the engine and the migrations all read their configuration here without importing
each other.

:class:`DatabaseSettings` is the database layer's configuration, frozen and validated. It is
read from the environment on every call of :func:`settings` (a process may change
``PM_VECTOR_HOME`` between two uses, as the tests do); a bad value raises
:class:`~pm_vector.db.errors.DatabaseConfigError` naming the variable and the fix.

========================== ==================================== ===============================
variable                   setting                              default
========================== ==================================== ===============================
``PM_VECTOR_HOME``         ``home``: the embedded server's and  ``~/.local/share/pm_vector``
                           the local cluster's files
``PM_VECTOR_DATABASE_URL`` ``database_url``: an external        unset (embedded mode)
                           PostgreSQL with pgvector >= 0.7
``PM_VECTOR_EMBEDDED_FAST`` ``embedded_fast``: new data          off
                           directories without fsync (tests)
``PM_VECTOR_START_TIMEOUT_S`` ``start_timeout_s``: how long a    600
                           start waits for crash recovery
``PM_VECTOR_MIGRATIONS_DIR`` ``migrations_dir``                  the source tree, then the wheel's
``PM_VECTOR_SQL_DIR``      ``sql_dir``                          the source tree, then the wheel's
``PM_VECTOR_RUN_GRAPH_CACHE_MB`` ``run_graph_cache_mb``: memory  1024
                           for the run graphs a resolving
                           process keeps (MB, >= 0)
``PM_VECTOR_OWNER_ROLE``   ``owner_role``: the role that owns   unset (the migrating role);
                           pm_vector's schemas on your own      embedded: ``pm_vector_owner``
                           PostgreSQL (migration 0022 hands
                           them to it)
========================== ==================================== ===============================

The embedded server's migrations run as its superuser; everything after them (the service, the
jobs, the sync, the CLI) logs in as :data:`OWNER_ROLE`, a role that is no superuser
(:mod:`pm_vector.db.postgres.privileges`).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping
from urllib.parse import quote, urlsplit, urlunsplit

from ..errors import DatabaseConfigError

ENV_HOME = "PM_VECTOR_HOME"
ENV_URL = "PM_VECTOR_DATABASE_URL"
ENV_FAST = "PM_VECTOR_EMBEDDED_FAST"
ENV_START_TIMEOUT = "PM_VECTOR_START_TIMEOUT_S"
ENV_MIGRATIONS_DIR = "PM_VECTOR_MIGRATIONS_DIR"
ENV_SQL_DIR = "PM_VECTOR_SQL_DIR"
ENV_RUN_GRAPH_CACHE_MB = "PM_VECTOR_RUN_GRAPH_CACHE_MB"
ENV_OWNER_ROLE = "PM_VECTOR_OWNER_ROLE"
#: the embedded default's owner of pm_vector's schemas: NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS
OWNER_ROLE = "pm_vector_owner"
DEFAULT_HOME = "~/.local/share/pm_vector"
DEFAULT_START_TIMEOUT_S = 600.0
MAX_START_TIMEOUT_S = 86400.0
#: a graph takes about 8 (d + 2 g + 2) bytes per prior item (:mod:`pm_vector.db.resolve.run_graph`):
#: at the default d = 4, g = 16, 304 MB for 1,000,000 items
DEFAULT_RUN_GRAPH_CACHE_MB = 1024.0
MAX_RUN_GRAPH_CACHE_MB = float(2 ** 30)  # 1 PB: a bound that keeps the byte count an exact integer
EMBEDDED_DATABASE = "pm_vector"

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class DatabaseSettings:
    """The database layer's configuration (see the module docstring for the variables).

    ``home`` is absolute; ``database_url`` is ``None`` in embedded mode (never an empty string);
    ``start_timeout_s`` is in (0, 86400]; ``migrations_dir`` / ``sql_dir`` are ``None`` unless set
    (:mod:`pm_vector.db.postgres.migrate` then searches the source tree and the wheel's copy);
    ``run_graph_cache_mb`` is in [0, 2**30] (0 keeps only the graph in use).
    """

    home: Path = Path(DEFAULT_HOME).expanduser().resolve()
    database_url: str | None = None
    embedded_fast: bool = False
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    migrations_dir: Path | None = None
    sql_dir: Path | None = None
    run_graph_cache_mb: float = DEFAULT_RUN_GRAPH_CACHE_MB
    owner_role: str | None = None

    def __post_init__(self):
        if not isinstance(self.home, Path) or not self.home.is_absolute():
            raise DatabaseConfigError(f"{ENV_HOME} must be an absolute directory, got {self.home!r}; set it to "
                                      "a directory pm_vector may write (or unset it for ~/.local/share/pm_vector).")
        if self.database_url is not None and (not isinstance(self.database_url, str) or not self.database_url):
            raise DatabaseConfigError(f"{ENV_URL} must be a non-empty PostgreSQL URL or unset, "
                                      f"got {self.database_url!r}.")
        if not isinstance(self.embedded_fast, bool):
            raise DatabaseConfigError(f"{ENV_FAST} must be true or false, got {self.embedded_fast!r}.")
        t = self.start_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) \
                or not 0 < t <= MAX_START_TIMEOUT_S:
            raise DatabaseConfigError(f"{ENV_START_TIMEOUT} must be a number of seconds in (0, 86400], got {t!r}; "
                                      f"set it so, or unset it for {DEFAULT_START_TIMEOUT_S:.0f} s.")
        m = self.run_graph_cache_mb
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) \
                or not 0 <= m <= MAX_RUN_GRAPH_CACHE_MB:
            raise DatabaseConfigError(f"{ENV_RUN_GRAPH_CACHE_MB} must be a number of megabytes in [0, 2**30], got "
                                      f"{m!r}; set it so, or unset it for {DEFAULT_RUN_GRAPH_CACHE_MB:.0f} MB.")
        o = self.owner_role
        if o is not None and (not isinstance(o, str) or not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", o)):
            raise DatabaseConfigError(f"{ENV_OWNER_ROLE} must be a role name of lower-case letters, digits and _ "
                                      f"(at most 63), got {o!r}; set it so, or unset it to own the schemas as the "
                                      "role that migrates.")
        for name, env in (("migrations_dir", ENV_MIGRATIONS_DIR), ("sql_dir", ENV_SQL_DIR)):
            v = getattr(self, name)
            if v is not None and not isinstance(v, Path):
                raise DatabaseConfigError(f"{env} must be a directory path or unset, got {v!r}.")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "DatabaseSettings":
        """The settings from ``environ`` (default ``os.environ``); unset or empty variables: defaults."""
        env = os.environ if environ is None else environ
        vals: dict = {"home": Path((env.get(ENV_HOME) or DEFAULT_HOME)).expanduser().resolve(),
                      "database_url": (env.get(ENV_URL) or "").strip() or None}
        fast = (env.get(ENV_FAST) or "").strip().lower()
        if fast not in _TRUE + _FALSE:
            raise DatabaseConfigError(f"{ENV_FAST} must be one of {', '.join(_TRUE)} or {', '.join(_FALSE[1:])}, "
                                      f"got {env.get(ENV_FAST)!r}; set it to 1 only for throwaway instances.")
        vals["embedded_fast"] = fast in _TRUE
        for name, var in (("start_timeout_s", ENV_START_TIMEOUT), ("run_graph_cache_mb", ENV_RUN_GRAPH_CACHE_MB)):
            raw = (env.get(var) or "").strip()
            if raw:
                try:
                    vals[name] = float(raw)
                except ValueError:
                    vals[name] = raw  # __post_init__ names the variable and the fix
        for name, var in (("migrations_dir", ENV_MIGRATIONS_DIR), ("sql_dir", ENV_SQL_DIR)):
            if env.get(var):
                vals[name] = Path(env[var])
        if (env.get(ENV_OWNER_ROLE) or "").strip():
            vals["owner_role"] = env[ENV_OWNER_ROLE].strip()
        return cls(**vals)

    @property
    def mode(self) -> str:
        """``"external"`` if a database URL is set, else ``"embedded"``."""
        return "external" if self.database_url else "embedded"

    @property
    def schema_owner(self) -> str | None:
        """The role migration 0022 hands pm_vector's schemas to: :data:`OWNER_ROLE` in embedded mode,
        ``PM_VECTOR_OWNER_ROLE`` in external mode (None: the role that migrates keeps them)."""
        return self.owner_role if self.database_url else (self.owner_role or OWNER_ROLE)

    @property
    def pgdata_dir(self) -> Path:
        """The embedded server's data directory, ``home/pgdata``."""
        return self.home / "pgdata"


def settings() -> DatabaseSettings:
    """The database settings as the environment says now."""
    return DatabaseSettings.from_env()


def home() -> Path:
    """``PM_VECTOR_HOME`` (default ``~/.local/share/pm_vector``), absolute."""
    return settings().home


def pgdata_dir() -> Path:
    """The embedded server's data directory, ``PM_VECTOR_HOME/pgdata``."""
    return settings().pgdata_dir


def external_url() -> str | None:
    """``PM_VECTOR_DATABASE_URL`` if set (non-empty), else ``None``."""
    return settings().database_url


def mode() -> str:
    """``"external"`` if ``PM_VECTOR_DATABASE_URL`` is set, else ``"embedded"``."""
    return settings().mode


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


def with_login(url: str, user: str, password: str | None = None) -> str:
    """``url`` (``postgresql://…``) logging in as ``user`` (with ``password``): same host, port,
    database and parameters."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    cred = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
    return urlunsplit(parts._replace(netloc=f"{cred}@{host}"))


def redact(url: str) -> str:
    """The URL with its password replaced by ``***`` (for messages and status)."""
    return re.sub(r"(://[^:/@?]*:)[^@/]+@", r"\1***@", url)
