"""The bulk merge in a process of its own, at a lower CPU priority: ``python -m
pm_vector.service.merge_process NICE`` with the database URL on stdin (never on the command line,
where every user of the machine could read a password in it), started by
:func:`pm_vector.service.sync_worker.merge_in_background`.

A merge is a new embedding job of the active run's parameters (:mod:`pm_vector.db.runs.merge`):
minutes of numpy, faiss and Python on the machine's cores. It ran on a thread of the sync's
process, so it shared that process's GIL with every sync pass and its cores with everything: in a
10-minute stream of 100 changes a second at 100,000 items the sync fell seconds behind whenever a
merge was building (delay p99 9.9 s over 300 s, a merge building the whole time). Here it shares
nothing with the sync but the database, and runs ``NICE`` levels below it (Linux's nice value; the
sync and the database keep their priority), so the sync's passes take the cores first.

Given a nice value above 0 it is also scheduled as Linux's ``SCHED_IDLE`` (:func:`idle_policy`),
and so are its jobs' server backends where it may (:mod:`pm_vector.db.postgres.priority`).
``python -m pm_vector.service.merge_process NICE COLLECTION [normal]`` merges that collection whether
or not its merge is due, its server backends at normal priority with ``normal`` (``pm-vector bench merge``).
It writes one JSON object to stdout: ``{"nice": its threads' lowest nice value, "idle": whether
SCHED_IDLE took on every thread, "merges": {collection: {"run_id", "seconds", "switch_s", "switch", "catch_up"} or why it failed},
"sessions_idle": how many of its sessions' backends took SCHED_IDLE}``.
It ends by itself when the process that started it is gone (its parent's pid changes), leaving a
job it had started to be marked abandoned as any killed job's (:func:`pm_vector.db.runs.jobs.cleanup`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from ..db.postgres import priority
from ..db.runs.merge import merge_due, merge_each
from .sync_worker import MERGE_APPLICATION_NAME, MERGE_CPUS_VAR, lower_request_priority

#: how often the process looks whether the one that started it is still there
PARENT_CHECK_S = 1.0


def _orphaned_exit(parent: int) -> None:
    while True:
        time.sleep(PARENT_CHECK_S)
        if os.getppid() != parent:
            os._exit(3)


def _threads() -> list[int]:
    """This process's threads (their Linux ids; ``[0]``, the calling one, where there is no ``/proc``)."""
    try:
        return sorted(int(t) for t in os.listdir("/proc/self/task"))
    except OSError:
        return [0]


def idle_policy() -> bool:
    """Linux: every thread of this process (and the threads they start, faiss's among them) scheduled
    as ``SCHED_IDLE``, run only when no other task wants the core. A nice value lowers a process's
    share of a busy core but not the wait of a task that wakes up behind it: a single-row writer
    wakes twice a change (its statement, its commit), and beside a merge at nice 10 on 2 cores it got
    166-205 commits a second where plain pgvector's got 913 (docs/benchmarks.md, "Writes").

    Every thread, not only the calling one: a scheduling policy is a thread's, and a thread keeps the
    one it was started with. numpy's BLAS pool is started at its import, before this runs, and
    stayed at normal priority doing the merge's matrix products (12 s of the 75 s of CPU a merge's
    threads had used, beside a writer on 2 cores). Returns whether every thread took it."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    for tid in _threads():
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except OSError:  # a thread that ended meanwhile; or not allowed: _is_idle says which
            pass
    return _is_idle()


def _each_thread(read) -> list:
    """``read(tid)`` of each thread of this process (a thread that ended meanwhile left out)."""
    out = []
    for tid in _threads():
        try:
            out.append(read(tid))
        except OSError:
            pass
    return out


def _is_idle() -> bool:
    """Is every thread of this process scheduled ``SCHED_IDLE``?"""
    return hasattr(os, "SCHED_IDLE") and all(p == os.SCHED_IDLE for p in _each_thread(os.sched_getscheduler))


def _nice() -> int:
    """The lowest nice value of this process's threads (the least-lowered thread's): what the
    JSON's ``nice`` reports."""
    return min(_each_thread(lambda tid: os.getpriority(os.PRIO_PROCESS, tid)), default=0)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the service stops us
    nice = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    url = sys.stdin.read().strip()
    os.environ["PGAPPNAME"] = MERGE_APPLICATION_NAME  # (its sessions, in pg_stat_activity; a name in the URL wins)
    # the CPUs its starter gave it (the service's merge_cpus): every thread and pool, and its sessions'
    # backends (priority.lower reads the affinity back)
    cpus = os.environ.get(MERGE_CPUS_VAR, "")
    priority.confine(frozenset(int(c) for c in cpus.split(",")) if cpus else None)
    if nice > 0:
        # every thread, numpy's BLAS threads started at its import included (a nice value is a thread's)
        lower_request_priority(nice, None)
        idle_policy()
        # its jobs' server backends too, where this process may (``normal``: not; the benchmark's baseline)
        priority.set_background(len(sys.argv) < 4 or sys.argv[3] != "normal")
    threading.Thread(target=_orphaned_exit, args=(os.getppid(),), daemon=True).start()
    out: dict = {"nice": _nice() if hasattr(os, "getpriority") else 0, "idle": _is_idle(), "merges": {},
                 "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}
    try:
        done = merge_due(url) if len(sys.argv) < 3 else merge_each([sys.argv[2]], url=url)
        for name, res in done.items():
            out["merges"][name] = res if isinstance(res, str) else {
                "run_id": res["run_id"], "seconds": res["seconds"], "switch_s": res["switch_s"],
                "switch": res["switch"], "catch_up": res["catch_up"]}
    except Exception as exc:  # noqa: BLE001 - said to the sync worker, which logs it
        out["error"] = type(exc).__name__
    out["sessions_idle"] = priority.lowered()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
