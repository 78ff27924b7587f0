"""Whose CPU a benchmark's phase used (:class:`pm_vector.bench.machine.CpuParts`): this process's
threads, the processes it registers and those they start, and the server's backends by their
session's ``application_name``, each in its part; what ran before the phase is not counted."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil

SPIN = 0.4  # CPU seconds each piece of work uses


def _spin(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU."""
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        pass


#: a process that says "ready", waits for a line, uses SPIN s of CPU in a child of its own, says
#: "done" and waits for its stdin to close
_PARENT = f"""
import subprocess, sys
print("ready", flush=True)
sys.stdin.readline()
subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\nwhile time.process_time() - t < {SPIN}: pass"])
print("done", flush=True)
sys.stdin.read()
"""


def _backend_spin(conn, seconds: float) -> float:
    """Run statements on ``conn`` until its backend used ``seconds`` of CPU; returns what it used."""
    p = psutil.Process(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
    t0 = sum(p.cpu_times()[:2])
    while sum(p.cpu_times()[:2]) - t0 < seconds:
        conn.execute("SELECT count(*) FROM generate_series(1, 300000)")
    return sum(p.cpu_times()[:2]) - t0


def test_each_process_thread_and_session_is_in_its_part(db):
    from pm_vector.bench.machine import BENCH_APP, CHECK_APP, CpuParts
    from pm_vector.service.sync_worker import SYNC_APPLICATION_NAME

    parts = CpuParts(db.connect(autocommit=True, application_name=BENCH_APP))
    assert parts.server_local  # the embedded server runs on this machine
    sync = db.connect(autocommit=True, application_name=SYNC_APPLICATION_NAME)
    check = db.connect(autocommit=True, application_name=CHECK_APP)
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        _backend_spin(sync, 0.2)  # before the phase: not counted
        _spin(0.3)  # (this thread, "bench", before the phase)
        parts.start()
        parts.process(parent.pid, "sync", "merge")
        mine = threading.Thread(target=parts.runs("queries", _spin), args=(SPIN,))
        mine.start()
        parent.stdin.write("go\n")
        parent.stdin.flush()
        used = {"sync": _backend_spin(sync, SPIN), "checks": _backend_spin(check, SPIN)}
        mine.join()
        assert parent.stdout.readline().strip() == "done"
        got = parts.stop()
    finally:
        parent.stdin.close()
        parent.wait(30)
        for c in (sync, check, parts.conn):
            c.close()
    p = got["parts"]
    assert set(p) == {"writer", "sync", "merge", "queries", "checks", "bench", "autovacuum", "postgres", "other"}
    # the thread's CPU exactly (read when it returned: it ended before any sample); the sessions' backends' as read; the registered process's child (its
    # start-up included) in "merge"; the registered process itself, idle, and its backend in "sync"
    assert SPIN - 0.02 <= p["queries"] <= SPIN + 0.05
    assert used["checks"] - 0.02 <= p["checks"] <= used["checks"] + 0.05
    assert used["sync"] - 0.02 <= p["sync"] <= used["sync"] + 0.2
    assert SPIN - 0.02 <= p["merge"] <= SPIN + 0.5
    # the sessions' backends are the server's, the thread and the processes are not
    srv = got["server"]
    assert srv["sync"] <= used["sync"] + 0.05 and srv["checks"] == p["checks"]
    assert srv["queries"] == srv["merge"] == 0.0
    # nothing of the 0.2 + 0.3 s before start; the writer part had no one
    assert p["bench"] < 0.25 and p["writer"] == 0.0
    # the parts make up the machine's busy time
    assert abs(sum(p.values()) - got["busy_s"]) <= 0.05
