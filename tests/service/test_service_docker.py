"""docker/: no Docker engine runs here, so validate what can be validated -- the compose file parses and
wires db -> migrate -> api, and everything the Dockerfile copies or runs exists."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


@pytest.fixture(scope="module")
def compose():
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_services_env_ports_depends_on(compose):
    s = compose["services"]
    assert set(s) == {"db", "migrate", "api"}
    assert s["db"]["image"].startswith("pgvector/pgvector:pg")
    assert "pg_isready" in " ".join(s["db"]["healthcheck"]["test"])
    db_env = s["db"]["environment"]
    # the owner role the image's init script makes (no superuser); the api logs in as it
    assert "./initdb:/docker-entrypoint-initdb.d:ro" in s["db"]["volumes"]
    init = (DOCKER / "initdb" / "10-pm-vector-owner.sql").read_text()
    owner = re.search(r"CREATE ROLE (\w+) LOGIN PASSWORD '([^']+)'\s+NOSUPERUSER NOCREATEDB NOCREATEROLE", init)
    assert owner is not None
    assert s["migrate"]["environment"]["PM_VECTOR_OWNER_ROLE"] == owner.group(1)
    logins = {"migrate": (db_env["POSTGRES_USER"], db_env["POSTGRES_PASSWORD"]), "api": owner.groups()}
    for name in ("migrate", "api"):
        svc = s[name]
        assert (ROOT / svc["build"]["context"].replace("..", ".")).resolve() == ROOT
        assert (DOCKER.parent / svc["build"]["dockerfile"]).is_file()
        url = urlparse(svc["environment"]["PM_VECTOR_DATABASE_URL"])
        assert url.scheme == "postgresql" and url.hostname == "db" and url.port == 5432
        assert (url.username, url.password) == logins[name]
        assert url.path.lstrip("/") == db_env["POSTGRES_DB"]
        assert svc["depends_on"]["db"]["condition"] == "service_healthy"
    assert s["migrate"]["command"] == ["pm-vector", "db", "upgrade"]
    assert s["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert s["api"]["command"][:2] == ["pm-vector", "serve"] and "0.0.0.0" in s["api"]["command"]
    assert s["api"]["ports"] == ["127.0.0.1:8000:8000"]
    from pm_vector.service.settings import ServiceSettings
    import os

    env = {k: v for k, v in s["api"]["environment"].items() if k.startswith("PM_VECTOR_SERVICE_")}
    saved = {k: os.environ.get(k) for k in env}
    try:
        os.environ.update(env)
        st = ServiceSettings.from_env()  # the compose settings are valid settings
        assert st.max_rows == 5000 and st.pool_max == 10
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    assert "pgdata" in compose["volumes"]


def test_dockerfile_paths_and_command_exist():
    text = (DOCKER / "Dockerfile").read_text()
    copies = re.findall(r"^COPY\s+(.+?)\s+\S+\s*$", text, flags=re.M)
    assert copies
    for line in copies:
        for src in line.split():
            assert (ROOT / src).exists(), f"Dockerfile copies {src}, which is not in the repository"
    env = dict(re.findall(r"(PM_VECTOR_\w+)=(\S+)", text))
    assert env["PM_VECTOR_MIGRATIONS_DIR"] == "/app/migrations" and env["PM_VECTOR_SQL_DIR"] == "/app/sql"
    assert (ROOT / "migrations" / "env.py").is_file() and list((ROOT / "sql").glob("*.sql"))
    cmd = re.search(r"^CMD\s+(\[.*\])\s*$", text, flags=re.M).group(1)
    import json

    assert json.loads(cmd)[:2] == ["pm-vector", "serve"]
    assert "EXPOSE 8000" in text and "/health" in text
    # what the image runs exists in this code: the serve command and the migration entry point
    from pm_vector.cli.service import serve  # noqa: F401
    from pm_vector.db import upgrade  # noqa: F401
