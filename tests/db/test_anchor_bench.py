"""`pm-vector bench kahm --part anchor`: the protocol on a DP fabricated anchor beside a public one."""

import json

import pytest


def test_anchor_benchmark_compares_public_and_fabricated_anchors(db):
    from pm_vector.bench.anchor_bench import run_anchor_benchmark

    lines = []
    out = run_anchor_benchmark(["digits"], anchor_epsilons=(0.05, 64.0), value_ranges=((0.0, 0.35),), n_queries=40,
                               noise_seed=0, progress=lines.append)
    json.dumps(out)
    rows = {(r["anchor"], r["anchor_epsilon"]): r for r in out["anchor"]}
    assert set(rows) == {("public", None), ("fabricated", 0.05), ("fabricated", 64.0)} and len(lines) == 3
    pub, weak, strong = rows[("public", None)], rows[("fabricated", 0.05)], rows[("fabricated", 64.0)]
    assert pub["precision_at_8"] >= 0.9
    # a generous budget gives an anchor as useful as the public one; a tiny one drowns it in noise
    assert strong["precision_at_8"] >= 0.85
    assert weak["precision_at_8"] < strong["precision_at_8"] - 0.2
    assert strong["row_epsilon"] == pytest.approx(64.0 * 64)  # 64 features per item row
    assert out["raw_knn"][0]["recall_at_8"] > 0.9
    # the benchmark's collection is gone
    assert not [c for c in db.list_collections() if c["name"].startswith("bench_anchor_")]
