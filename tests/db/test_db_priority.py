"""Background sessions (:mod:`pm_vector.db.postgres.priority`): a merge's server backend at the
machine's lowest CPU priority, where the server runs here, and its switch on a session of normal
priority (a backend at SCHED_IDLE holding the collection row would keep every write waiting
behind the busy cores)."""

from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduling policies")


@pytest.fixture
def background():
    from pm_vector.db.postgres import priority

    priority.set_background(True)
    yield priority
    priority.set_background(False)


def _setting(conn) -> str:
    return conn.execute("SHOW max_parallel_maintenance_workers").fetchone()[0]


def test_a_session_is_lowered_only_in_a_background_process(db):
    """Without ``set_background`` a session keeps its priority and its parallel workers; with it, the
    session's backend is scheduled SCHED_IDLE and takes no parallel maintenance workers, and the
    session is left idle."""
    from pm_vector.db.postgres import priority

    with db.connect() as c:
        assert priority.lower(c) is False
        assert os.sched_getscheduler(c.info.backend_pid) == os.SCHED_OTHER
        assert _setting(c) != "0"
    priority.set_background(True)
    try:
        before = priority.lowered()
        with db.connect() as c:
            assert priority.lower(c) is True
            assert c.info.transaction_status == 0
            assert os.sched_getscheduler(c.info.backend_pid) == os.SCHED_IDLE
            assert _setting(c) == "0"
            c.rollback()
            assert _setting(c) == "0"  # (committed: a later rollback keeps it)
        assert priority.lowered() == before + 1
        with db.connect(autocommit=True) as c:  # (an autocommit session too)
            assert priority.lower(c) is True and os.sched_getscheduler(c.info.backend_pid) == os.SCHED_IDLE
    finally:
        priority.set_background(False)


def test_a_background_job_builds_on_a_lowered_session_and_switches_on_a_normal_one(digits_collection, background):
    """A job in a background process: while it switches, its own session's backend (the run row's
    ``worker.backend_pid``) is at SCHED_IDLE, and the session that holds the collection row is not."""
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn, run_embedding_job

    cname = digits_collection
    seen = {}

    def on_switch(c, run_id):
        job_pid = int(c.execute("SELECT worker->>'backend_pid' FROM pm_vector.embedding_runs WHERE id = %s",
                                [run_id]).fetchone()[0])
        seen.update(job=os.sched_getscheduler(job_pid), switch=os.sched_getscheduler(c.info.backend_pid),
                    same=job_pid == c.info.backend_pid)

    info = run_embedding_job(cname, {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn, on_switch=on_switch)
    assert info["status"] == "succeeded"
    assert seen == {"job": os.SCHED_IDLE, "switch": os.SCHED_OTHER, "same": False}
