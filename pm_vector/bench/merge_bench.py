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

Reported per phase: the writer's commits a second (median, the 10th percentile of the seconds, the
lowest), the merge's seconds and its output (whether the sessions took ``SCHED_IDLE``), and the
server's WAL from the merge's start until the next phase (``wal_mb``, ``wal_fpi``: the whole pages
in it; from ``pg_stat_wal``, the writer's own included, and what the server's autovacuum writes of
the new run's tables meanwhile): every commit of the writer waits for the WAL before it to be flushed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import numpy as np
from psycopg import sql

from ..db import collection_info, connect, database_url
from ..db.errors import NoActiveRunError
from ..db.postgres import priority
from ..service.sync_worker import MERGE_NICE as BACKGROUND_NICE, merge_process_command


class _Writer:
    """The single-row writer on a thread of its own: commits counted per second."""

    def __init__(self, url: str, table: sql.Composable, dim: int):
        self.url, self.table, self.dim = url, table, int(dim)
        self.seconds: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        row = [0.5] * self.dim
        stmt = sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(self.table)
        with connect(self.url) as conn:
            n, t0 = 0, time.monotonic()
            while not self._stop.is_set():
                conn.execute(stmt, [row])
                conn.commit()
                n += 1
                now = time.monotonic()
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
        (``per_s``: each second's, in order)."""
        c = np.array([n for t, n in self.seconds if t0 + 1.0 <= t <= t1], dtype=float)
        if c.size == 0:
            return {"seconds": 0}
        return {"seconds": int(c.size), "median": float(np.median(c)), "p10": float(np.percentile(c, 10)),
                "min": float(c.min()), "per_s": [int(x) for x in c]}


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


def run(name: str, *, dim: int = 128, alone_s: float = 10.0, url: str | None = None,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The benchmark (module doc). ``alone_s``: the writer's seconds alone, before the merges and
    between them. Returns ``{"collection", "dim", "alone": {...}, and per phase {"nice", "idle",
    "sessions_idle", "merge_s", "run_id", "writer": {"seconds", "median", "p10", "min", "per_s"},
    "stages_s": the merge's stages, "wal_mb", "wal_fpi"}}, "idle_load" and (on more than one CPU)
    "background_load": the controls' {"processes", "idle", "cpus", "writer"}, "ratio_median":
    background's median over process_idle's}``."""
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
