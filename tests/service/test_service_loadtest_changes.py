"""`pm-vector bench load --changes-rate`: an attached table changed during the load, the service's
sync lag reported (:mod:`pm_vector.bench.load_changes`). Not timed: the figures are checked for what
they mean, not for their size."""

from __future__ import annotations

import time

import pytest


def test_each_changes_delay_is_read_off_the_applied_count():
    """Changes are applied in order: with n committed and q queued, the first n - q are applied; a
    change's delay runs from its commit to the first sample that counts it applied."""
    from pm_vector.bench.load_changes import ChangeStream

    cs = ChangeStream.__new__(ChangeStream)
    cs.commits = [10.0, 10.2, 10.4, 11.0]
    cs.samples = [(10.1, 0.1, 0), (10.5, 0.4, 1), (10.9, 0.5, 1), (11.3, 0.0, 3), (12.0, 0.0, 4)]
    cs.errors, cs.items, cs.dim, cs.rate, cs.sample_s, cs.name, cs._t0 = [], 100, 8, 5.0, 0.25, "x", 9.0
    r = cs.report()
    assert r["changes"] == 4
    assert r["delay_s"]["unapplied"] == 0
    # change 0 applied at 10.5 (0.5 s), 1 and 2 at 11.3 (1.1 and 0.9 s), 3 at 12.0 (1.0 s)
    assert r["delay_s"]["max"] == pytest.approx(1.1)
    assert r["samples"] == 3  # the samples up to the last commit: lag 0.1, 0.4, 0.5
    assert r["lag_s"]["max"] == pytest.approx(0.5)
    cs.samples = cs.samples[:2]
    assert cs.report()["delay_s"]["unapplied"] == 3


def test_bad_stream_arguments_are_refused():
    from pm_vector.bench.load_changes import ChangeStream

    for kw in ({"items": 10}, {"rate": 0.0}, {"rate": -1.0}, {"dim": 1}):
        with pytest.raises(ValueError, match="attached table"):
            ChangeStream(**{"items": 200, "dim": 32, "rate": 5.0, **kw})


def test_a_stream_is_applied_by_the_services_worker_and_reported(pm_home):
    from pm_vector import db
    from pm_vector.bench.load_changes import ChangeStream
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    with ChangeStream(items=300, dim=32, rate=10.0, sample_s=0.1) as cs:
        name = cs.name
        with ServiceThread(ServiceSettings(pool_max=2, request_log_retention_days=0, sync_interval_s=1)):
            assert cs.warm(timeout=120) >= 0
            cs.start()
            time.sleep(2.0)
            cs.stop()
            cs.drain(timeout=60)
        r = cs.report()
        assert r["errors"] == 0 and r["changes"] >= 10
        assert r["delay_s"]["unapplied"] == 0 and r["delay_s"]["p50"] is not None
        assert r["lag_s"]["p99"] is not None and r["lag_s"]["p99"] >= 0
        assert db.sync_status(name)["queued"] == 0
    assert name not in {c["name"] for c in db.list_collections()}  # dropped on the way out
