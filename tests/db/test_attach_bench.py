"""The attached-table benchmark (pm_vector.bench.attach_bench) runs end to end on a small table: its
timed batches apply exactly their changes, and the stream's count check holds."""

import pytest


@pytest.mark.slow
def test_attach_bench_small(db):
    from pm_vector.bench.attach_bench import run

    out = run(items=400, dim=32, rate=[20.0, 10.0], seconds=2.0, batch_sizes=(5, 10), repeats=2, compare_kept=True)
    assert set(out["batch_s"]) == {"5", "10"} and all(len(v["runs"]) == 2 for v in out["batch_s"].values())
    # side by side: each timed batch beside one synced without the rows kept from the batch before
    assert all(len(v["without_kept_rows"]["runs"]) == 2 for v in out["batch_s"].values())
    # each rate's stream twice: without the kept rows, then with them
    assert [(s["rate"], s["kept_rows"]) for s in out["streams"]] == [(20.0, False), (20.0, True), (10.0, False),
                                                                      (10.0, True)]
    for s in out["streams"]:  # each stream on the table the one before left
        assert s["errors"] == 0, s["error_samples"]
        cc = s["count_check"]
        assert cc["items"] == cc["table_rows"] == cc["distinct_keys"] and cc["queue_left"] == 0
        assert cc["applied_equals_changes"] and s["changes"] > 5 and s["delay_s"]["p99"] > 0
        assert s["queries"]["answered"] > 0 and s["sync_s"]["changes_p50"] > 0
    assert out["sizes_mb"]["features_stored_by_pm_vector"] == 0  # the features stay in the user's table


@pytest.mark.slow
def test_attach_bench_answers_from_a_process_of_its_own(db):
    from pm_vector.bench.attach_bench import run

    out = run(items=300, dim=16, rate=20.0, seconds=3.0, queries_in="process")
    s = out["streams"][0]
    assert out["queries_in"] == "process" and s["errors"] == 0, s["error_samples"]
    assert s["queries"]["answered"] > 0 and s["count_check"]["queue_left"] == 0
    with pytest.raises(ValueError, match="queries_in"):
        run(items=300, dim=16, seconds=0, queries_in="elsewhere")
