"""`pm-vector bench kahm --part anchor`: the protocol on a DP fabricated anchor beside a public one."""

import json

import pytest


@pytest.mark.slow
def test_anchor_benchmark_compares_public_and_fabricated_anchors(db):
    from pm_vector.bench.anchor_bench import run_anchor_benchmark

    lines = []
    out = run_anchor_benchmark(["digits"], anchor_epsilons=(0.05, 64.0), units=("row",), n_queries=40,
                               noise_seed=0, progress=lines.append)
    json.dumps(out)
    rows = {(r["anchor"], r["unit"], r["anchor_epsilon"]): r for r in out["anchor"]}
    assert set(rows) == {("public", None, None), ("fabricated", "row", 0.05), ("fabricated", "row", 64.0)}
    assert len(lines) == 3 and "per-item eps=64 (row level)" in lines[2]
    pub, weak, strong = rows[("public", None, None)], rows[("fabricated", "row", 0.05)], rows[("fabricated", "row", 64.0)]
    # per-item epsilon leads every row: the anchor epsilon itself at row level (element level: p x epsilon,
    # tests/db/test_db_kahm.py)
    assert list(strong)[0] == "per_item_epsilon" and strong["per_item_epsilon"] == 64.0 and strong["clip_norm"] == 1.0
    assert strong["value_range"] is None and out["config"]["units"] == ["row"]
    assert pub["precision_at_8"] >= 0.9 and pub["per_item_epsilon"] is None
    # a generous per-item budget gives an anchor close to the public one; a tiny one drowns it in noise
    assert strong["precision_at_8"] >= 0.8
    assert weak["precision_at_8"] < strong["precision_at_8"] - 0.2
    assert out["raw_knn"][0]["recall_at_8"] > 0.9
    # the default protocol on the same anchors: its answers follow the query
    assert pub["pm_vector"]["nn_recall_at_8"] > 0.3 and pub["pm_vector"]["precision_at_8"] >= 0.9
    assert strong["pm_vector"]["nn_recall_at_8"] > 0.3
    # the benchmark's collection is gone
    assert not [c for c in db.list_collections() if c["name"].startswith("bench_anchor_")]


def test_federation_benchmark_matches_the_centralised_classifier(db):
    from pm_vector.bench.kahm_roles_bench import run_federation_benchmark

    out = run_federation_benchmark("digits", n_parties=2, epsilons=(16.0,), n_components=8, noise_seed=0)
    json.dumps(out)
    rows = {r["kind"]: r for r in out["federation"]}
    assert set(rows) == {"raw", "fabricated"}
    for r in rows.values():
        assert r["federated_accuracy"] > 0.9 and r["centralised_accuracy"] > 0.9
        assert abs(r["federated_accuracy"] - r["centralised_accuracy"]) < 0.05 and r["agreement"] > 0.9
        assert len(r["winning_party_share"]) == 2 and sum(r["winning_party_share"]) == pytest.approx(1.0)
        assert min(r["winning_party_share"]) > 0.2  # both parties answer (random halves of the items)
    assert not [c for c in db.list_collections() if c["name"].startswith("bench_fed_")]


@pytest.mark.slow
def test_scores_benchmark_reports_both_latencies(db):
    from pm_vector.bench.kahm_roles_bench import run_scores_benchmark

    r = run_scores_benchmark("digits", sizes=(600, 200, 100, 20), n_components=8)["scores"]
    assert r["requests"] == 20 and r["rows_per_request"] == 10
    assert r["resolve_ms_p50_with_scores"] > 0 and r["resolve_ms_p50_without"] > 0
    assert r["ratio"] == pytest.approx(r["resolve_ms_p50_with_scores"] / r["resolve_ms_p50_without"])
    assert r["returned_items_predicted_equals_label"] > 0.8 and r["model_bytes"] > 0
    assert not [c for c in db.list_collections() if c["name"].startswith("bench_scores_")]
