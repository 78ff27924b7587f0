"""docker/compose.cluster.yaml: no Docker engine runs here, so validate what can be validated -- the
topology matches `pm-vector db start --shards 2 --replicas 1`, the wiring (health conditions, URLs
matching credentials, the shard registration the migrate service runs), who logs in as whom (the api
and the shards' user mappings as the owner role, no superuser; only the migrate step as the
superuser), the shell scripts parse and the init SQL runs on a real node of the local cluster."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
OWNER_SQL = DOCKER / "initdb" / "10-pm-vector-owner.sql"
SHARD_SQL = DOCKER / "cluster" / "20-pm-vector-shard.sql"


def _shard_query_login() -> tuple[str, str]:
    """(role, password) the shard's init script makes for query keys, no superuser."""
    m = re.search(r"CREATE ROLE (\w+) LOGIN PASSWORD '([^']+)'\s+NOSUPERUSER NOCREATEDB NOCREATEROLE",
                  SHARD_SQL.read_text())
    assert m is not None
    return m.group(1), m.group(2)


def _owner_login() -> tuple[str, str]:
    """(role, password) the init script makes, no superuser."""
    m = re.search(r"CREATE ROLE (\w+) LOGIN PASSWORD '([^']+)'\s+NOSUPERUSER NOCREATEDB NOCREATEROLE",
                  OWNER_SQL.read_text())
    assert m is not None
    return m.group(1), m.group(2)


@pytest.fixture(scope="module")
def compose():
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((DOCKER / "compose.cluster.yaml").read_text())


