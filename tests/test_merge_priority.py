"""The merge process lowers every thread it has, not only the one that asks
(:func:`pm_vector.service.merge_process.idle_policy`, and
:func:`pm_vector.service.sync_worker.lower_request_priority` for the nice value):
Linux keeps a scheduling policy and a nice value per thread, and numpy's BLAS pool, started at its
import, stayed at normal priority doing a merge's matrix products beside a writer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not (sys.platform.startswith("linux") and hasattr(os, "SCHED_IDLE")),
                                reason="per-thread scheduling policies are Linux's")

#: a process with a thread started before it lowers itself (as numpy's BLAS pool is), then one after:
#: each thread's policy and nice value, and what the process reports
_CHILD = r"""
import json, os, sys, threading
import numpy  # (its BLAS pool, where it has one, starts here)
from pm_vector.service import merge_process as mp
from pm_vector.service.sync_worker import lower_request_priority

stop = threading.Event()
before = threading.Thread(target=stop.wait, daemon=True)
before.start()
lower_request_priority(int(sys.argv[1]), None)
took = mp.idle_policy()
after = threading.Thread(target=stop.wait, daemon=True)
after.start()
tids = mp._threads()
out = {"took": took, "idle": mp._is_idle(), "nice": mp._nice(), "threads": len(tids),
       "before": before.native_id in tids, "after": after.native_id in tids,
       "policies": [os.sched_getscheduler(t) == os.SCHED_IDLE for t in tids],
       "nices": [os.getpriority(os.PRIO_PROCESS, t) for t in tids]}
stop.set()
print(json.dumps(out))
"""


def test_every_thread_of_the_merge_process_is_lowered():
    """A thread started before the process lowers itself, one started after, and the main thread all
    run ``SCHED_IDLE`` at the nice value asked; the process says so (``idle`` is every thread's). With
    the calling thread alone lowered (``os.nice``, ``sched_setscheduler(0, ...)``) the thread started
    before kept nice 0 and ``SCHED_OTHER``."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    got = json.loads(subprocess.run([sys.executable, "-c", _CHILD, "5"], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    assert got["before"] and got["after"] and got["threads"] >= 3
    assert got["nices"] == [min(19, base + 5)] * got["threads"] and got["nice"] == min(19, base + 5)
    assert all(got["policies"]) and got["took"] is True and got["idle"] is True
