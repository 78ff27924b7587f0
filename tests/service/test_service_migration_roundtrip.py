"""A schema round trip (issue 25, item 11): after ``db upgrade`` down to 0012 and back up, the
active run's cells table is gone. Cell resolves then answer 503 naming the fix (a new embedding
job), never 500; the upgrade says which collections need one; after the job they answer 200.

On a database of its own (the session's server, a fresh database): the downgrade drops every
run's cells."""

from __future__ import annotations

import uuid

import pytest

from pm_vector.client.http import Client
from pm_vector.client.budget import PrivacyBudget


@pytest.fixture
def own_database(pm_home, monkeypatch):
    import psycopg
    from psycopg import sql

    from pm_vector.db import postgres

    name = "rt_" + uuid.uuid4().hex[:8]
    admin = postgres.admin_url().replace(f"/{postgres.EMBEDDED_DATABASE}?", "/postgres?")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = admin.replace("/postgres?", f"/{name}?")
    with psycopg.connect(url, autocommit=True) as c:
        postgres.ensure_pgvector(c)
    monkeypatch.setenv("PM_VECTOR_DATABASE_URL", url)
    postgres.dispose_engines()
    try:
        yield url
    finally:
        monkeypatch.delenv("PM_VECTOR_DATABASE_URL")
        postgres.dispose_engines()
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_cells_after_a_downgrade_round_trip_answer_503_naming_the_job(own_database, svc_split, tmp_path):
    from alembic import command

    from pm_vector import db
    from pm_vector.bench.demo import prepare_collection
    from pm_vector.db.postgres.migrate import alembic_config, head_revision, upgrade_to_head
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    upgrade_to_head(own_database)
    name = "rt_cells"
    prepare_collection(name, svc_split)
    db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
    Xq, yq = svc_split.query
    st = ServiceSettings(auth=False, pool_max=2, request_log_retention_days=0, max_rows=2000, max_dim=64)
    with ServiceThread(st) as svc:
        with Client(svc.url, None, budget=PrivacyBudget(tmp_path / "l.json", default_epsilon=1000.0)) as c:
            req, _ = c.build_request(name, Xq[0], int(yq[0]), epsilon=2.0, shortlist=16, release="cells")
            assert len(c.resolve(name, req)["rows"]) == 10

        command.downgrade(alembic_config(own_database), "0012_key_changes")
        out = upgrade_to_head(own_database)
        assert out["to_revision"] == head_revision() and out["needs_new_job"] == [name]
        assert f"pm-vector embed {name}" in out["note"]

        import httpx

        r = httpx.post(f"{svc.url}/collections/{name}/resolve", json={"request": req.to_dict(), "k": 8}, timeout=60)
        assert r.status_code == 503, (r.status_code, r.text)
        assert r.json()["error"] == "cells_unavailable" and "embedding job" in r.json()["message"]
        assert "downgrade" in r.json()["message"]

        db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)  # the fix
        assert "needs_new_job" not in upgrade_to_head(own_database)
        with Client(svc.url, None, budget=PrivacyBudget(tmp_path / "l2.json", default_epsilon=1000.0)) as c:
            req, _ = c.build_request(name, Xq[0], int(yq[0]), epsilon=2.0, shortlist=16, release="cells")
            assert len(c.resolve(name, req)["rows"]) == 10
