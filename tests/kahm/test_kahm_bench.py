"""`run_kahm_benchmark` returns the documented JSON shape (tiny configuration)."""

import json

import pytest

from pm_vector.bench.kahm_bench import PAPER_TABLE11, TABLE5_GRID, run_kahm_benchmark, table11_shape


def test_table11_layouts_reproduce_the_paper_sizes():
    assert len(TABLE5_GRID) == 14 and len(PAPER_TABLE11) == 13
    assert table11_shape(3_600_000, "p=10N") == (600, 6000)
    assert table11_shape(10_000_000, "p=10N") == (1000, 10000)
    assert table11_shape(10_000, "N=1000") == (1000, 10)


def test_benchmark_json_shape():
    lines = []
    out = run_kahm_benchmark("all", datasets=["digits"],
                             grid=[(16.0, 8)], sizes=[10_000], layouts=("p=10N",), repeats=1, noise_seed=0,
                             progress=lines.append)
    json.dumps(out)
    t = out["timings"][0]
    assert {"N", "p", "seconds", "paper_seconds"} <= set(t) and t["paper_seconds"] == 0.0193
    r = out["privacy"][0]
    assert {"dataset", "epsilon", "n", "accuracy_def12", "accuracy_def15", "mis_def12", "mis_def15"} <= set(r)
    assert r["dataset"] == "digits" and r["accuracy_def12"] > 0.8 and r["accuracy_def15"] > 0.8
    assert out["privacy_summary"][0]["configs"] == 1
    assert len(lines) == 2
    with pytest.raises(ValueError):
        run_kahm_benchmark("bogus")
