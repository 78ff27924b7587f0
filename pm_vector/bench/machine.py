"""What the machine did during a benchmark's phase: its cores' busy time (:func:`busy_cpu_s`), and
who used it (:class:`CpuParts`). ``pm-vector bench writes`` reports both per system beside the
rates: on a machine whose cores are all busy, a faster rate asks for less CPU a change, and the
parts say whose CPU it is (the system's writer, sync and merges, or the benchmark's own queries and
checks).

A part is named by the sessions' ``application_name`` (:data:`APPLICATION_PARTS`: the service's
sync and merge processes name theirs, the benchmark its writer's, queries' and checks'), by the
server process's kind (autovacuum, the other background processes), or by the benchmark process's
thread (:meth:`CpuParts.runs`) and child process (:meth:`CpuParts.process`). Read from ``/proc``
(psutil) and ``pg_stat_activity`` every :meth:`CpuParts.sample`. A thread given by :meth:`CpuParts.runs`
is read again when it returns, and a registered process's descendants once waited for are in its
``children_*`` times; any other process that ends between two samples loses the CPU it used after
the first (at most a sample's interval of it: the writer's process, a server backend). ``other`` is
the machine's busy time no part holds (the rest of the machine, and those losses).
Only a server on this machine can be read so (``server_local`` False: every backend is ``other``).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import psutil

from ..db.postgres import priority
from ..service.sync_worker import MERGE_APPLICATION_NAME, SYNC_APPLICATION_NAME, SYNC_LOCK_APPLICATION_NAME
from .writes_writer import APPLICATION_NAME as WRITER_APP

#: the parts, in the order they are reported
PARTS = ("writer", "sync", "merge", "queries", "checks", "bench", "autovacuum", "postgres", "other")
#: the benchmark's sessions' ``application_name``, one per part (its writer's: :mod:`~pm_vector.bench.writes_writer`)
QUERY_APP, CHECK_APP, BENCH_APP = "pm_vector bench query", "pm_vector bench check", "pm_vector bench"
APPLICATION_PARTS = {WRITER_APP: "writer", QUERY_APP: "queries", CHECK_APP: "checks", BENCH_APP: "bench",
                     SYNC_APPLICATION_NAME: "sync", SYNC_LOCK_APPLICATION_NAME: "sync",
                     MERGE_APPLICATION_NAME: "merge"}


def busy_cpu_s() -> float:
    """The machine's cores' busy seconds so far: all their time but idle and I/O wait."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def _cpu(times) -> float:
    return float(times.user + times.system)


def _read_process(p, part: str, children: str | None) -> dict[tuple[str, int], tuple[str, float]]:
    """Process ``p``'s CPU in ``part`` and, with ``children``, all its descendants' in that part: those
    it has waited for (its ``children_user`` and ``children_system``, theirs included) and those
    running (a child that ends and is waited for moves from the second to the first)."""
    t = p.cpu_times()
    got = {("p", p.pid): (part, _cpu(t))}
    if children:
        total = float(t.children_user + t.children_system)
        for c in p.children(recursive=True):
            try:
                total += _cpu(c.cpu_times())
            except psutil.Error:  # (ended meanwhile: in its parent's children_* once waited for)
                pass
        got[("c", p.pid)] = (children, total)
    return got


