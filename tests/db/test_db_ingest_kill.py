"""SIGKILL of a real ``pm-vector ingest`` process at several points leaves the collection exactly as
before: rows, ``n_items``, knn and resolve answers; nothing for cleanup or ``embed --new-items``.

The kill points are made deterministic on the server: a test trigger makes the ingest's backend
wait on an advisory lock the test holds, either at a given row of the COPY (first row, a row of
the second batch, the last row) or at the final status update just before COMMIT. The test then
SIGKILLs the CLI process while its backend is still blocked, and checks that the backend goes
away by itself within a few seconds (``client_connection_check_interval`` on the ingest's
connection) although the lock is still held.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

LOCK = 4242_0001
N = 3_000  # 3 COPY batches of 1,000 rows (--batch-size)
CLI = str(Path(sys.executable).parent / "pm-vector")


@pytest.fixture(scope="module")
def served(pm_home, tmp_path_factory):
    """A digits collection with an AnchorFrame run, a fixed request, and files of N new rows."""
    import pm_vector.db as db
    from pm_vector.client import PrivateMail
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.db.resolve.resolution import client_frame, public_anchor

    ds = load_dataset("digits")
    sp = split_dataset(ds, 600, 200, 100, 20, seed=0)
    name = "ik_" + uuid.uuid4().hex[:10]
    db.create_collection(name, ds.dim, ds.classes.tolist())
    db.ingest(name, *sp.server)
    db.register_anchor_set(name, *sp.anchor)
    db.register_anchor_set(name, *sp.dummy, role="dummy")
    run = db.run_embedding_job(name, {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn)
    pa, info = public_anchor(name)
    frame = client_frame(name, pa, info)
    Xq, yq = sp.query
    req = PrivateMail(frame, epsilon=1.0, _rng=11).request(Xq[0], int(yq[0]), pa, collection=name)[0]
    d = tmp_path_factory.mktemp("ingest_kill")
    rng = np.random.default_rng(5)
    np.save(d / "X.npy", np.abs(rng.normal(size=(N, ds.dim))) + 0.01)
    np.save(d / "y.npy", rng.choice(ds.classes, N))
    yield {"name": name, "run_id": run["run_id"], "request": req.to_json(), "dir": d, "q": Xq[0]}
    db.drop_collection(name, missing_ok=True)
    with db.connect(autocommit=True) as c:  # the rolled-back rows: leave the table's statistics as we found them
        c.execute("VACUUM ANALYZE pm_vector.items")


def _snapshot(db, conn, s) -> dict:
    from pm_vector.db.resolve.resolution import resolve

    name = s["name"]
    cid = db.collection_info(name)["id"]
    rows = conn.execute("SELECT count(*), coalesce(sum(id), 0), md5(coalesce(string_agg(features::text || label, "
                        "',' ORDER BY id), '')) FROM pm_vector.items WHERE collection_id = %s", [cid]).fetchone()
    res = resolve(name, s["request"], k=8)
    return {"n_items": db.collection_info(name)["n_items"], "rows": rows,
            "ingests": conn.execute("SELECT count(*) FROM pm_vector.ingests WHERE collection_id = %s",
                                    [cid]).fetchone()[0],
            "resolve": [list(map(int, r["item_ids"])) for r in res["rows"]],
            "knn": db.knn(name, np.ones(8), 5)["item_ids"].tolist()}


def _next_item_id(conn) -> int:
    seq = conn.execute("SELECT pg_get_serial_sequence('pm_vector.items', 'id')").fetchone()[0]
    last, called = conn.execute(f"SELECT last_value, is_called FROM {seq}").fetchone()
    return int(last) + 1 if called else int(last)


def _install_block(conn, point: str, first_id: int) -> None:
    conn.execute("CREATE OR REPLACE FUNCTION public.pm_test_block() RETURNS trigger LANGUAGE plpgsql AS "
                 f"$$ BEGIN PERFORM pg_advisory_lock({LOCK}); PERFORM pg_advisory_unlock({LOCK}); RETURN NEW; END $$")
    if point == "commit":
        conn.execute("CREATE TRIGGER pm_test_block BEFORE UPDATE ON pm_vector.ingests FOR EACH ROW "
                     "WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION public.pm_test_block()")
    else:
        row = {"first_row": 0, "second_batch": 1_432, "last_row": N - 1}[point]
        conn.execute("CREATE TRIGGER pm_test_block BEFORE INSERT ON pm_vector.items FOR EACH ROW "
                     f"WHEN (NEW.id = {first_id + row}) EXECUTE FUNCTION public.pm_test_block()")


def _remove_block(conn) -> None:
    conn.execute("DROP TRIGGER IF EXISTS pm_test_block ON pm_vector.items")
    conn.execute("DROP TRIGGER IF EXISTS pm_test_block ON pm_vector.ingests")
    conn.execute("DROP FUNCTION IF EXISTS public.pm_test_block()")


def _blocked_backend(conn, proc, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s",
                           [LOCK]).fetchone()
        if row:
            return int(row[0])
        if proc.poll() is not None:
            raise AssertionError(f"the ingest ended before reaching the kill point: {proc.communicate()}")
        time.sleep(0.02)
    raise AssertionError("the ingest never reached the kill point")


def _cli(s, name: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([CLI, "ingest", name, "--features", str(s["dir"] / "X.npy"), "--labels",
                             str(s["dir"] / "y.npy"), "--json", "--batch-size", "1000", *extra], env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_blocked(conn, proc) -> float:
    """SIGKILL the CLI while its backend waits on our lock; seconds until that backend is gone."""
    pid = _blocked_backend(conn, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    t = time.monotonic()
    while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone() is not None:
        assert time.monotonic() - t < 10, "the killed ingest's backend is still there"
        time.sleep(0.05)
    return time.monotonic() - t


@pytest.mark.parametrize("point", ["first_row", "second_batch", "last_row", "commit"])
def test_sigkilled_cli_ingest_leaves_the_collection_exactly_as_before(db, conn, served, point):
    before = _snapshot(db, conn, served)
    assert before["n_items"] == 600 and all(len(r) == 8 for r in before["resolve"])
    conn.execute("SELECT pg_advisory_lock(%s)", [LOCK])
    try:
        _install_block(conn, point, _next_item_id(conn))
        proc = _cli(served, served["name"])
        try:
            gone_after = _kill_blocked(conn, proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # the backend noticed its client was gone while still waiting on the lock we hold
        print(f"[{point}] backend of the killed ingest gone {gone_after:.2f} s after SIGKILL")
        assert gone_after < 5.0
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", [LOCK])
        _remove_block(conn)
    assert _snapshot(db, conn, served) == before
    # nothing for cleanup, nothing for `embed --new-items`
    assert db.cleanup(served["name"]) == {"runs": [], "ingests": []}
    from pm_vector.db.runs.jobs import anchor_frame_extend_fn

    assert db.embed_new_items(served["name"], anchor_frame_extend_fn)["n_new"] == 0


def test_sigkilled_create_ingest_leaves_no_collection_and_the_retry_works(db, conn, served):
    name = "ik_" + uuid.uuid4().hex[:10]
    conn.execute("SELECT pg_advisory_lock(%s)", [LOCK])
    try:
        _install_block(conn, "second_batch", _next_item_id(conn))
        proc = _cli(served, name, "--create")
        try:
            _kill_blocked(conn, proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", [LOCK])
        _remove_block(conn)
    try:
        assert name not in [c["name"] for c in db.list_collections()]
        r = subprocess.run([CLI, "ingest", name, "--features", str(served["dir"] / "X.npy"), "--labels",
                            str(served["dir"] / "y.npy"), "--json", "--create"], env=dict(os.environ),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert db.collection_info(name)["n_items"] == N
    finally:
        db.drop_collection(name, missing_ok=True)


def test_cleanup_of_an_abandoned_ingest_never_leaves_a_resolve_with_0_neighbours(db, conn, served):
    """The bug of issue 11: an ingest of an older version, abandoned after committing rows that a run
    then embedded; cleanup deleted the items but not the run's rows, and every resolve answered
    0 neighbours. Such rows are now kept (the ingest is marked failed, saying why)."""
    before = _snapshot(db, conn, served)
    cid = db.collection_info(served["name"])["id"]
    iid = conn.execute("SELECT min(ingest_id) FROM pm_vector.items WHERE collection_id = %s", [cid]).fetchone()[0]
    conn.execute("UPDATE pm_vector.ingests SET status = 'running', finished_at = NULL WHERE id = %s", [iid])
    out = db.cleanup(served["name"])
    assert out == {"runs": [], "ingests": [iid]}
    st, err = conn.execute("SELECT status, error FROM pm_vector.ingests WHERE id = %s", [iid]).fetchone()
    assert st == "failed" and f"run(s) [{served['run_id']}]" in err and "kept" in err
    after = _snapshot(db, conn, served)
    assert after == before and all(len(r) == 8 for r in after["resolve"])
    # and a full job after it (it runs cleanup first) still has every item to embed
    from dbtest_helpers import make_embed_fn

    nxt = db.run_embedding_job(served["name"], {"k": 3}, 4, embed_fn=make_embed_fn())
    assert nxt["n_items"] == 600
