"""The embedded server's life cycle, concurrent starts, external URLs and the pgvector checks."""

from __future__ import annotations

import json
import os
import uuid

import psycopg
import pytest
from psycopg import sql

from pm_vector.db import postgres
from pm_vector.db.errors import (
    DatabaseConfigError,
    PgvectorMissingError,
    PgvectorVersionError,
    SchemaNotReadyError,
)


def _admin_url() -> str:
    """URL of the session server's 'postgres' database (superuser)."""
    url = postgres.admin_url()
    return url.replace(f"/{postgres.EMBEDDED_DATABASE}?", "/postgres?")


def test_status_and_url(db, pm_home):
    st = db.status()
    assert st["mode"] == "embedded" and st["running"] and st["error"] is None
    assert st["home"] == str(pm_home) and st["pgdata"] == str(pm_home / "pgdata")
    assert st["server_version"].startswith("18") and st["schema_up_to_date"]
    assert tuple(int(p) for p in st["pgvector_version"].split(".")[:2]) >= (0, 7)
    url = db.database_url()
    assert url.startswith("postgresql://") and "host=" in url and url.split("?")[0].endswith("/pm_vector")
    with psycopg.connect(url) as c:
        assert c.execute("SELECT current_database()").fetchone()[0] == "pm_vector"
    assert (pm_home / "server.lock").exists()


def test_stop_then_first_use_restarts(db):
    pid = db.status()["pid"]
    out = db.stop()
    assert out["stopped"] and out["was_running"] and out["pid"] == pid
    st = db.status()
    assert st["running"] is False and st["pid"] is None
    assert db.stop()["was_running"] is False
    # first use starts it again (same data)
    assert db.list_collections() is not None
    st = db.status()
    assert st["running"] and st["pid"] != pid and st["schema_up_to_date"]


def test_status_of_an_unused_home_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PM_VECTOR_HOME", str(tmp_path / "unused"))
    st = postgres.status()
    assert st["running"] is False and st["url"] is None and st["head_revision"]
    assert not (tmp_path / "unused" / "pgdata").exists()


def test_concurrent_starts_share_one_server(pm_home, tmp_path, monkeypatch):
    """Several processes starting a fresh home at once: one initdb, one server, one migration."""
    import subprocess
    import sys

    home = tmp_path / "h"
    code = ("import json, pm_vector.db as db; s = db.start(); "
            "print(json.dumps({'pid': s['pid'], 'url': db.database_url(), 'ok': s['schema_up_to_date']}))")
    env = dict(os.environ, PM_VECTOR_HOME=str(home))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(3)]
    outs = []
    for p in procs:
        o, e = p.communicate(timeout=120)
        assert p.returncode == 0, e
        outs.append(json.loads(o.strip().splitlines()[-1]))
    assert len({o["pid"] for o in outs}) == 1 and len({o["url"] for o in outs}) == 1
    assert all(o["ok"] for o in outs)
    with psycopg.connect(outs[0]["url"]) as c:
        assert c.execute("SELECT count(*) FROM pm_vector.alembic_version").fetchone()[0] == 1
    # the server outlives the processes that started it; stop it
    monkeypatch.setenv("PM_VECTOR_HOME", str(home))
    assert postgres.status()["running"]
    assert postgres.stop()["stopped"]


@pytest.fixture
def scratch_db(db):
    """A new, empty database on the session server; its URL. Dropped afterwards."""
    name = "scratch_" + uuid.uuid4().hex[:8]
    admin = _admin_url()
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = admin.replace("/postgres?", f"/{name}?")
    yield url
    from pm_vector.db.postgres import dispose_engines

    dispose_engines()
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_external_url_mode(db, scratch_db, monkeypatch):
    monkeypatch.setenv("PM_VECTOR_DATABASE_URL", scratch_db.replace("postgresql://", "postgresql+psycopg://"))
    assert db.database_url() == scratch_db
    st = db.status()
    assert st["mode"] == "external" and st["running"] and st["schema_revision"] is None
    assert st["pgdata"] is None and not st["schema_up_to_date"]
    # external databases are never migrated behind the user's back
    with pytest.raises(SchemaNotReadyError, match="pm-vector db upgrade"):
        db.list_collections()
    out = db.upgrade()
    assert out["mode"] == "external" and out["from_revision"] is None and out["to_revision"] == out["head_revision"]
    assert db.upgrade()["from_revision"] == out["head_revision"]  # idempotent
    assert db.list_collections() == []
    db.create_collection("ext_only", 3, [0])
    assert [c["name"] for c in db.list_collections()] == ["ext_only"]
    assert db.stop()["stopped"] is False and db.start()["mode"] == "external"
    monkeypatch.delenv("PM_VECTOR_DATABASE_URL")
    assert "ext_only" not in [c["name"] for c in db.list_collections()]  # the embedded database