class CpuParts:
    """The machine's busy CPU seconds between :meth:`start` and :meth:`stop`, by part (module doc).
    ``conn``: an autocommit connection to the server (``pg_stat_activity``). A thread's
    target wrapped by :meth:`runs` puts this process's thread in a part; :meth:`process` puts a child process (and,
    with ``children``, the processes it starts) in one. :meth:`sample` from any thread (a sampler's,
    every second); :meth:`stop` returns the busy seconds, each part's, the part of each in the
    server's processes and the parts' timeline."""

    def __init__(self, conn):
        self.conn = conn
        self._lock = threading.Lock()
        self._tids: dict[int, str] = {}
        self._ended: set[int] = set()  # threads whose CPU was read when they returned (:meth:`runs`)
        self._procs: dict[int, tuple[str, str | None]] = {}
        self._last: dict[tuple[str, int], float] = {}
        self._parts = dict.fromkeys(PARTS, 0.0)
        self._server = dict.fromkeys(PARTS, 0.0)  # of which in the server's processes
        self._timeline: list[tuple[float, dict[str, float]]] = []  # (perf_counter, the parts so far) at each sample
        self._busy0 = None
        self._postmaster = self._find_postmaster()
        self.server_local = self._postmaster is not None

    def _find_postmaster(self):
        """The server's postmaster when it runs on this machine (:func:`~pm_vector.db.postgres.priority.local_backend`:
        the rule the background sessions' priority follows), else None."""
        pid = priority.local_backend(self.conn)
        try:
            return psutil.Process(pid).parent() if pid is not None else None
        except psutil.Error:  # (not ours to read)
            return None

    def runs(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` to run as a thread's target, its CPU in ``part``: read at every sample and when it
        returns (a thread's time is not read after it ends)."""
        def run(*args, **kwargs):
            tid = threading.get_native_id()
            with self._lock:
                self._tids[tid] = part
            try:
                return fn(*args, **kwargs)
            finally:
                used = time.thread_time()
                with self._lock:
                    self._parts[part] += max(0.0, used - self._last.get(("t", tid), 0.0))
                    self._last[("t", tid)] = used
                    self._ended.add(tid)
        return run

    def process(self, pid: int, part: str, children: str | None = None) -> None:
        """Process ``pid`` in ``part`` from now on (what it used before is not counted); the processes
        it starts (and theirs) in ``children`` (None: not read)."""
        try:
            now = _read_process(psutil.Process(int(pid)), part, children)
        except psutil.Error:
            now = {}
        with self._lock:
            self._procs[int(pid)] = (part, children)
            self._last.update((k, v) for k, (_, v) in now.items())

    def _read(self) -> dict[tuple[str, int], tuple[str, float]]:
        """Every process and thread read now: ``(kind, id) -> (part, CPU seconds)``."""
        got: dict[tuple[str, int], tuple[str, float]] = {}
        me = psutil.Process()
        try:
            for t in me.threads():
                if t.id not in self._ended:
                    got[("t", t.id)] = (self._tids.get(t.id, "bench"), float(t.user_time + t.system_time))
        except psutil.Error:
            pass
        for pid, (part, children) in list(self._procs.items()):
            try:
                got.update(_read_process(psutil.Process(pid), part, children))
            except psutil.Error:  # ended (its last interval lost: module doc)
                pass
        if self._postmaster is not None:
            names = {int(pid): (kind or "", app or "") for pid, kind, app in self.conn.execute(
                "SELECT pid, backend_type, application_name FROM pg_stat_activity").fetchall()}
            try:
                kids = self._postmaster.children()
            except psutil.Error:
                kids = []
            for c in kids:
                kind, app = names.get(c.pid, ("", ""))
                part = ("autovacuum" if kind.startswith("autovacuum") else
                        APPLICATION_PARTS.get(app, "other") if kind == "client backend" else "postgres")
                try:
                    got[("b", c.pid)] = (part, _cpu(c.cpu_times()))
                except psutil.Error:
                    pass
        return got

    def start(self) -> None:
        """Read everything now: what runs already counts from here on."""
        now = self._read()
        with self._lock:
            self._last.update((k, v) for k, (_, v) in now.items())
            self._busy0 = busy_cpu_s()
            self._timeline.append((time.perf_counter(), dict.fromkeys(PARTS, 0.0)))

    def sample(self) -> None:
        """Add each process's and thread's CPU since the last sample to its part (a new one's since its start)."""
        now = self._read()
        with self._lock:
            for k, (part, v) in now.items():
                used = max(0.0, v - self._last.get(k, 0.0))
                self._parts[part] += used
                if k[0] == "b":
                    self._server[part] += used
                # (never lower: a child that ended, not yet waited for, leaves a sum that dips and comes back)
                self._last[k] = max(v, self._last.get(k, 0.0))
            self._timeline.append((time.perf_counter(), dict(self._parts)))

    def stop(self) -> dict:
        """The last sample, and ``{"busy_s": the machine's busy seconds, "parts": {part: seconds},
        "server": {part: the seconds of it in the server's processes}, "timeline": [(perf_counter,
        {part: seconds so far}) at each sample, the start's first]}`` (``other``: the busy seconds no
        part holds, not in the timeline; in ``server``, the client backends no part names)."""
        self.sample()
        busy = busy_cpu_s() - self._busy0
        with self._lock:
            parts, server, timeline = dict(self._parts), dict(self._server), list(self._timeline)
        parts["other"] = max(0.0, busy - sum(v for k, v in parts.items() if k != "other"))
        return {"busy_s": round(busy, 2), "parts": {k: round(v, 2) for k, v in parts.items()},
                "server": {k: round(v, 2) for k, v in server.items()}, "timeline": timeline}
