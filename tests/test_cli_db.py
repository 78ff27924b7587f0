"""``pm-vector db ...``, ``pm-vector embed`` and ``pm-vector bench latency|scale`` on a real embedded server.

On the session's embedded server (``pm_home``, tests/conftest.py), shared with tests/db and
tests/service.
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
def home(pm_home):
    """The session's embedded server (tests/conftest.py)."""
    return str(pm_home)


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


@pytest.mark.slow
def test_embed_and_embed_new_items(home):
    import pm_vector.db as db
    from pm_vector.bench.latency import clustered
    from pm_vector.db.resolve.resolution import client_frame

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
        new_ids = db.ingest(name, X[680:], y[680:])["item_ids"]
        out = _json(["embed", name, "--new-items", "--json"])
        assert out == {"run_id": info["run_id"], "n_new": 20}
        # the new items are coded with the run's published product codes
        from pm_vector.db.resolve.resolution import public_anchor
        from pm_vector.protocol.published_codes import unpack

        pinfo = public_anchor(name)[1]
        pc = unpack(pinfo["product_codes"], pinfo["class_rows"]["codes"]["digest"])
        with db.connect() as conn:
            got = dict(conn.execute(f"SELECT item_id, code FROM pm_vector.run_{info['run_id']}_codes WHERE item_id = "
                                    "ANY(%s)", [[int(v) for v in new_ids]]).fetchall())
        want = pc.encode(np.asarray(X[680:], np.float32).astype(np.float64))
        assert [bytes(got[int(v)]) for v in new_ids] == [w.tobytes() for w in want]
        r = runner.invoke(app, ["embed", name, "--new-items", "--seed", "3"])
        assert r.exit_code == 2 and "apply to a full run only" in r.output
        r = runner.invoke(app, ["embed", name, "--n-components", "3", "--n-iter", "3"])  # table output
        assert r.exit_code == 0 and "embedding run" in r.stdout
        r = runner.invoke(app, ["embed", "no_such_collection_x"])
        assert r.exit_code == 2 and "unknown collection" in r.output
    finally:
        db.drop_collection(name, missing_ok=True)


@pytest.mark.slow
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
    assert pm["prior_knn_statements_per_request"] <= 1 and r["plain_kprime_p50_ms"] > 0
    assert pm["ratio_kprime"] == pytest.approx(pm["resolve_p50_ms"] / r["plain_kprime_p50_ms"], rel=1e-2)
    # the default answer is timed: compact, k' and the code width by the public rule (C = 10, Gaussian;
    # 16 dimensions: the residual widths 16 and 32 only, no table is wider than the features)
    from pm_vector.manifold.codes import compact_answer_shape

    assert (pm["answer"], pm["shortlist"], pm["code_bytes"]) == ("compact",
                                                                 *compact_answer_shape(10, "gaussian", 1.0, (16, 32)))
    # both releases by default: the cell release (the default one) too, one statement per request
    ce = r["cells"]
    assert (ce["answer"], ce["shortlist"], ce["code_bytes"]) == ("compact",
                                                                 *compact_answer_shape(10, "cells", 1.0, (16, 32)))
    assert ce["statements_per_request"] == 1 and ce["resolve_p50_ms"] > 0
    with db.connect() as conn:  # the server's buffer cache, as measured with
        assert out["setup"]["shared_buffers"] == conn.execute("SHOW shared_buffers").fetchone()[0]
    full = _json(["bench", "latency", "--items", "1500", "--anchors", "200", "--rows", "10", "--dim", "16",
                  "--repeats", "2", "--release", "cells", "--answer", "full", "--shortlist", "24", "--json"])
    ce = full["results"][0]["cells"]
    assert (ce["answer"], ce["shortlist"], ce["code_bytes"]) == ("full", 24, None) and ce["resolve_p50_ms"] > 0
    assert full["results"][0]["pm_vector"] is None
    sc = _json(["bench", "scale", "--sizes", "600,1200", "--anchors", "100", "--dim", "16", "--json"])
    assert [x["items"] for x in sc["results"]] == [600, 1200]
    assert all(x["seconds"] > 0 and x["peak_mb"] > 0 for x in sc["results"])
    t = [x["seconds"] for x in sc["results"]]
    assert sc["time_per_doubling"] == pytest.approx(t[1] / t[0], rel=1e-2)
    # small collections: the exact graph, so its recall against exact is 1
    assert all(x["graph_method"] == "exact" and x["graph_recall"] == 1.0 for x in sc["results"])
    sc = _json(["bench", "scale", "--sizes", "600,1200", "--anchors", "100", "--dim", "16", "--graph-exact-max-items",
                "1000", "--recall-sample", "200", "--json"])
    assert [x["graph_method"] for x in sc["results"]] == ["exact", "ivf"]
    assert sc["results"][1]["graph_recall"] >= 0.95 and sc["results"][1]["recall_sample"] == 200
    big = sc["results"][1]
    assert big["graph_build"]["probe"] >= 8 and 0.0 < big["graph_build"]["sample_recall"] <= 1.0
    assert sc["results"][0]["graph_build"] == {} and all(k.endswith("_s") for k in big["stages_s"])
    assert {c["name"] for c in db.list_collections()} == before  # everything dropped
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'bench_raw_%'").fetchone()[0] == 0
    r = runner.invoke(app, ["bench", "latency", "--rows", "7", "--items", "100", "--anchors", "100"])
    assert r.exit_code == 2 and "C = 7" in r.output
    r = runner.invoke(app, ["bench", "scale", "--sizes", "1000"])
    assert r.exit_code == 2 and "two different" in r.output