def test_cluster_topology_and_wiring(compose):
    s = compose["services"]
    assert set(s) == {"coordinator", "shard0", "shard1", "replica0", "migrate", "api"}
    creds = s["coordinator"]["environment"]
    for node in ("coordinator", "shard0", "shard1", "replica0"):
        assert s[node]["image"].startswith("pgvector/pgvector:pg")
        assert "pg_isready" in " ".join(s[node]["healthcheck"]["test"])
        assert s[node]["environment"]["POSTGRES_PASSWORD"] == creds["POSTGRES_PASSWORD"]
        assert any(v.endswith(":/var/lib/postgresql/data") for v in s[node]["volumes"])
    assert "wal_level=replica" in s["coordinator"]["command"]
    assert s["replica0"]["environment"]["PRIMARY_HOST"] == "coordinator"
    assert s["replica0"]["depends_on"]["coordinator"]["condition"] == "service_healthy"

    superuser, owner = (creds["POSTGRES_USER"], creds["POSTGRES_PASSWORD"]), _owner_login()

    def check(url, host, login):
        u = urlparse(url)
        assert (u.scheme, u.hostname, u.port) == ("postgresql", host, 5432)
        assert (u.username, u.password, u.path.lstrip("/")) == (*login, creds["POSTGRES_DB"])

    # the api (pool, sync, jobs) logs in as the owner on the coordinator and the replica
    check(s["api"]["environment"]["PM_VECTOR_DATABASE_URL"], "coordinator", owner)
    check(s["api"]["environment"]["PM_VECTOR_SERVICE_READ_URLS"], "replica0", owner)
    # the migrate step as the superuser, handing the schemas to the owner
    check(s["migrate"]["environment"]["PM_VECTOR_DATABASE_URL"], "coordinator", superuser)
    assert s["migrate"]["environment"]["PM_VECTOR_OWNER_ROLE"] == owner[0]
    assert "PM_VECTOR_OWNER_ROLE" not in s["api"]["environment"]
    migrate = " ".join(s["migrate"]["command"])
    assert "pm-vector db upgrade" in migrate
    adds = re.findall(r"pm-vector db shard-add (\w+) (\S+) --query-url (\S+)", migrate)
    assert [a[0] for a in adds] == ["shard0", "shard1"]
    for name, url, query_url in adds:
        check(url, name, owner)  # the user mapping logs in to the shard as the owner, with its password
        # query keys reach the shard as its query login, which the shard's init script makes
        check(query_url, name, _shard_query_login())
        assert s["migrate"]["depends_on"][name]["condition"] == "service_healthy"
    # every primary makes the owner role when its data directory is made; the shards give it their database
    init = "/docker-entrypoint-initdb.d/"
    for node in ("coordinator", "shard0", "shard1"):
        assert f"./initdb/10-pm-vector-owner.sql:{init}10-pm-vector-owner.sql:ro" in s[node]["volumes"]
    for node in ("shard0", "shard1"):
        assert f"./cluster/20-pm-vector-shard.sql:{init}20-pm-vector-shard.sql:ro" in s[node]["volumes"]
    assert s["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert s["api"]["depends_on"]["replica0"]["condition"] == "service_healthy"
    assert set(compose["volumes"]) == {"coordinator", "shard0", "shard1", "replica0"}
    # the command the migrate service runs exists here, with these arguments
    import click
    import typer

    from pm_vector.cli import app

    root = typer.main.get_command(app)  # (a lazy group: a command's module is imported when it is asked for)
    db = root.get_command(click.Context(root), "db")
    cmd = db.get_command(click.Context(db), "shard-add")
    assert [p.name for p in cmd.params if p.param_type_name == "argument"] == ["name", "url"]
    assert "--query-url" in [o for p in cmd.params if p.param_type_name == "option" for o in p.opts]


def test_cluster_scripts_exist_and_parse(compose):
    mounted = [v.split(":")[0] for svc in compose["services"].values() for v in svc.get("volumes", [])
               if v.startswith("./")]
    assert mounted
    for rel in mounted:
        path = (DOCKER / rel).resolve()
        assert path.is_file(), f"compose mounts {rel}, which is not in the repository"
        if path.suffix == ".sh" and shutil.which("sh"):
            assert subprocess.run(["sh", "-n", str(path)]).returncode == 0
    text = (DOCKER / "cluster" / "replica-entrypoint.sh").read_text()
    assert "pg_basebackup" in text and " -R" in text and "-X stream" in text


def test_init_sql_runs_on_a_node(local_cluster):
    """The compose nodes' init SQL, run as the image would (the superuser, in POSTGRES_DB) on a node
    of the local cluster: the owner role's script in a transaction rolled back (under another
    name: the node has the role), the shard's script in a fresh database, which it gives to the
    owner with the schema pm_vector and pgvector."""
    import psycopg
    from psycopg import sql

    shard = next(n for n in local_cluster.topology()["nodes"] if n["name"] == "shard0")
    role, _ = _owner_login()
    with psycopg.connect(local_cluster.admin_node_url(shard)) as c:  # a transaction, rolled back
        c.execute(OWNER_SQL.read_text().replace(role, "pm_vector_owner_initdb_check"))
        assert c.execute("SELECT rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, rolbypassrls, rolreplication "
                         "FROM pg_roles WHERE rolname = 'pm_vector_owner_initdb_check'").fetchone() == (
            True, False, False, False, False, False)
        c.rollback()
    db = "pm_initdb_check"
    with psycopg.connect(local_cluster.admin_node_url(shard, "postgres"), autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    try:
        with psycopg.connect(local_cluster.admin_node_url(shard, db), autocommit=True) as c:
            c.execute(SHARD_SQL.read_text())
            assert c.execute("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s",
                             [db]).fetchone()[0] == role
            assert c.execute("SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'pm_vector'"
                             ).fetchone()[0] == role
            assert c.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is not None
            # the shard's query login: no superuser, may use the schema and reach the database, owns nothing
            assert c.execute("SELECT rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, rolbypassrls, rolreplication, "
                             "has_schema_privilege(rolname, 'pm_vector', 'USAGE'), "
                             "has_schema_privilege(rolname, 'pm_vector', 'CREATE'), "
                             "has_database_privilege(rolname, current_database(), 'CONNECT') "
                             "FROM pg_roles WHERE rolname = %s", [_shard_query_login()[0]]).fetchone() == (
                True, False, False, False, False, False, True, False, True)
        # and the owner may make there what the coordinator's dblink makes: a table of the schema
        with psycopg.connect(local_cluster.node_url(shard, db), autocommit=True) as c:
            c.execute("CREATE TABLE pm_vector.t (v vector(2))")
    finally:
        with psycopg.connect(local_cluster.admin_node_url(shard, "postgres"), autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
