"""`pm-vector bench resolve` end to end, small: a temporary collection timed from a fresh process with
and without a delta and dropped after; an existing collection (--collection) timed and left as it was."""

from __future__ import annotations

import pytest

from test_db_erase import _collection


def test_bench_resolve_times_a_temporary_collection_and_drops_it(db):
    from pm_vector.bench.resolve_bench import ResolveConfig, run

    before = {c["name"] for c in db.list_collections()}
    out = run(ResolveConfig(items=1000, anchors=200, reports=30, delta_changes=60))
    assert set(out["phases"]) == {"base", "delta"}
    for ph in out["phases"].values():
        assert ph["reports"] == 30 and 0 < ph["p50_ms"] <= ph["p99_ms"] <= ph["max_ms"]
        assert 0 < ph["misses"] <= 30  # a fresh process: the first request of each report is built
        again = ph["built_again"]  # every answer built again, on the parts the first pass left held
        assert 0 < again["p50_ms"] <= again["p99_ms"] and again["cpu_ms_per_report"] > 0
    assert out["phases"]["delta"]["changes"] == 60
    assert {c["name"] for c in db.list_collections()} == before


def test_bench_resolve_times_an_existing_collection_and_writes_nothing(db, cname, conn):
    from pm_vector.bench.resolve_bench import ResolveConfig, check_config, run
    from pm_vector.errors import InvalidInputError

    X, y, ids, rid = _collection(db, cname, n=400, delta=True)
    v0 = conn.execute("SELECT delta_version, n_items FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()
    conn.commit()
    out = run(ResolveConfig(collection=cname, reports=25, epsilon=4.0))
    assert list(out["phases"]) == ["base"] and out["items"] == 400 and out["dim"] == X.shape[1]
    ph = out["phases"]["base"]
    assert ph["reports"] == 25 and 0 < ph["misses"] <= min(25, out["plan"]["distinct_reports"])
    assert conn.execute("SELECT delta_version, n_items FROM pm_vector.embedding_runs WHERE id = %s",
                        [rid]).fetchone() == v0
    assert conn.execute("SELECT active_run_id FROM pm_vector.collections WHERE name = %s", [cname]).fetchone()[0] == rid
    with pytest.raises(InvalidInputError, match="--collection"):
        check_config(ResolveConfig(collection=cname, delta_changes=10))
