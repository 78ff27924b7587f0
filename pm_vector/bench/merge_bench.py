"""``pm-vector bench merge NAME``: what a bulk merge in the background costs a writer beside it.

A plain single-row writer (one session: INSERT of one row of ``dim`` floats into a scratch table,
then COMMIT) runs throughout and its commits are counted each second: first alone, then beside a
merge of collection NAME as the service's sync worker runs one (``python -m
pm_vector.service.merge_process NICE NAME``, a process of its own), three times (:data:`PHASES`):
``normal``, at ``nice`` 0 (the process and its server sessions at normal priority, as ``pm-vector
merge``); ``process_idle``, the process at the sync worker's nice value and ``SCHED_IDLE`` but its
server sessions at normal priority (the service's merge before background sessions); and
``background``, the process and, where it may, its jobs' backends at ``SCHED_IDLE``
(:mod:`pm_vector.db.postgres.priority`: the service's merge). Each merge is a real one: it builds a
new run of the collection and switches to it. The scratch table is dropped at the end.

Before the merges, a control (``idle_load``): the writer beside nothing but CPU work at the lowest
priority there is, one busy-looping process per core at ``SCHED_IDLE`` (:func:`_idle_load`), for as
long as it ran alone. What a merge at ``SCHED_IDLE`` costs the writer can be no less than what that
costs it: on a machine whose cores are shared below the operating system (a virtual machine's, a
core's two hyperthreads), a busy core slows the task that wakes on it at any priority. A second
control (``background_load``): one busy process per background CPU
(:func:`pm_vector.db.postgres.priority.background_cpus`, the service's default set: the upper half),
confined there, at normal priority -- CPU work kept to the cores the service leaves its sync and
merges (absent on a one-CPU machine).

Two controls of the disk, with no merge and no CPU to speak of (:func:`_disk_load`: one process at
``SCHED_IDLE``, on the background CPUs where there are any, writing 1 MB blocks to files in a
scratch directory, ``scratch_dir``: put it on the server's disk for the control to mean anything):
``flush_load`` writes a file of ``load_mb`` MB as fast as it can, forces it to the disk (``fsync``)
and deletes it, again and again; ``writeback_load`` writes the same files at 60 MB a second and
keeps them (four in turn), forcing nothing: the kernel is asked to write them back as they come, and
does not wait for the disk's cache. A merge writes the new run's tables, which the server forces to
the disk at its checkpoints; each COMMIT of the writer forces the WAL before it to the same disk.

Reported per phase: the writer's commits a second (median, the 10th percentile of the seconds, the
lowest) and its COMMITs' milliseconds (``commit_ms``: mean, p50, p99, max), the merge's seconds and
its output (whether the sessions took ``SCHED_IDLE``), and the server's WAL from the merge's start
until the next phase (``wal_mb``, ``wal_fpi``: the whole pages in it; from ``pg_stat_wal``, the
writer's own included, and what the server's autovacuum writes of the new run's tables meanwhile):
every commit of the writer waits for the WAL before it to be flushed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import tempfile
import time
from array import array
from typing import Any, Callable

import numpy as np
from psycopg import sql

from ..db import collection_info, connect, database_url
from ..db.errors import NoActiveRunError
from ..db.postgres import priority
from ..service.sync_worker import MERGE_NICE as BACKGROUND_NICE, merge_process_command


class _Writer:
    """The single-row writer on a thread of its own: commits counted per second, each COMMIT timed
    (``commit_at``: when it returned, ``commit_s``: how long it took)."""

    def __init__(self, url: str, table: sql.Composable, dim: int):
        self.url, self.table, self.dim = url, table, int(dim)
        self.seconds: list[tuple[float, int]] = []
        self.commit_at, self.commit_s = array("d"), array("d")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        row = [0.5] * self.dim
        stmt = sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(self.table)
        with connect(self.url) as conn:
            n, t0 = 0, time.monotonic()
            while not self._stop.is_set():
                conn.execute(stmt, [row])
                c0 = time.monotonic()
                conn.commit()
                now = time.monotonic()
                self.commit_at.append(now)
                self.commit_s.append(now - c0)
                n += 1
                if now - t0 >= 1.0:
                    self.seconds.append((now, n))
                    n, t0 = 0, now

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> dict[str, Any]:
        """The writer's commits a second over the whole seconds that ended within [t0, t1]
        (``per_s``: each second's, in order), and ``commit_ms``: the mean, p50, p99 and max of the
        COMMITs that returned within [t0, t1], in milliseconds."""
        c = np.array([n for t, n in self.seconds if t0 + 1.0 <= t <= t1], dtype=float)
        if c.size == 0:
            return {"seconds": 0}
        n = len(self.commit_s)  # (copies: the writer's thread appends to both; commit_at first)
        at = np.array(self.commit_at[:n], dtype=float)
        ms = 1e3 * np.array(self.commit_s[:n], dtype=float)[(at >= t0) & (at <= t1)]
        commit = ({"mean": round(float(ms.mean()), 3), "p50": round(float(np.percentile(ms, 50)), 3),
                   "p99": round(float(np.percentile(ms, 99)), 3), "max": round(float(ms.max()), 3)}
                  if ms.size else None)
        return {"seconds": int(c.size), "median": float(np.median(c)), "p10": float(np.percentile(c, 10)),
                "min": float(c.min()), "per_s": [int(x) for x in c], "commit_ms": commit}


#: the phases: (name, the merge process's nice value, its server sessions' priority)
PHASES = (("normal", 0, "normal"), ("process_idle", BACKGROUND_NICE, "normal"), ("background", BACKGROUND_NICE, "idle"))


def _merge(url: str, name: str, nice: int, sessions: str) -> dict[str, Any]:
    argv, here = merge_process_command(nice, name, sessions)
    t = time.perf_counter()
    proc = subprocess.run(argv, input=url, capture_output=True, text=True, cwd=here, check=False)
    out = json.loads(proc.stdout) if proc.stdout.strip() else {"error": proc.stderr.strip()[-300:]}
    res = out.get("merges", {}).get(name)
    if not isinstance(res, dict):
        raise RuntimeError(f"the merge of {name!r} failed: {res or out.get('error')}")
    return {"nice": out.get("nice"), "idle": out.get("idle"), "sessions_idle": out.get("sessions_idle"),
            "merge_s": round(time.perf_counter() - t, 2), "run_id": res["run_id"]}


#: a process that busy-loops at SCHED_IDLE (where it may; else at nice 19): the control's load
_BUSY = ("import os\ntry:\n    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nexcept (AttributeError, OSError):\n"
         "    os.nice(19)\nprint(os.sched_getscheduler(0) == getattr(os, 'SCHED_IDLE', -1), flush=True)\nwhile True:\n    pass\n")


#: a process that busy-loops at normal priority on the CPUs of its argument
_BUSY_ON = ("import os, sys\nos.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})\nprint(False, flush=True)\n"
            "while True:\n    pass\n")


def _idle_load(writer: "_Writer", seconds: float, cpus: frozenset[int] | None = None) -> dict[str, Any]:
    """The controls (module doc): one busy process per core at ``SCHED_IDLE``, or with ``cpus`` one
    per CPU of them confined there at normal priority, for ``seconds``, the writer counted."""
    if cpus:
        argv = [[sys.executable, "-c", _BUSY_ON, ",".join(map(str, sorted(cpus)))]] * len(cpus)
    else:
        argv = [[sys.executable, "-c", _BUSY]] * (os.cpu_count() or 1)
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, text=True) for a in argv]
    try:
        idle = all(p.stdout.readline().strip() == "True" for p in procs)
        t0 = time.monotonic()
        time.sleep(seconds)
        return {"processes": len(procs), "idle": idle, "cpus": sorted(cpus) if cpus else None,
                "writer": writer.between(t0, time.monotonic())}
    finally:
        for p in procs:
            p.kill()
            p.wait()


#: a process that writes 1 MB blocks to files in a directory (argv: the directory, MB a file, the mode, its
#: CPUs or ""), at SCHED_IDLE (else nice 19): ``flush``, a file as fast as it can, fsync'd and deleted;
#: ``writeback``, at 60 MB a second, four files kept in turn, never fsync'd: every 8 MB the kernel is
#: asked to start writing them back (``posix_fadvise`` DONTNEED: no wait, no flush of the disk's cache)
_DISK = """import os, sys, time
d, mb, mode, cpus = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if cpus:
    os.sched_setaffinity(0, {int(c) for c in cpus.split(',')})
try:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
except (AttributeError, OSError):
    os.nice(19)
buf = os.urandom(1 << 20)
print(True, flush=True)
i = 0
while True:
    p = os.path.join(d, 'load%d' % (i % 4))
    i += 1
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for b in range(mb):
        os.write(fd, buf)
        if mode == 'writeback':
            if b % 8 == 7 and hasattr(os, 'posix_fadvise'):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            time.sleep(1 / 60)
    if mode == 'flush':
        os.fsync(fd)
    os.close(fd)
    if mode == 'flush':
        os.unlink(p)
"""


def _disk_load(writer: "_Writer", seconds: float, mode: str, scratch_dir: str, load_mb: int,
               cpus: frozenset[int] | None) -> dict[str, Any]:
    """The disk's controls (module doc): one process writing files of ``load_mb`` MB in a directory
    of its own under ``scratch_dir`` (``mode`` ``flush`` or ``writeback``), for ``seconds``, the
    writer counted (``running``: the process started and was still writing at the end); the
    directory is removed after."""
    d = tempfile.mkdtemp(prefix="pm_vector_bench_disk_", dir=scratch_dir)
    proc = subprocess.Popen([sys.executable, "-c", _DISK, d, str(int(load_mb)), mode,
                             ",".join(map(str, sorted(cpus))) if cpus else ""], stdout=subprocess.PIPE, text=True)
    try:
        started = proc.stdout.readline().strip() == "True"
        t0 = time.monotonic()
        time.sleep(seconds)
        return {"mode": mode, "mb": int(load_mb), "cpus": sorted(cpus) if cpus else None,
                "running": started and proc.poll() is None, "writer": writer.between(t0, time.monotonic())}
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(d, ignore_errors=True)


def _stages(url: str, run_id: int) -> dict[str, float]:
    """The merge's run's stage seconds (its ``timings``: load, embed, write, class rows, index, switch)."""
    with connect(url) as conn:
        t = conn.execute("SELECT timings FROM pm_vector.embedding_runs WHERE id = %s", [run_id]).fetchone()[0] or {}
    return {k: round(float(v), 2) for k, v in t.items() if k.endswith("_s") and "." not in k}


def _wal(url: str) -> tuple[float, int]:
    """The server's WAL so far: bytes and full-page images (``pg_stat_wal``)."""
    with connect(url) as conn:
        b, f = conn.execute("SELECT wal_bytes, wal_fpi FROM pg_stat_wal").fetchone()
    return float(b), int(f)


def run(name: str, *, dim: int = 128, alone_s: float = 10.0, scratch_dir: str | None = None, load_mb: int = 200,
        url: str | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The benchmark (module doc). ``alone_s``: the writer's seconds alone, before the merges and
    between them, and each control's; ``scratch_dir`` (default the system's temporary directory) and
    ``load_mb``: the disk controls'. Returns ``{"collection", "dim", "alone": {...}, and per phase
    {"nice", "idle", "sessions_idle", "merge_s", "run_id", "writer": {"seconds", "median", "p10",
    "min", "per_s", "commit_ms": {"mean", "p50", "p99", "max"}}, "stages_s": the merge's stages,
    "wal_mb", "wal_fpi"}}, "idle_load" and (on more than one CPU) "background_load": the CPU
    controls' {"processes", "idle", "cpus", "writer"}, "flush_load" and "writeback_load": the disk
    controls' {"mode", "mb", "cpus", "running", "writer"}, "ratio_median": background's median over
    process_idle's}``."""
    say = progress or (lambda _m: None)
    url = url or database_url()
    if collection_info(name)["active_run_id"] is None:  # (CollectionNotFoundError: no such collection)
        raise NoActiveRunError(f"collection {name!r} has no active run: nothing to merge; run "
                               f"`pm-vector embed {name}` first.")
    table = sql.Identifier("public", f"bench_merge_writer_{os.getpid()}")
    with connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, v float8[] NOT NULL)").format(table))
    writer = _Writer(url, table, dim)
    out: dict[str, Any] = {"collection": name, "dim": int(dim)}
    try:
        writer.start()
        t0 = time.monotonic()
        time.sleep(alone_s)
        out["alone"] = writer.between(t0, time.monotonic())
        say(f"writer alone: {out['alone'].get('median')} commits a second")
        out["idle_load"] = _idle_load(writer, alone_s)
        say(f"writer beside a busy process per core at SCHED_IDLE: {out['idle_load']['writer'].get('median')} a second")
        cpus = priority.background_cpus("auto")
        if cpus:
            out["background_load"] = _idle_load(writer, alone_s, cpus)
            say(f"writer beside a busy process on each background CPU ({sorted(cpus)}): "
                f"{out['background_load']['writer'].get('median')} a second")
        for mode in ("flush", "writeback"):
            out[f"{mode}_load"] = _disk_load(writer, alone_s, mode, scratch_dir or tempfile.gettempdir(), load_mb, cpus)
            say(f"writer beside files of {load_mb} MB written ({mode}): "
                f"{out[f'{mode}_load']['writer'].get('median')} a second")
        for phase, nice, sessions in PHASES:
            say(f"a merge of {name} at nice {nice}, its sessions {sessions}, beside the writer ...")
            t0, w0 = time.monotonic(), _wal(url)
            m = _merge(url, name, nice, sessions)
            out[phase] = {**m, "writer": writer.between(t0, time.monotonic()), "stages_s": _stages(url, m["run_id"])}
            say(f"{phase}: merge {m['merge_s']} s, writer median {out[phase]['writer'].get('median')} a second")
            time.sleep(alone_s / 2)
            w1 = _wal(url)
            out[phase].update(wal_mb=round((w1[0] - w0[0]) / 1e6, 1), wal_fpi=w1[1] - w0[1])
    finally:
        writer.stop()
        with connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
    n, b = out["process_idle"]["writer"].get("median"), out["background"]["writer"].get("median")
    out["ratio_median"] = round(b / n, 3) if n and b else None
    return out