def _bad_files(d):
    ok = np.abs(np.random.default_rng(0).normal(size=(6, 4))) + 0.1
    np.save(d / "ok.npy", ok)
    np.save(d / "y.npy", np.array([0, 1, 0, 1, 0, 1]))
    np.save(d / "complex.npy", ok + 1j)
    np.save(d / "str.npy", np.array([["a", "b"], ["c", "d"]]))
    np.save(d / "pickled.npy", np.array([{"x": 1}, None], dtype=object), allow_pickle=True)
    raw = (d / "ok.npy").read_bytes()
    (d / "truncated.npy").write_bytes(raw[:-17])
    (d / "garbage.npy").write_bytes(b"not a numpy file at all")
    np.save(d / "ystr.npy", np.array(["cat", "dog", "cat", "dog", "cat", "dog"]))
    nan = ok.copy()
    nan[3, 2] = np.nan
    np.save(d / "nan.npy", nan)
    return {"complex": ("complex values", "features"), "str": ("strings", "features"),
            "pickled": ("pickled", "features"), "truncated": ("truncated", "features"),
            "garbage": ("not a .npy file", "features"), "ystr": ("strings", "labels"),
            "nan": ("NaN", "features")}


def test_ingest_refuses_bad_files_clearly_and_writes_nothing(home, tmp_path):
    import pm_vector.db as db

    cases = _bad_files(tmp_path)
    name = "cli_" + uuid.uuid4().hex[:8]
    try:
        for bad, (msg, which) in cases.items():
            f = tmp_path / f"{bad}.npy"
            args = ["--features", str(f), "--labels", str(tmp_path / "y.npy")] if which == "features" else \
                ["--features", str(tmp_path / "ok.npy"), "--labels", str(f)]
            r = runner.invoke(app, ["ingest", name, *args, "--create"])
            assert r.exit_code == 2, (bad, r.output)
            assert isinstance(r.exception, SystemExit) and "Traceback" not in r.output, bad
            assert msg in " ".join(r.output.split()), (bad, r.output)
            # --create with a bad file leaves no collection behind: the retry is not blocked
            assert name not in {c["name"] for c in db.list_collections()}, bad
        out = _json(["ingest", name, "--features", str(tmp_path / "ok.npy"), "--labels", str(tmp_path / "y.npy"),
                     "--create", "--json"])
        assert out["created"] == name and out["n_rows"] == 6
        assert db.collection_info(name)["n_items"] == 6
        for bad in ("complex", "nan"):  # into an existing collection: nothing written either
            r = runner.invoke(app, ["ingest", name, "--features", str(tmp_path / f"{bad}.npy"),
                                    "--labels", str(tmp_path / "y.npy")])
            assert r.exit_code == 2 and "Traceback" not in r.output
        assert db.collection_info(name)["n_items"] == 6
    finally:
        db.drop_collection(name, missing_ok=True)


