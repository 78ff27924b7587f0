"""The service's background work on a set of CPUs (:mod:`pm_vector.db.postgres.priority`: the sync
process, the merges it starts and their sessions' backends): the set a setting names, every thread of
the confining process on it (threads started before and after), its numerical libraries' pools sized
to it, a process it starts inside it; and the sync process of a worker, with its session's backend,
confined where the server runs on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pm_vector.db.postgres import priority
from pm_vector.errors import InvalidInputError

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")

#: a process with a thread started before it confines itself (as numpy's BLAS pool is), then one after,
#: then a child process: each one's CPUs, and the thread pools' sizes
_CHILD = r"""
import json, os, subprocess, sys, threading
import numpy
from threadpoolctl import threadpool_info
from pm_vector.db.postgres import priority

stop = threading.Event()
before = threading.Thread(target=stop.wait, daemon=True)
before.start()
cpus = frozenset(int(c) for c in sys.argv[1].split(","))
n = priority.confine(cpus)
after = threading.Thread(target=stop.wait, daemon=True)
after.start()
tids = [int(t) for t in os.listdir("/proc/self/task")]
child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                       capture_output=True, text=True, check=True).stdout
out = {"n": n, "threads": [sorted(os.sched_getaffinity(t)) for t in tids], "before": before.native_id in tids,
       "after": after.native_id in tids, "pools": [p["num_threads"] for p in threadpool_info()],
       "child": json.loads(child), "confined_to": sorted(priority.confined_to() or [])}
stop.set()
print(json.dumps(out))
"""


def test_the_setting_names_a_set_of_the_cpus_this_process_may_use():
    allowed = sorted(os.sched_getaffinity(0))
    auto = priority.background_cpus("auto")
    if len(allowed) > 1:
        assert auto == frozenset(allowed[len(allowed) // 2:]) and 0 < len(auto) < len(allowed)
    else:
        assert auto is None  # (one CPU: nowhere to leave free)
    assert priority.background_cpus("off") is None and priority.background_cpus("") is None
    assert priority.background_cpus(str(allowed[-1])) == frozenset({allowed[-1]})
    for bad in ("x", "1,,2", str(max(allowed) + 1), "-1"):
        with pytest.raises(InvalidInputError, match="background_cpus"):
            priority.background_cpus(bad)
    assert priority.confine(None) == 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to confine a process to one")
def test_every_thread_its_pools_and_its_children_keep_to_the_set():
    """A thread started before ``confine``, one after and the main thread run on the set alone, the
    BLAS pool (and any OpenMP one) is sized to it, a process started then inherits it, and the process
    knows itself confined (``confined_to``, what a merge process reads). Without it: every CPU."""
    cpu = max(os.sched_getaffinity(0))
    got = json.loads(subprocess.run([sys.executable, "-c", _CHILD, str(cpu)], capture_output=True, text=True,
                                    check=True, timeout=120).stdout)
    assert got["before"] and got["after"] and got["n"] >= 2
    assert got["threads"] == [[cpu]] * len(got["threads"]) and got["child"] == [cpu]
    assert got["pools"] and all(n == 1 for n in got["pools"]) and got["confined_to"] == [cpu]
    free = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                          capture_output=True, text=True, check=True).stdout
    assert json.loads(free) == sorted(os.sched_getaffinity(0)) and len(json.loads(free)) > 1


#: pools sized to one thread: the BLAS and OpenMP pools loaded before, and faiss's as imported after
_POOLS = r"""
import json
import numpy
from threadpoolctl import threadpool_info
from pm_vector.db.postgres import priority

