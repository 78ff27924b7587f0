"""`pm-vector bench cluster` end to end on a small collection: the JSON shape the issue asks for,
same answers on one node and on the cluster, and figures that are measurements (positive)."""

from __future__ import annotations

import json


def test_bench_cluster_json(tmp_path):
    from typer.testing import CliRunner

    from pm_vector.cli import app

    res = CliRunner().invoke(app, ["bench", "cluster", "--items", "1500", "--anchors", "200", "--rows", "10",
                                   "--repeats", "3", "--shortlist", "16", "--json"])
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
