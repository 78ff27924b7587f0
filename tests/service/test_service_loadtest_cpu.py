"""`pm-vector bench load`'s CPU accounting: the service, the database and the load generator are
measured apart (psutil), per answered request; bad ``workers`` is refused before anything starts."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest


def _burn(seconds: float) -> None:
    t = time.process_time()
    while time.process_time() - t < seconds:
        sum(range(1000))


def test_cpu_of_a_process_and_of_a_parents_children_is_measured_apart():
    import os

    from pm_vector.bench.loadtest import _CPU

    own = _CPU([os.getpid()])
    kids = _CPU(children_of=os.getpid())
    own.start()
    kids.start()
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(5)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        _burn(0.2)
        time.sleep(1.0)  # the child's 0.4 s of CPU are done, it sleeps (still alive: sampled at stop)
        mine, theirs = own.stop(), kids.stop()
    finally:
        child.kill()
        child.wait()
    assert 0.15 <= mine < 1.0
    assert 0.3 <= theirs < 1.0  # the child's CPU, not ours


def test_cpu_report_is_per_answered_request_and_share_of_wall_time():
    from pm_vector.bench.loadtest import _cpu_report

    r = _cpu_report({"ok": 200, "seconds": 2.0}, 1.0, None, 0.1)
    assert r["server_cpu_ms_per_request"] == 5.0 and r["server_cpu_share"] == 0.5
    assert r["db_cpu_ms_per_request"] is None and r["db_cpu_share"] is None
    assert r["generator_cpu_ms_per_request"] == 0.5 and r["generator_cpu_share"] == 0.05


@pytest.mark.parametrize("workers", [0, 17, True])
def test_bad_worker_counts_are_refused_before_anything_starts(workers):
    from pm_vector.bench.loadtest import run_load

    with pytest.raises(ValueError, match="workers must be an integer in 1..16"):
        run_load((10,), workers=workers, url="http://127.0.0.1:1", api_key="x")
