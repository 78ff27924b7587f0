"""`pm-vector bench cluster` end to end on a small collection: the JSON shape the issue asks for,
same answers on one node and on the cluster (class-rows requests; location requests on the node,
the coordinator and the replica, before and after a stream of writes, with no deleted item in any
answer), and figures that are measurements (positive)."""

from __future__ import annotations

import json

import pytest


def test_bench_cluster_json(tmp_path):
    from typer.testing import CliRunner

    from pm_vector.cli import app

    res = CliRunner().invoke(app, ["bench", "cluster", "--items", "1500", "--anchors", "200", "--rows", "10",
                                   "--repeats", "3", "--shortlist", "16", "--release", "class_rows", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["same_answers"] is True
    single, clustered = out["configs"]
    assert (single["shards"], single["replicas"]) == (1, 0)
    assert (clustered["shards"], clustered["replicas"]) == (2, 1)
    for conf in (single, clustered):
        assert conf["ingest_rows_per_s"] > 0 and conf["embed_seconds"] > 0
        assert [r["rows"] for r in conf["resolve"]] == [10]
        assert all(0 < r["p50_ms"] <= r["p95_ms"] for r in conf["resolve"])
    assert single["fanout_overhead_ms"] is None and isinstance(clustered["fanout_overhead_ms"], float)
    assert set(clustered["per_shard_scan_ms"][0]) == {"rows", "shard0", "shard1"}
    assert clustered["replica_shortlist"][0]["p50_ms"] > 0
    assert "location" not in out and "location_resolve" not in clustered


def _bench(*args) -> dict:
    from typer.testing import CliRunner

    from pm_vector.cli import app

    res = CliRunner().invoke(app, ["bench", "cluster", "--items", "1500", "--anchors", "200", "--rows", "10",
                                   "--release", "location", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_bench_cluster_location_with_writes_flowing():
    """The default release: the same candidates in the same order (by external id) from one node, the
    coordinator and the replica, before and after inserts, payload updates and deletes through the
    public API; no deleted item in any answer, on any node."""
    out = _bench("--repeats", "4", "--changes", "40", "--no-feature-updates", "--location-eps", "1,16")
    loc = out["location"]
    assert "same_answers" not in out  # no class-rows part
    assert loc["requests"] == 2 * (4 + 3) and set(loc["plans"]) == {"1.0", "16.0"}
    for phase in ("before", "after"):
        p = loc[phase]
        assert p["same_answers"] is True, p
        assert p["reports_differing"] == {"cluster": 0, "replica": 0}
        assert p["deleted_in_answers"] == {"single": 0, "cluster": 0, "replica": 0}
        for node in ("single", "cluster", "replica"):
            assert 0 < p[node]["p50_ms"] <= p[node]["p95_ms"] and set(p[node]["by_eps"]) == {"1.0", "16.0"}
        assert p["ratio_coordinator_single_p50"] > 0
    assert out["location_same_answers"] is True and out["location_deleted_in_answers"] == 0
    ch = loc["changes"]
    assert ch["single"]["counts"] == ch["cluster"]["counts"] and sum(ch["single"]["counts"].values()) == 40
    assert set(ch["single"]["counts"]) == {"insert", "payload", "delete"}
    single, clustered = out["configs"]
    for conf in (single, clustered):
        assert set(conf["location_resolve"]) == {"before", "after"}
        assert conf["location_resolve"]["after"]["p50_ms"] > 0
    assert set(clustered["replica_location_resolve"]) == {"before", "after"}
    assert "replica_location_resolve" not in single and single["resolve"] == []


def test_bench_cluster_location_same_answers_after_feature_updates():
    """Feature and label updates among the writes: the cluster still answers as one node (eps 1: the
    answer holds every item, so any item placed on one and not the other shows). A sharded run takes
    the delta's path (issue #36 item 5): every update is placed on the coordinator as on one node."""
    out = _bench("--repeats", "2", "--changes", "20", "--location-eps", "1")
    ch = out["location"]["changes"]
    assert ch["single"]["counts"].get("update", 0) > 0
    assert ch["single"]["updates_not_placed"] == ch["cluster"]["updates_not_placed"] == 0
    assert out["location"]["before"]["same_answers"] is True
    assert out["location_deleted_in_answers"] == 0
    assert out["location"]["after"]["same_answers"] is True, out["location"]["after"].get("first_difference")


@pytest.mark.parametrize("args, says", [(["--release", "rows"], "--release must be one of location, class_rows, both"),
                                        (["--changes", "-1"], "--changes must be 0 or more")])
def test_bench_cluster_refuses_bad_options_before_starting_anything(args, says):
    from typer.testing import CliRunner

    from pm_vector.cli import app

    res = CliRunner().invoke(app, ["bench", "cluster", *args])
    assert res.exit_code == 2 and f"error: {says}" in res.output and "Traceback" not in res.output
