"""``pm-vector bench writes-recall`` (pm_vector.bench.writes_recall): the recall over the release's law
is the exact expectation of every report's answer, and the command runs end to end, tiny: the
stream goes through the write path into the delta, the three states are measured on the same
queries, the merge is the full job, and nothing is left behind."""

from __future__ import annotations

import json

import numpy as np
import pytest


def test_expected_recall_weights_every_reports_answer_by_its_probability():
    """Against a brute force: each report's list re-ranked by the client's order, its top k compared
    with the truth, weighted by p for the true cell and q for every other; a true neighbour that is
    in no list (-1) is never found, and a query none of a list's items is true for scores 0 there."""
    from pm_vector.bench.location_methods import expected_recall

    rng = np.random.default_rng(3)
    M, n, q, k, S = 6, 40, 25, 4, 9
    lists = [rng.choice(n, S, replace=False) for _ in range(M)]
    ranks = np.stack([rng.permutation(n) for _ in range(q)]).astype(np.int32)
    truth = np.stack([rng.choice(n, k, replace=False) for _ in range(q)])
    truth[0, 0] = -1
    true_cell = rng.integers(M, size=q)
    p, qq = 0.5, 0.1
    got, hits = expected_recall(lists, ranks, truth, true_cell, p, qq, k)
    want = np.zeros(q)
    for i in range(q):
        for r in range(M):
            top = lists[r][np.argsort(ranks[i, lists[r]])[:k]]
            rec = len(set(top.tolist()) & set(truth[i].tolist())) / k
            assert hits[r, i] == pytest.approx(rec)
            want[i] += (p if r == true_cell[i] else qq) * rec
    np.testing.assert_allclose(got, want)


def test_bench_writes_recall_end_to_end(db):
    from typer.testing import CliRunner

    from pm_vector.cli import app

    r = CliRunner().invoke(app, ["bench", "writes-recall", "--items", "1200", "--dim", "16", "--changes", "150",
                                 "--epsilons", "4,16", "--queries", "80", "--latency-reports", "6", "--batch", "50",
                                 "--anchors", "200", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads([line for line in r.output.splitlines() if line.startswith("{")][-1])
    s = out["stream"]
    assert s["changes"] == s["applied"] == 150 and sum(s["by_kind"].values()) == 150
    # the write path's delta: every insert and update a new item, every update and delete a tombstone
    d = out["delta_size"]
    assert d["new_items"] == s["by_kind"]["insert"] + s["by_kind"]["update"]
    assert d["tombstones"] == s["by_kind"]["update"] + s["by_kind"]["delete"]
    assert d["entry_rows"] >= d["new_items"]
    assert out["merge_s"] > 0 and out["full_job_s"] > 0
    runs = [out["states"][st]["run_id"] for st in ("delta", "merged", "full")]
    assert len(set(runs)) == 3  # the merge and the full job each a new run
    for e in ("eps_4", "eps_16"):
        for st in ("delta", "merged", "full"):
            x = out["states"][st][e]
            assert 0 < x["nn_recall_at_8"] <= 1 and 0 < x["se"] < 0.2 and 0 <= x["sampled"] <= 1
            assert x["answer_bytes_max"] <= 50_000 and x["latency_reports"] == 6 and x["answer_p50_ms"] > 0
        c = out["compare"][e]
        # the merge is a new job of the same parameters on the same items: the full job's answers
        assert c["merged_minus_full"] == {"diff": 0.0, "se": 0.0} and c["merged_within_005"] is True
        assert abs(c["delta_minus_full"]["diff"]) < 0.2 and c["ratio_p50_vs_merged"] > 0 and c["ratio_p50_vs_full"] > 0
    assert not [c for c in db.list_collections() if c["name"].startswith("bench_writes_")]


def test_bench_writes_recall_refuses_bad_options():
    from typer.testing import CliRunner

    from pm_vector.cli import app

    r = CliRunner().invoke(app, ["bench", "writes-recall", "--items", "300", "--changes", "1000"])
    assert r.exit_code == 2 and "error:" in r.output and "--changes" in r.output
    r = CliRunner().invoke(app, ["bench", "writes-recall", "--epsilons", "4,x"])
    assert r.exit_code == 2 and "--epsilons" in r.output