def test_extension_that_cannot_be_created(db, scratch_db, monkeypatch):
    """A role that may not create the (untrusted) vector extension gets an error naming the fix."""
    role = "pmv_" + uuid.uuid4().hex[:8]
    admin = _admin_url()
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER").format(sql.Identifier(role)))
    try:
        url = scratch_db.replace("postgresql://postgres:@", f"postgresql://{role}@")
        assert url != scratch_db
        monkeypatch.setenv("PM_VECTOR_DATABASE_URL", url)
        with pytest.raises(PgvectorMissingError, match="CREATE EXTENSION vector") as ei:
            db.start()
        assert "superuser" in str(ei.value)
        with pytest.raises(PgvectorMissingError):
            db.upgrade()
        with psycopg.connect(scratch_db) as c:
            assert c.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'").fetchone()[0] == 0
    finally:
        monkeypatch.delenv("PM_VECTOR_DATABASE_URL", raising=False)
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize("installed, available, exc, match", [
    ("0.6.2", "0.8.6", PgvectorVersionError, "ALTER EXTENSION vector UPDATE"),
    ("0.6.2", "0.6.2", PgvectorVersionError, "upgrade the pgvector package"),
    (None, None, PgvectorMissingError, "not available on the PostgreSQL server"),
    (None, "0.8.0", PgvectorMissingError, "superuser to run: CREATE EXTENSION vector"),
])
def test_pgvector_version_messages(installed, available, exc, match):
    with pytest.raises(exc, match=match):
        postgres.check_pgvector_version(installed, available)


@pytest.mark.parametrize("v", ["0.7.0", "0.8.6", "0.10.1", "1.0.0"])
def test_recent_pgvector_accepted(v):
    postgres.check_pgvector_version(v, v)


def test_bad_external_urls(db, monkeypatch, tmp_path):
    monkeypatch.setenv("PM_VECTOR_DATABASE_URL", "mysql://u:secret@h/db")
    with pytest.raises(DatabaseConfigError, match="not a PostgreSQL URL") as ei:
        db.database_url()
    assert "secret" not in str(ei.value)
    monkeypatch.setenv("PM_VECTOR_DATABASE_URL", f"postgresql://u:secret@/db?host={tmp_path}/nowhere")
    with pytest.raises(DatabaseConfigError, match="cannot connect") as ei:
        db.list_collections()
    assert "secret" not in str(ei.value)
    st = db.status()
    assert st["running"] is False and st["error"] and "secret" not in st["url"]


def test_url_helpers():
    assert postgres.libpq_url("postgresql+psycopg://a:b@h:1/d") == "postgresql://a:b@h:1/d"
    assert postgres.libpq_url("postgres://a@h/d") == "postgresql://a@h/d"
    assert postgres.sqlalchemy_url("postgresql://a@h/d") == "postgresql+psycopg://a@h/d"
    assert postgres.redact("postgresql://user:pa%40ss@host/db") == "postgresql://user:***@host/db"
    assert postgres.redact("postgresql://postgres:@/db?host=/x") == "postgresql://postgres:@/db?host=/x"


def test_shared_buffers_are_a_quarter_of_memory_within_bounds(db):
    """A new embedded data directory gets shared_buffers by the rule (PostgreSQL's 128 MB default
    holds little of a large collection), and the rule clamps to [128 MB, 4 GB]."""
    from pm_vector.db.postgres.embedded import SHARED_BUFFERS_MAX_MB, SHARED_BUFFERS_MIN_MB, shared_buffers_mb

    assert shared_buffers_mb(0) == SHARED_BUFFERS_MIN_MB == 128
    assert shared_buffers_mb(256 * 2**20) == 128 and shared_buffers_mb(4 * 2**30) == 1024
    assert shared_buffers_mb(24 * 2**30) == SHARED_BUFFERS_MAX_MB == 4096 == shared_buffers_mb(64 * 2**30)
    with db.connect() as c:
        blocks, unit = c.execute("SELECT setting::bigint, unit FROM pg_settings WHERE name = 'shared_buffers'").fetchone()
    assert unit == "8kB" and blocks * 8 // 1024 == shared_buffers_mb()