before = [p["num_threads"] for p in threadpool_info()]
priority.size_pools(1)
import faiss
print(json.dumps({"before": before, "after": [p["num_threads"] for p in threadpool_info()],
                  "faiss": faiss.omp_get_max_threads()}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs for a pool of more than one")
def test_pools_sized_to_one_thread_before_and_after_their_libraries_load():
    """What an unconfined sync process does at its start (``size_pools(1)``): the pools loaded before
    (numpy's BLAS, OpenMP) run one thread, and so does faiss imported after (they had more)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                             "MKL_NUM_THREADS")}
    got = json.loads(subprocess.run([sys.executable, "-c", _POOLS], capture_output=True, text=True, check=True,
                                    timeout=120, env=env).stdout)
    assert max(got["before"]) > 1
    assert got["after"] and all(n == 1 for n in got["after"]) and got["faiss"] == 1


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs for a pool of more than one")
def test_a_live_sync_process_not_confined_runs_its_pools_on_one_thread(db):
    """The sync process of the default setting (``background_cpus`` off) asked for its pools after a
    pass: every one at one thread, though this process's (started without the variables) has more."""
    from pm_vector.service.sync_worker import SyncProcess

    env_vars = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {v: os.environ.pop(v) for v in env_vars if v in os.environ}
    url = db.database_url()
    proc = SyncProcess(url, priority.background_cpus("off"))
    try:
        proc(url)  # (a pass: its libraries loaded)
        got = proc.pools()
        assert got and all(n == 1 for n in got), got
        probe = subprocess.run([sys.executable, "-c", "import numpy, faiss; from pm_vector.db.postgres import "
                                "priority; print(max(priority.pool_sizes()))"], capture_output=True, text=True,
                               check=True, timeout=120).stdout
        assert int(probe) > 1  # (without the rule the pools would have more: the test can fail)
    finally:
        proc.close()
        os.environ.update(saved)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to confine a process to one")
def test_a_sync_process_and_its_backend_run_on_the_background_cpus(db):
    """A sync process given ``background_cpus`` "auto" runs a pass on the upper half of
    the CPUs, every thread of it, and so does its session's backend on the embedded server (local, the
    same user); with "off" it may run anywhere. The service's setting reads the variable."""
    from pm_vector.service.settings import ServiceSettings
    from pm_vector.service.sync_worker import SyncProcess

    from pm_vector.service.sync_worker import SyncWorker

    url = db.database_url()
    want = priority.background_cpus("auto")
    assert ServiceSettings().background_cpus == "off" and SyncWorker(url, 1.0)._pass.cpus is None  # (the default)
    for word in ("off", str(max(want))):
        os.environ["PM_VECTOR_SERVICE_BACKGROUND_CPUS"] = word
        try:
            assert ServiceSettings.from_env().background_cpus == word
        finally:
            del os.environ["PM_VECTOR_SERVICE_BACKGROUND_CPUS"]

    def backends():
        with db.connect() as c:
            return {r[0] for r in c.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                                            "AND pid <> pg_backend_pid()").fetchall()}

    for cpus, expect in ((want, sorted(want)), (priority.background_cpus("off"), sorted(os.sched_getaffinity(0)))):
        before = backends()
        proc = SyncProcess(url, cpus)
        try:
            proc(url)
            tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
            assert tids and all(sorted(os.sched_getaffinity(t)) == expect for t in tids)
            new = backends() - before  # (the sync process's session, kept from pass to pass)
            assert new and all(sorted(os.sched_getaffinity(b)) == expect for b in new)
        finally:
            proc.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to confine a process to one")
def test_a_merge_process_runs_on_the_cpus_its_starter_gives_it(db):
    """``merge_cpus``: the merge process's every thread on the CPUs the variable names (the sync process
    sets it for the merges it starts; nothing due here, so it merges nothing); without it, anywhere.
    The setting reads its variable and refuses CPUs this process may not use."""
    from pm_vector.service.merge_process import __name__ as mod
    from pm_vector.service.settings import ServiceSettings
    from pm_vector.service.sync_worker import MERGE_CPUS_VAR

    cpu = max(os.sched_getaffinity(0))
    for cpus, want in ((str(cpu), [cpu]), (None, sorted(os.sched_getaffinity(0)))):
        env = {k: v for k, v in os.environ.items() if k != MERGE_CPUS_VAR}
        if cpus:
            env[MERGE_CPUS_VAR] = cpus
        got = subprocess.run([sys.executable, "-m", mod, "0"], input=db.database_url(), capture_output=True,
                             text=True, env=env, check=True, timeout=120)
        out = json.loads(got.stdout)
        assert out["cpus"] == want and out["merges"] == {} and "error" not in out
    os.environ["PM_VECTOR_SERVICE_MERGE_CPUS"] = "off"
    try:
        assert ServiceSettings.from_env().merge_cpus == "off" and ServiceSettings().merge_cpus == "auto"
    finally:
        del os.environ["PM_VECTOR_SERVICE_MERGE_CPUS"]
    with pytest.raises(InvalidInputError, match="merge_cpus"):
        ServiceSettings(merge_cpus=str(cpu + 1))


def test_a_sync_process_and_its_backend_run_sync_nice_levels_below(db):
    """``sync_nice``: every thread of the sync process and its session's backend on the embedded server
    (local, the same user) run that many nice levels below where they started (at most 19); with 0
    as they started. The setting reads its variable and keeps to 0..19."""
    from pm_vector.service.settings import ServiceSettings
    from pm_vector.service.sync_worker import SYNC_APPLICATION_NAME, SyncProcess

    url = db.database_url()
    mine = os.getpriority(os.PRIO_PROCESS, 0)

    def backends():
        with db.connect() as c:
            return {r[0] for r in c.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                                            "AND pid <> pg_backend_pid()").fetchall()}

    with db.connect() as c:  # (a backend's priority as the server starts it)
        start = os.getpriority(os.PRIO_PROCESS, c.info.backend_pid)
    for nice in (7, 0):
        before = backends()
        proc = SyncProcess(url, nice=nice)
        try:
            proc(url)
            tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
            assert tids and all(os.getpriority(os.PRIO_PROCESS, t) == min(19, mine + nice) for t in tids)
            new = backends() - before  # (the sync process's session, kept from pass to pass)
            assert new and all(os.getpriority(os.PRIO_PROCESS, b) == min(19, start + nice) for b in new)
            with db.connect() as c:  # (named, as pg_stat_activity shows it: pm_vector.bench.machine reads it)
                names = {r[0] for r in c.execute("SELECT application_name FROM pg_stat_activity WHERE pid = ANY(%s)",
                                                  [sorted(new)]).fetchall()}
            assert names == {SYNC_APPLICATION_NAME}
        finally:
            proc.close()
    assert ServiceSettings().sync_nice == 10
    os.environ["PM_VECTOR_SERVICE_SYNC_NICE"] = "3"
    try:
        assert ServiceSettings.from_env().sync_nice == 3
    finally:
        del os.environ["PM_VECTOR_SERVICE_SYNC_NICE"]
    for bad in (-1, 20):
        with pytest.raises(InvalidInputError, match="sync_nice"):
            ServiceSettings(sync_nice=bad)
