"""Jobs kept in PostgreSQL: a restarted service shows the jobs it ran; jobs left running by a dead
service are marked interrupted (those of a live one are left alone); bounded parameters and queue."""

from __future__ import annotations

import uuid

import httpx
import pytest


@pytest.fixture(scope="module")
def admin(pm_home):
    from pm_vector.service.auth import create_key

    return {"Authorization": f"Bearer {create_key('jobs admin', role='admin')['key']}"}


def _fake_job(conn, status: str, owner: str, collection: str = "fake") -> str:
    job_id = "t" + uuid.uuid4().hex[:15]
    conn.execute("INSERT INTO pm_vector_service.jobs (job_id, collection, status, owner) VALUES (%s, %s, %s, %s)",
                 [job_id, collection, status, owner])
    conn.commit()
    return job_id


def _status(conn, job_id):
    return conn.execute("SELECT status FROM pm_vector_service.jobs WHERE job_id = %s", [job_id]).fetchone()[0]


def test_restart_shows_jobs_and_marks_dead_ones_interrupted(pm_home, svc_split, admin):
    from pm_vector import db
    from pm_vector.db.postgres import connect
    from pm_vector.bench.demo import prepare_collection
    from pm_vector.service.jobs import LOCK_SPACE
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    name = "svc_jobstate_" + uuid.uuid4().hex[:6]
    prepare_collection(name, svc_split)
    st = ServiceSettings(pool_max=2, request_log_retention_days=0)
    try:
        with ServiceThread(st) as svc, httpx.Client(base_url=svc.url, headers=admin, timeout=60) as c:
            r = c.post(f"/collections/{name}/jobs", json={"params": {"n_components": 8}, "seed": 3})
            assert r.status_code == 202, r.text
            job_id = r.json()["job_id"]
            j = svc.app.state.jobs.wait(job_id, timeout=180)
            assert j["status"] == "succeeded", j
        with connect() as conn:
            dead = _fake_job(conn, "running", uuid.uuid4().hex)  # its owner holds no lock: it died
            queued = _fake_job(conn, "queued", None)
            # a run its dead job left 'running' (nobody holds its lock)
            stale_run = conn.execute(
                "INSERT INTO pm_vector.embedding_runs (collection_id, status, seed) SELECT id, 'running', 0 FROM "
                "pm_vector.collections WHERE name = %s RETURNING id", [name]).fetchone()[0]
            conn.commit()
            live_owner = uuid.uuid4().hex
            with connect() as holder:  # another live worker of the service
                holder.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", [LOCK_SPACE, live_owner])
                live = _fake_job(conn, "running", live_owner)
                with ServiceThread(st) as svc, httpx.Client(base_url=svc.url, headers=admin, timeout=60) as c:
                    jobs = {j["job_id"]: j for j in c.get("/jobs").json()["jobs"]}
                    assert jobs[job_id]["status"] == "succeeded" and jobs[job_id]["seed"] == 3
                    assert set(jobs[job_id]["stages"]) >= {"load", "embed", "write", "index", "switch"}
                    assert jobs[dead]["status"] == "interrupted" and "stopped" in jobs[dead]["error"]
                    assert jobs[queued]["status"] == "interrupted"
                    assert jobs[live]["status"] == "running"  # not this service's to judge
                    assert c.get(f"/jobs/{job_id}").json()["result"]["status"] == "succeeded"
                    assert c.get("/jobs/nope").status_code == 404
                    assert conn.execute("SELECT status FROM pm_vector.embedding_runs WHERE id = %s",
                                        [stale_run]).fetchone()[0] == "failed"
            conn.execute("DELETE FROM pm_vector_service.jobs WHERE job_id = ANY(%s)", [[dead, queued, live]])
            conn.commit()
            assert "running" not in {s for (s,) in conn.execute(
                "SELECT status FROM pm_vector_service.jobs WHERE collection = %s", [name]).fetchall()}
    finally:
        db.drop_collection(name, missing_ok=True)


def test_job_parameters_and_queue_are_bounded(service, svc_collection, admin, pm_home):
    from pm_vector.db.postgres import connect
    from pm_vector.service.jobs import LOCK_SPACE

    with httpx.Client(base_url=service.url, headers=admin, timeout=30) as c:
        for params, word in [({"n_components": 2}, "n_components"), ({"n_components": 8, "n_extend_iter": 10 ** 6},
                                                                      "n_extend_iter"),
                             ({"n_components": 8, "n_iter": 1e9}, "n_iter"), ({"n_components": 8.5}, "n_components"),
                             ({"n_components": 8, "sigma": "x" * 100}, "sigma")]:
            r = c.post(f"/collections/{svc_collection}/jobs", json={"params": params})
            assert r.status_code == 422 and word in r.json()["message"], r.text
        r = c.post(f"/collections/{svc_collection}/jobs", json={"params": {"n_components": 8}, "seed": 2 ** 63})
        assert r.status_code == 422 and "seed" in r.json()["message"]
        # fill the queue with jobs of a live owner: the next start is refused with 429
        owner = uuid.uuid4().hex
        limit = service.settings.max_queued_jobs
        with connect() as conn, connect() as holder:
            holder.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", [LOCK_SPACE, owner])
            n = conn.execute("SELECT count(*) FROM pm_vector_service.jobs WHERE status IN ('queued', 'running')"
                             ).fetchone()[0]
            ids = [_fake_job(conn, "queued", owner) for _ in range(max(0, limit - n))]
            try:
                r = c.post(f"/collections/{svc_collection}/jobs", json={"params": {"n_components": 8}})
                assert r.status_code == 429 and r.json()["error"] == "job_queue_full" and "Retry-After" in r.headers
            finally:
                conn.execute("DELETE FROM pm_vector_service.jobs WHERE job_id = ANY(%s)", [ids])
                conn.commit()


def test_check_params_bounds():
    from pm_vector.errors import InvalidInputError
    from pm_vector.service.jobs import check_params, check_seed

    assert check_params({"n_components": 8, "sigma": "auto"}, min_components=4) == {"n_components": 8, "sigma": "auto"}
    with pytest.raises(InvalidInputError, match=r"\[4, 256\]"):
        check_params({"n_components": 3}, min_components=4)
    with pytest.raises(InvalidInputError, match="unknown"):
        check_params({"device": "cuda"})
    with pytest.raises(InvalidInputError):
        check_seed(-1)
    assert check_seed(2 ** 63 - 1) == 2 ** 63 - 1
