"""Read routing over streaming replicas: a replica that answers and has replayed is in rotation; one
that falls behind (replay paused while the primary writes) or is stopped is taken out, and comes
back by itself once it has caught up or restarted."""

from __future__ import annotations

import time

import psycopg


def _until(fn, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(0.1)
    return False


def test_replica_rotation_follows_lag_and_liveness(local_cluster, node_urls, admin_urls):
    from pm_vector.db.postgres.replicas import ReadRouter

    replica = node_urls["replica0"]
    router = ReadRouter(local_cluster.coordinator_url, [replica], max_lag_bytes=4096, check_interval=0)
    assert _until(lambda: router.pick() == replica)

    with psycopg.connect(admin_urls["replica0"], autocommit=True) as r:  # (a superuser's function)
        r.execute("SELECT pg_wal_replay_pause()")
        try:
            with psycopg.connect(node_urls["coordinator"], autocommit=True) as c:
                c.execute("CREATE TABLE IF NOT EXISTS pm_vector.lag_probe (x text)")
                c.execute("INSERT INTO pm_vector.lag_probe SELECT repeat('x', 100) FROM generate_series(1, 2000)")
            assert _until(lambda: router.pick() is None)  # behind: out of rotation, reads go to the primary
            st = router.states_[0]
            assert not st.in_rotation and st.lag_bytes > 4096 and "lag" in st.error
        finally:
            r.execute("SELECT pg_wal_replay_resume()")
    assert _until(lambda: router.pick() == replica)  # caught up: back

    node = next(n for n in local_cluster.topology()["nodes"] if n["name"] == "replica0")
    local_cluster._stop_node(node)
    try:
        assert router.pick() is None and router.states_[0].error == "unreachable"
    finally:
        local_cluster.start(2, 1)
    assert _until(lambda: router.pick() == replica)
    router.mark_failed(replica, "a read failed")
    assert router.states_[0].in_rotation is False


def test_a_router_without_replicas_reads_on_the_primary(local_cluster):
    from pm_vector.db.postgres.replicas import ReadRouter

    assert ReadRouter(local_cluster.coordinator_url(), []).pick() is None