def test_anchor_ingest_with_create_that_fails_leaves_no_collection(home, tmp_path):
    import pm_vector.db as db

    name = "cli_" + uuid.uuid4().hex[:8]
    np.save(tmp_path / "A.npy", np.ones((4, 3)))
    np.save(tmp_path / "ya.npy", np.array([0, 1, 0, 1]))
    np.save(tmp_path / "Y.npy", np.ones((5, 3)))  # 5 rows, 4 labels
    r = runner.invoke(app, ["ingest", name, "--features", str(tmp_path / "Y.npy"), "--labels",
                            str(tmp_path / "ya.npy"), "--role", "anchor", "--create"])
    assert r.exit_code == 2 and "need (n, d) and (n,)" in r.output
    assert name not in {c["name"] for c in db.list_collections()}


def test_db_cleanup_drops_orphan_run_tables_and_keeps_the_active_run(home):
    import pm_vector.db as db
    from pm_vector.bench.latency import clustered

    name = "cli_" + uuid.uuid4().hex[:8]
    X, y = clustered(300, 8, 3, seed=2)
    with db.connect(autocommit=True) as conn:
        ghost = conn.execute("SELECT coalesce(max(id), 0) + 100000 FROM pm_vector.embedding_runs").fetchone()[0]
        try:
            db.create_collection(name, 8, [0, 1, 2])
            db.ingest(name, X[:250], y[:250])
            db.register_anchor_set(name, X[250:], y[250:])
            P = np.random.default_rng(1).normal(size=(8, 3))

            def embed(ax, ay, ix, iy, params, seed, progress):
                return ax.astype(np.float64) @ P, ix.astype(np.float64) @ P

            run = db.run_embedding_job(name, {"k": 3}, 1, embed_fn=embed)["run_id"]
            # tables of a run whose row is gone, and of a failed run: what a crashed job may leave
            conn.execute(f"CREATE TABLE pm_vector.run_{ghost}_items (item_id bigint)")
            conn.execute(f"CREATE TABLE pm_vector.run_{ghost}_hubs (item_id bigint)")
            out = _json(["db", "cleanup", "--json"])
            assert ghost in out["orphan_run_tables"] and run not in out["orphan_run_tables"]
            assert conn.execute("SELECT to_regclass(%s)", [f"pm_vector.run_{ghost}_items"]).fetchone()[0] is None
            assert conn.execute("SELECT to_regclass(%s)", [f"pm_vector.run_{run}_items"]).fetchone()[0] is not None
            assert len(db.knn(name, np.ones(3), 5)["item_ids"]) == 5
            assert _json(["db", "cleanup", "--json"])["orphan_run_tables"] == []
        finally:
            conn.execute(f"DROP TABLE IF EXISTS pm_vector.run_{ghost}_items, pm_vector.run_{ghost}_hubs")
            db.drop_collection(name, missing_ok=True)


def test_prune_requests_and_cleanup_keep_the_log_within_retention(home, monkeypatch):
    import datetime as dt

    import pm_vector.db as db

    name, gone = "cli_" + uuid.uuid4().hex[:8], "cli_" + uuid.uuid4().hex[:8]
    db.create_collection(name, 3, [0])
    db.create_collection(gone, 3, [0])
    now = dt.datetime.now(dt.timezone.utc)
    try:
        old = db.log_request(name, {"r": 1}, received_at=now - dt.timedelta(days=40))
        mid = db.log_request(name, {"r": 2}, received_at=now - dt.timedelta(days=12))
        new = db.log_request(name, {"r": 3})
        orphan = db.log_request(gone, {"r": 4})
        db.drop_collection(gone)

        def present():
            with db.connect() as c:
                return {r[0] for r in c.execute("SELECT id FROM pm_vector.request_log WHERE id = ANY(%s)",
                                                [[old, mid, new, orphan]]).fetchall()}

        monkeypatch.setenv("PM_VECTOR_SERVICE_REQUEST_LOG_RETENTION_DAYS", "30")
        out = _json(["db", "cleanup", "--json"])
        assert out["retention_days"] == 30 and out["requests_pruned"] >= 2
        assert present() == {mid, new}
        out = _json(["db", "prune-requests", "--older-than", "10", "--json"])
        assert out["deleted"] >= 1 and out["older_than_days"] == 10
        assert present() == {new}
        r = runner.invoke(app, ["db", "prune-requests", "--older-than", "-1"])
        assert r.exit_code == 2 and present() == {new}
    finally:
        db.drop_collection(name, missing_ok=True)
        db.drop_collection(gone, missing_ok=True)
