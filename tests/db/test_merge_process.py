"""The sync worker's background merge runs in a process of its own, below the sync's CPU priority
(:func:`pm_vector.service.sync_worker.merge_in_background`, :mod:`pm_vector.service.merge_process`):
it once ran on a thread of the sync's process, sharing its GIL with every sync pass."""

from __future__ import annotations

import os
import sys
import time

import numpy as np


def _delta_collection(db, name):
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    ds = load_dataset("digits")
    sp = split_dataset(ds, 500, 100, 100, 100, seed=1)
    Xs, ys = sp.server
    db.create_collection(name, ds.dim, ds.classes.tolist(), settings={"merge": {"delta_items": 2, "pause": 0}})
    db.ingest(name, Xs[:450], ys[:450])
    db.register_anchor_set(name, *sp.anchor)
    db.register_anchor_set(name, *sp.dummy, role="dummy")
    rid = db.run_embedding_job(name, {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn)["run_id"]
    return Xs, ys, rid


def test_a_due_merge_runs_in_a_lower_priority_process_of_its_own(db, cname, conn):
    """Three changes make the merge due; ``merge_in_background`` starts it and returns at once, a
    second call starts none while it runs; the merge's job ran in another process (the run row's
    worker pid), at the nice value asked, and leaves the collection a new run with an empty delta
    that holds the new items and not the deleted one."""
    from pm_vector.db.runs.jobs import anchor_frame_extend_fn
    from pm_vector.service import sync_worker

    Xs, ys, rid = _delta_collection(db, cname)
    new = db.ingest(cname, Xs[450:452], ys[450:452], embed_fn_extend=anchor_frame_extend_fn)["item_ids"]
    gone = conn.execute("SELECT min(id) FROM pm_vector.items WHERE collection_id = (SELECT id FROM "
                        "pm_vector.collections WHERE name = %s)", [cname]).fetchone()[0]
    db.delete_items(cname, item_ids=[gone])
    t = time.perf_counter()
    assert sync_worker.merge_in_background(db.database_url(), nice=7)
    assert time.perf_counter() - t < 2.0  # (the merge itself takes seconds: it is not waited for)
    assert not sync_worker.merge_in_background(db.database_url())  # one at a time
    got = None
    while got is None and time.perf_counter() - t < 240:
        time.sleep(0.2)
        got = sync_worker.merge_finished()
    assert got is not None, "the merge did not end within 240 s"
    base = os.nice(0) if sys.platform.startswith("linux") else None
    if base is not None:
        assert got["nice"] == min(19, base + 7)
        assert got["idle"] is True  # SCHED_IDLE: it runs only when no other task wants a core
        assert got["sessions_idle"] >= 1  # and so does its job's server backend (the server is local)
    res = got["merges"][cname]
    assert isinstance(res, dict), res
    active, worker = conn.execute("SELECT c.active_run_id, r.worker FROM pm_vector.collections c JOIN "
                                  "pm_vector.embedding_runs r ON r.id = c.active_run_id WHERE c.name = %s",
                                  [cname]).fetchone()
    assert active == res["run_id"] != rid and int(worker["pid"]) != os.getpid()
    held = {r[0] for r in conn.execute(f"SELECT item_id FROM pm_vector.run_{active}_items").fetchall()}
    assert set(np.asarray(new).tolist()) <= held and gone not in held
    assert conn.execute("SELECT count(*) FROM pm_vector.delta_entries WHERE run_id = %s", [active]).fetchone()[0] == 0
    assert sync_worker.merge_finished() is None  # (reported once)


def test_no_merge_process_starts_while_none_is_due(db, cname, conn):
    """``merge_in_background`` reads which merges are due before it starts a process (the process's
    start alone, its imports, took about 4 s of a core, and the sync's passes asked every second
    while any delta waited for its merge): below the threshold it starts none, on a connection of
    its own or on the one it is given."""
    from pm_vector.service import sync_worker

    _delta_collection(db, cname)  # (a merge is due at 2 delta items)
    gone = conn.execute("SELECT min(id) FROM pm_vector.items WHERE collection_id = (SELECT id FROM "
                        "pm_vector.collections WHERE name = %s)", [cname]).fetchone()[0]
    conn.commit()
    db.delete_items(cname, item_ids=[gone])  # one tombstone: not due
    assert sync_worker.merge_finished() is None and not sync_worker._merging
    assert not sync_worker.merge_in_background(db.database_url())
    assert not sync_worker._merging
    with db.connect() as c:
        assert not sync_worker.merge_in_background(db.database_url(), conn=c)
        assert c.info.transaction_status == 0  # (left idle)
    assert not sync_worker._merging
