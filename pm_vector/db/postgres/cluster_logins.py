"""The local cluster's logins: who connects to its nodes, with which password (issue 35, build 1).

Every node of ``pm-vector db start --shards N`` (:mod:`pm_vector.db.postgres.cluster`) listens on
127.0.0.1 only and asks every connection for a password (``scram-sha-256``, :func:`hba`): no role
logs in by trust, the superuser included. These roles log in:

- :data:`~pm_vector.db.postgres.config.OWNER_ROLE` (``pm_vector_owner``: LOGIN NOSUPERUSER
  NOCREATEDB NOCREATEROLE NOBYPASSRLS NOREPLICATION) on every node: it owns pm_vector's schemas on
  the coordinator and the ``pm_vector`` database and schema on the shards; the service, the jobs,
  the sync and the CLI log in as it, and the coordinator reaches the shards as it (the foreign
  servers' user mappings are the owner's, with its password: ``postgres_fdw`` and ``dblink`` let a
  non-superuser connect only with a password the shard asked for);
- on every shard, :data:`~pm_vector.db.postgres.privileges.SHARD_QUERY_ROLE` (``pm_vector_query``,
  LOGIN, no other attribute): what the coordinator's user mappings of the query role and of query
  keys' login role log in as (migration 0028), so a query key's sharded answer reads the shards
  as a role that may read only the run tables such an answer reads there (:func:`shard_query_login`;
  the grants: :func:`pm_vector.db.runs.kinds.grant_answer_tables`);
- the superuser ``postgres``, for what must run as one: ``initdb``, the migrations (``CREATE
  EXTENSION``, the roles), ``CREATE DATABASE``, the shards' registration (``postgres_fdw`` and
  ``dblink`` are untrusted extensions) and the replicas' ``pg_basebackup``.

Their passwords are made once per cluster by :func:`passwords` (``secrets.token_urlsafe``) and kept
in ``PM_VECTOR_HOME/cluster/logins.json``, mode 0600, never printed or logged: the roles get them as
SCRAM verifiers computed on the client (:func:`set_password`), so not even the statement that sets
one carries it. URLs that carry a password are redacted wherever they are shown
(:func:`pm_vector.db.postgres.cluster.status`). Replicas copy ``pg_hba.conf`` and the roles from the
coordinator.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from psycopg import sql

from ..errors import DatabaseConfigError
from .config import OWNER_ROLE
from .privileges import SHARD_QUERY_ROLE, SHARD_QUERY_SCHEMAS

SUPERUSER = "postgres"
LOGINS_FILE = "logins.json"
#: pg_hba.conf of every node: TCP on loopback, a password for every role (no Unix socket: ``-k ''``)
HBA = ("# pm_vector local cluster (pm_vector.db.postgres.cluster_logins): loopback only, every role by password\n"
       "host all all 127.0.0.1/32 scram-sha-256\n"
       f"host replication {SUPERUSER} 127.0.0.1/32 scram-sha-256\n")
#: the roles that log in, each with its password in logins.json
ROLES = (SUPERUSER, OWNER_ROLE, SHARD_QUERY_ROLE)
#: the owner's attributes on every node (the same as migration 0022's)
OWNER_ATTRIBUTES = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS NOREPLICATION INHERIT"
#: the shards' query login: it logs in and reads what it was granted, nothing else
SHARD_QUERY_ATTRIBUTES = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS NOREPLICATION NOINHERIT"


def passwords(directory: Path) -> dict[str, str]:
    """``{role: password}`` of the cluster in ``directory``: read, or made on first use (a CSPRNG,
    32 bytes each) and written with mode 0600 (created exclusively: two processes agree on one)."""
    f = directory / LOGINS_FILE
    if not f.exists():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = _written(directory, {role: secrets.token_urlsafe(32) for role in ROLES})
        try:
            os.link(tmp, f)  # fails if another process wrote it first: theirs is kept
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    data = json.loads(f.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(isinstance(data.get(r), str) and data[r] for r in (SUPERUSER, OWNER_ROLE)):
        raise DatabaseConfigError(f"{f} does not hold the cluster's logins; stop the cluster and delete "
                                  f"{directory} to make a new one.")
    if not (isinstance(data.get(SHARD_QUERY_ROLE), str) and data[SHARD_QUERY_ROLE]):
        # a cluster made before the shards' query login: its password added, the file replaced
        # (the cluster's next start, under its lock, is the first to read it and sets it on the shards)
        data[SHARD_QUERY_ROLE] = secrets.token_urlsafe(32)
        os.replace(_written(directory, data), f)
    return data


def _written(directory: Path, data: dict[str, str]) -> Path:
    """``data`` in a new file of ``directory`` (mode 0600, created exclusively); its path."""
    tmp = directory / f".{LOGINS_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(data, out)
    return tmp


def set_password(conn, role: str, password: str) -> None:
    """``ALTER ROLE role PASSWORD`` with a SCRAM verifier computed here (libpq's
    ``PQencryptPasswordConn``): the password itself never reaches the server or its log."""
    verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256").decode()
    conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(verifier)))


def secure_node(conn, pgdata: Path, pw: dict[str, str]) -> None:
    """On a primary node (``conn``: its superuser, autocommit): the owner role made (or brought back
    to no superuser), both roles' passwords set, ``pg_hba.conf`` written (:data:`HBA`) and reloaded.
    Idempotent: every start runs it."""
    owner = sql.Identifier(OWNER_ROLE)
    verb = "ALTER" if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [OWNER_ROLE]).fetchone() else "CREATE"
    conn.execute(sql.SQL("{} ROLE {} {}").format(sql.SQL(verb), owner, sql.SQL(OWNER_ATTRIBUTES)))
    set_password(conn, OWNER_ROLE, pw[OWNER_ROLE])
    set_password(conn, SUPERUSER, pw[SUPERUSER])
    hba = pgdata / "pg_hba.conf"
    if hba.read_text(encoding="utf-8") != HBA:
        with open(hba, "w", encoding="utf-8") as f:  # (truncated in place: its owner and mode stay)
            f.write(HBA)
        conn.execute("SELECT pg_reload_conf()")


def own_shard_database(conn, database: str) -> None:
    """On a shard (``conn``: its superuser, in ``database``): the database and its schema
    ``pm_vector`` belong to the owner, which creates the run tables there through ``dblink``; the
    tables a superuser made there before (a cluster older than these logins) are handed to it."""
    owner = sql.Identifier(OWNER_ROLE)
    conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(database), owner))
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS pm_vector AUTHORIZATION {}").format(owner))
    conn.execute(sql.SQL("ALTER SCHEMA pm_vector OWNER TO {}").format(owner))
    for (name,) in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'pm_vector' AND c.relkind IN ('r', 'p') AND c.relowner <> %s::regrole",
            [OWNER_ROLE]).fetchall():
        conn.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.Identifier("pm_vector", name), owner))
    for sig in [r[0] for r in conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'pm_vector' AND p.proowner <> %s::regrole", [OWNER_ROLE]).fetchall()]:
        conn.execute(sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(sql.SQL(sig), owner))


def shard_query_login(conn, database: str, password: str) -> None:
    """On a shard (``conn``: its superuser, in ``database``): the query login
    (:data:`~pm_vector.db.postgres.privileges.SHARD_QUERY_ROLE`) made or brought back to
    :data:`SHARD_QUERY_ATTRIBUTES`, its password set, and USAGE on the schema ``pm_vector``
    (:data:`~pm_vector.db.postgres.privileges.SHARD_QUERY_SCHEMAS`). Its SELECTs are granted per
    run where the job switches it (:func:`pm_vector.db.runs.kinds.grant_answer_tables`). Idempotent."""
    role = sql.Identifier(SHARD_QUERY_ROLE)
    verb = "ALTER" if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                                   [SHARD_QUERY_ROLE]).fetchone() else "CREATE"
    conn.execute(sql.SQL("{} ROLE {} {}").format(sql.SQL(verb), role, sql.SQL(SHARD_QUERY_ATTRIBUTES)))
    set_password(conn, SHARD_QUERY_ROLE, password)
    conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), role))
    for schema, privs in SHARD_QUERY_SCHEMAS.items():
        conn.execute(sql.SQL("GRANT {} ON SCHEMA {} TO {}").format(
            sql.SQL(", ").join(map(sql.SQL, privs)), sql.Identifier(schema), role))
