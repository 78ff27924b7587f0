"""``pm-vector db ...``, ``pm-vector embed`` and ``pm-vector bench latency|scale`` on a real embedded server.

Uses the database tests' server when it runs in the same session (tests/db/conftest.py sets
PM_VECTOR_HOME and PM_VECTOR_EMBEDDED_FAST=1), else starts a private one in a temporary
PM_VECTOR_HOME and stops it at the end.
"""

from __future__ import annotations

import json
import os
import uuid

import numpy as np
import pytest
from typer.testing import CliRunner

from pm_vector.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    from pm_vector.db import engine, server

    if os.environ.get("PM_VECTOR_EMBEDDED_FAST") == "1" and os.environ.get("PM_VECTOR_HOME") \
            and not os.environ.get("PM_VECTOR_DATABASE_URL") and server.status()["running"]:
        yield os.environ["PM_VECTOR_HOME"]  # the session's database test server
        return
    keys = ("PM_VECTOR_HOME", "PM_VECTOR_DATABASE_URL", "PM_VECTOR_EMBEDDED_FAST")
    saved = {k: os.environ.get(k) for k in keys}
    h = tmp_path_factory.mktemp("clihome")
    os.environ["PM_VECTOR_HOME"] = str(h)
    os.environ.pop("PM_VECTOR_DATABASE_URL", None)
    os.environ["PM_VECTOR_EMBEDDED_FAST"] = "1"
    try:
        server.start()
        yield str(h)
    finally:
        engine.dispose_engines()
        os.environ["PM_VECTOR_HOME"] = str(h)
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _json(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_db_status_url_start_upgrade(home):
    st = _json(["db", "status", "--json"])
    assert st["mode"] == "embedded" and st["running"] and st["schema_up_to_date"] and st["home"] == str(home)
    assert st["pgvector_version"] and st["server_version"].startswith("18")
    r = runner.invoke(app, ["db", "url"])
    assert r.exit_code == 0 and r.stdout.strip().startswith("postgresql://") and str(home) in r.stdout
    assert _json(["db", "url", "--json"])["url"] == r.stdout.strip()
    assert _json(["db", "start", "--json"])["pid"] == st["pid"]  # reuses the running server
    up = _json(["db", "upgrade", "--json"])
    assert up["from_revision"] == up["to_revision"] == up["head_revision"] == st["head_revision"]
    r = runner.invoke(app, ["db", "status"])
    assert r.exit_code == 0 and "schema_up_to_date" in r.stdout


def test_db_stop_and_status_of_a_server_that_is_not_running(tmp_path):
    empty = str(tmp_path / "nothing-here")
    r = runner.invoke(app, ["db", "stop", "--json"], env={"PM_VECTOR_HOME": empty})
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"mode": "embedded", "stopped": False, "was_running": False,
                                    "pgdata": os.path.join(empty, "pgdata"), "message": "the embedded server was not running."}
    r = runner.invoke(app, ["db", "status", "--json"], env={"PM_VECTOR_HOME": empty})
    assert r.exit_code == 0 and json.loads(r.stdout)["running"] is False


def test_help_has_examples():
    for cmd in (["db", "start"], ["db", "stop"], ["db", "status"], ["db", "url"], ["db", "upgrade"], ["embed"],
                ["bench", "latency"], ["bench", "scale"]):
        r = runner.invoke(app, [*cmd, "--help"])
        assert r.exit_code == 0 and "Example" in r.stdout, cmd


def test_embed_and_embed_new_items(home):
    import pm_vector.db as db
    from pm_vector.bench.latency import clustered
    from pm_vector.db.resolution import client_frame

    name = "cli_" + uuid.uuid4().hex[:8]
    X, y = clustered(700, 16, 10, seed=1)
    try:
        db.create_collection(name, 16, list(range(10)))
        db.ingest(name, X[:500], y[:500])
        db.register_anchor_set(name, X[500:600], y[500:600])
        db.register_anchor_set(name, X[600:680], y[600:680], role="dummy")
        r = runner.invoke(app, ["embed", name, "--new-items"])
        assert r.exit_code != 0 and "no active embedding run" in r.output
        info = _json(["embed", name, "--n-components", "4", "--n-iter", "5", "--seed", "9", "--json"])
        assert info["status"] == "succeeded" and info["is_active"] and info["n_items"] == 500
        assert info["embedding_dim"] == 4 and info["seed"] == 9 and info["params"]["n_iter"] == 5
        assert client_frame(name).n_components == 4  # the stored parameters rebuild the run's frame
        db.ingest(name, X[680:], y[680:])
        out = _json(["embed", name, "--new-items", "--json"])
        assert out == {"run_id": info["run_id"], "n_new": 20}
        r = runner.invoke(app, ["embed", name, "--new-items", "--seed", "3"])
        assert r.exit_code == 2 and "apply to a full run only" in r.output
        r = runner.invoke(app, ["embed", name, "--n-components", "3", "--n-iter", "3"])  # table output
        assert r.exit_code == 0 and "embedding run" in r.stdout
        r = runner.invoke(app, ["embed", "no_such_collection_x"])
        assert r.exit_code == 2 and "unknown collection" in r.output
    finally:
        db.drop_collection(name, missing_ok=True)


def test_bench_latency_and_scale_small(home):
    import pm_vector.db as db

    before = {c["name"] for c in db.list_collections()}
    out = _json(["bench", "latency", "--items", "1500", "--anchors", "200", "--rows", "10", "--dim", "16",
                 "--repeats", "3", "--json"])
    assert out["items"] == 1500 and out["anchors"] == 200 and out["data"] == "synthetic"
    (r,) = out["results"]
    assert r["rows"] == 10 and r["knn_statements_per_request"] == 1 and r["repeats"] == 3
    for key in ("client_p50_ms", "resolve_p50_ms", "resolve_p95_ms", "plain_p50_ms", "ratio"):
        assert r[key] > 0
    assert r["ratio"] == pytest.approx(r["resolve_p50_ms"] / r["plain_p50_ms"], rel=1e-2)
    pm = r["pm_vector"]
    assert pm["shortlist_statements_per_request"] == 1 and pm["resolve_p50_ms"] > 0 and pm["client_p50_ms"] > 0
    sc = _json(["bench", "scale", "--sizes", "600,1200", "--anchors", "100", "--dim", "16", "--json"])
    assert [x["items"] for x in sc["results"]] == [600, 1200]
    assert all(x["seconds"] > 0 and x["peak_mb"] > 0 for x in sc["results"])
    t = [x["seconds"] for x in sc["results"]]
    assert sc["time_per_doubling"] == pytest.approx(t[1] / t[0], rel=1e-2)
    assert {c["name"] for c in db.list_collections()} == before  # everything dropped
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'bench_raw_%'").fetchone()[0] == 0
    r = runner.invoke(app, ["bench", "latency", "--rows", "7", "--items", "100", "--anchors", "100"])
    assert r.exit_code == 2 and "C = 7" in r.output
    r = runner.invoke(app, ["bench", "scale", "--sizes", "1000"])
    assert r.exit_code == 2 and "two different" in r.output
