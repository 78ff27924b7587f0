"""docker/compose.cluster.yaml: no Docker engine runs here, so validate what can be validated -- the
topology matches `pm-vector db start --shards 2 --replicas 1`, the wiring (health conditions, URLs
matching credentials, the shard registration the migrate service runs) and the scripts parse."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


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

    def check(url, host):
        u = urlparse(url)
        assert (u.scheme, u.hostname, u.port) == ("postgresql", host, 5432)
        assert (u.username, u.password, u.path.lstrip("/")) == (creds["POSTGRES_USER"], creds["POSTGRES_PASSWORD"],
                                                                 creds["POSTGRES_DB"])

    for name in ("migrate", "api"):
        env = s[name]["environment"]
        check(env["PM_VECTOR_DATABASE_URL"], "coordinator")
        check(env["PM_VECTOR_SERVICE_READ_URLS"], "replica0")
    migrate = " ".join(s["migrate"]["command"])
    assert "pm-vector db upgrade" in migrate
    adds = re.findall(r"pm-vector db shard-add (\w+) (\S+)", migrate)
    assert [a[0] for a in adds] == ["shard0", "shard1"]
    for name, url in adds:
        check(url, name)
        assert s["migrate"]["depends_on"][name]["condition"] == "service_healthy"
    assert s["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert s["api"]["depends_on"]["replica0"]["condition"] == "service_healthy"
    assert set(compose["volumes"]) == {"coordinator", "shard0", "shard1", "replica0"}
    # the command the migrate service runs exists here, with these arguments
    import typer

    from pm_vector.cli import app

    cmd = typer.main.get_command(app).commands["db"].commands["shard-add"]
    assert [p.name for p in cmd.params if p.param_type_name == "argument"] == ["name", "url"]


def test_cluster_scripts_exist_and_parse(compose):
    mounted = [v.split(":")[0] for svc in compose["services"].values() for v in svc.get("volumes", [])
               if v.startswith("./")]
    assert mounted
    for rel in mounted:
        path = (DOCKER / rel).resolve()
        assert path.is_file(), f"compose mounts {rel}, which is not in the repository"
        if shutil.which("sh"):
            assert subprocess.run(["sh", "-n", str(path)]).returncode == 0
    text = (DOCKER / "cluster" / "replica-entrypoint.sh").read_text()
    assert "pg_basebackup" in text and " -R" in text and "-X stream" in text
