"""Kill safety: a job or an ingest SIGKILLed midway never disturbs the active run, and is cleaned up."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from dbtest_helpers import data, make_embed_fn, projection, start_child, wait_ready

JOB_CHILD = """
import sys, time, numpy as np
import pm_vector.db as db

name, stage = sys.argv[1], sys.argv[2]

def embed(ax, ay, ix, iy, params, seed, progress):
    P = np.random.default_rng(seed).normal(size=(ax.shape[1], 3))
    return ax.astype(np.float64) @ P, ix.astype(np.float64) @ P

def progress(s, done, total):
    if s == stage and (s != "write" or done > 0):
        print("READY", done, total, flush=True)
        time.sleep(300)

db.run_embedding_job(name, {"k": 3}, 99, progress=progress, embed_fn=embed, write_batch_size=100)
print("FINISHED", flush=True)
"""

INGEST_CHILD = """
import sys, time, numpy as np
import pm_vector.db as db

name = sys.argv[1]
X = np.random.default_rng(1).normal(size=(300, 6))

def progress(done, total):
    print("READY", done, total, flush=True)
    time.sleep(300)

db.ingest(name, X, np.zeros(300, dtype=int), external_ids=[f"late{i}" for i in range(300)], batch_size=50,
          progress=progress)
print("FINISHED", flush=True)
"""


def _sigkill(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL


def _wait_worker_gone(db, run_id: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.run_info(run_id)["worker_alive"] is False:
            return
        time.sleep(0.1)
    raise AssertionError("the killed job's session still holds its lock")


@pytest.mark.parametrize("stage", ["write", "index"])
@pytest.mark.slow
def test_sigkilled_job_leaves_previous_run_serving(db, cname, conn, stage):
    db.create_collection(cname, 6, [0, 1, 2])
    X, y = data(1000, 6, seed=4)
    ids = db.ingest(cname, X, y)["item_ids"]
    db.register_anchor_set(cname, X[:30], y[:30])
    first = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())["run_id"]
    q = X[10].astype(np.float64) @ projection(6, 3, 1)
    before = db.knn(cname, q, 5)
    assert before["item_ids"][0] == ids[10]

    child = start_child(JOB_CHILD, cname, stage)
    try:
        wait_ready(child)
        runs = [r for r in db.list_runs(cname) if r["status"] == "running"]
        assert len(runs) == 1
        run_id = runs[0]["run_id"]
        assert runs[0]["worker_alive"] is True
        if stage == "write":  # half-written, in the transaction that created the table: nobody else sees it
            assert conn.execute("SELECT to_regclass(%s)", [f"pm_vector.run_{run_id}_items"]).fetchone()[0] is None
        else:
            assert conn.execute(f"SELECT count(*) FROM pm_vector.run_{run_id}_items").fetchone()[0] == 1000
        conn.rollback()
        # while it runs, cleanup leaves it alone and queries use the previous run
        assert db.cleanup_stale_runs(cname) == []
        np.testing.assert_array_equal(db.knn(cname, q, 5)["item_ids"], before["item_ids"])
        _sigkill(child)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

    _wait_worker_gone(db, run_id)
    # the killed run is not visible to queries, and the previous run still serves
    assert db.collection_info(cname)["active_run_id"] == first
    np.testing.assert_array_equal(db.knn(cname, q, 5)["item_ids"], before["item_ids"])
    assert db.run_info(run_id)["status"] == "running"  # stale until detected
    assert db.cleanup_stale_runs(cname) == [run_id]
    info = db.run_info(run_id)
    assert info["status"] == "failed" and "abandoned" in info["error"] and info["has_tables"] is False
    assert not info["is_active"]
    assert db.cleanup_stale_runs(cname) == []
    # the next job works and switches normally
    nxt = db.run_embedding_job(cname, {"k": 3}, 2, embed_fn=make_embed_fn())
    assert nxt["previous_run_id"] == first and db.collection_info(cname)["active_run_id"] == nxt["run_id"]


@pytest.mark.slow
def test_next_job_cleans_up_a_killed_one(db, cname):
    """No explicit cleanup call: the next job detects the stale run itself."""
    db.create_collection(cname, 6, [0, 1, 2])
    X, y = data(400, 6, seed=5)
    db.ingest(cname, X, y)
    db.register_anchor_set(cname, X[:20], y[:20])
    child = start_child(JOB_CHILD, cname, "index")
    try:
        wait_ready(child)
        run_id = [r for r in db.list_runs(cname) if r["status"] == "running"][0]["run_id"]
        _sigkill(child)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert db.collection_info(cname)["active_run_id"] is None  # never activated
    _wait_worker_gone(db, run_id)
    done = db.run_embedding_job(cname, {"k": 3}, 3, embed_fn=make_embed_fn())
    assert db.run_info(run_id)["status"] == "failed" and db.run_info(run_id)["has_tables"] is False
    assert db.collection_info(cname)["active_run_id"] == done["run_id"]


def test_sigkilled_ingest_is_undone(db, cname, conn):
    """One transaction: the batches a live ingest wrote are invisible, and a kill leaves nothing."""
    db.create_collection(cname, 6, [0])
    db.ingest(cname, np.ones((5, 6)), np.zeros(5, dtype=int))
    child = start_child(INGEST_CHILD, cname)
    try:
        line = wait_ready(child)
        assert line.split()[1:] == ["50", "300"]
        assert db.collection_info(cname)["n_items"] == 5  # one batch written, not visible
        assert db.cleanup(cname) == {"runs": [], "ingests": []}  # alive: untouched
        _sigkill(child)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert db.collection_info(cname)["n_items"] == 5
    assert db.cleanup(cname) == {"runs": [], "ingests": []}  # nothing was left to undo
    assert conn.execute("SELECT count(*) FROM pm_vector.ingests i JOIN pm_vector.collections c "
                        "ON c.id = i.collection_id WHERE c.name = %s", [cname]).fetchone()[0] == 1
    # the external ids of the killed ingest are free (waits for the dead backend's rollback)
    db.ingest(cname, np.ones((1, 6)), [0], external_ids=["late0"])


def test_cleanup_deletes_rows_of_an_abandoned_ingest_no_run_holds(db, cname, conn):
    """An ingest of an older version that committed batches, then died: rows no run embedded go."""
    db.create_collection(cname, 6, [0, 1, 2])
    X, y = data(300, 6, seed=7)
    db.ingest(cname, X[:200], y[:200])
    db.register_anchor_set(cname, X[:20], y[:20])
    db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())
    late = db.ingest(cname, X[200:], y[200:])["ingest_id"]
    conn.execute("UPDATE pm_vector.ingests SET status = 'running', finished_at = NULL WHERE id = %s", [late])
    out = db.cleanup(cname)
    assert out == {"runs": [], "ingests": [late]}
    assert db.collection_info(cname)["n_items"] == 200
    st, err = conn.execute("SELECT status, error FROM pm_vector.ingests WHERE id = %s", [late]).fetchone()
    assert st == "failed" and "deleted" in err
    assert len(db.knn(cname, X[0].astype(np.float64) @ projection(6, 3, 1), 5)["item_ids"]) == 5


INDEX_CHILD = """
import sys, numpy as np
import pm_vector.db as db
P = np.random.default_rng(0).normal(size=(16, 16))

def embed(ax, ay, ix, iy, params, seed, progress):
    return ax.astype(np.float64) @ P, ix.astype(np.float64) @ P

db.run_embedding_job(sys.argv[1], {"k": 16}, 1, embed_fn=embed)
"""


@pytest.mark.slow
def test_sigkilled_job_backend_stops_building_the_index_within_seconds(db, cname, conn):
    """client_connection_check_interval on the job's connection: the backend of a killed job
    aborts its HNSW build (and lets go of the run's lock) instead of finishing it."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6_000, 16)).astype(np.float32)
    y = rng.integers(0, 3, X.shape[0])
    db.create_collection(cname, 16, [0, 1, 2], hnsw_m=48, hnsw_ef_construction=600)  # a slow build
    db.ingest(cname, X, y)
    db.register_anchor_set(cname, X[:60], y[:60])
    child = start_child(INDEX_CHILD, cname)
    try:
        deadline = time.monotonic() + 120
        pid = None
        while pid is None and time.monotonic() < deadline:
            row = conn.execute("SELECT pid FROM pg_stat_progress_create_index "
                               "WHERE relid::regclass::text LIKE 'pm_vector.run_%%_items'").fetchone()
            pid = row[0] if row else None
            assert child.poll() is None, child.communicate()
            time.sleep(0.01)
        assert pid is not None, "the job never started its index build"
        time.sleep(0.2)
        building = conn.execute("SELECT 1 FROM pg_stat_progress_create_index WHERE pid = %s", [pid]).fetchone()
        _sigkill(child)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert building, "the index build ended before the kill: make the collection larger"
    t = time.monotonic()
    while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone() is not None:
        assert time.monotonic() - t < 5.0, "the killed job's backend is still building the index"
        time.sleep(0.05)
    run_id = [r for r in db.list_runs(cname) if r["status"] == "running"][0]["run_id"]
    assert db.run_info(run_id)["worker_alive"] is False  # its lock went with the backend
    assert db.cleanup_stale_runs(cname) == [run_id]


def test_worker_connections_watch_their_client(db):
    """Job and ingest connections check their client every second (session setting, kept after a rollback)."""
    from pm_vector.db.postgres import connect

    c = connect(watch_client=True)
    try:
        c.execute("SELECT 1")
        c.rollback()
        assert c.execute("SHOW client_connection_check_interval").fetchone()[0] == "1s"
    finally:
        c.close()
    with connect() as plain:
        assert plain.execute("SHOW client_connection_check_interval").fetchone()[0] == "0"
