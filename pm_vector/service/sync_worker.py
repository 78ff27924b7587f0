"""The attached tables' sync of a running service: :class:`SyncWorker`, one per database.

Every service process starts one (``sync_interval_s`` > 0): a thread of its own, never the request
threads' pool (``run_in_threadpool``), on connections of its own (the URL of the service's pool,
never the pool: a request never waits for a sync's connection, nor a sync for a request's). Of the
processes serving one database only the one whose worker holds the session-level advisory lock
:data:`SYNC_LOCK_KEY` syncs; the others try again every ``retry_s`` and take over when that process
ends (its session ends, and the lock with it). So the items a syncing process keeps between
batches (:mod:`pm_vector.db.runs.item_cache`, :mod:`pm_vector.db.runs.row_cache`) stay valid from
one batch to the next: two processes syncing in turn would each find the run changed by the other
and read it again. (:func:`pm_vector.db.store.attach.sync_pending` stays safe to run from several
processes at once -- ``pm-vector sync`` beside the service -- each batch locks its collection's row.)

The leader's passes (:func:`sync_once`: at once when changes are queued -- looked for every
:data:`POLL_S` -- and at the latest every ``sync_interval_s``: every attached collection with
queued changes, then the bulk merge of the collections whose delta is due, in a process of its own at a
lower priority: :func:`merge_in_background`; nothing while the service's pool knows the database is down) run in a process of
its own, :class:`SyncProcess`, which shares no GIL with the requests. The sync process is made by
the worker's thread, at its priority, and lowers itself and its session's backend ``sync_nice``
levels below it (the database's own writers take a core first: docs/operations.md, "Background
cores"); :func:`lower_request_priority` (``request_nice``) lowers the service's other threads
that much further.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from ..db.postgres import connect, priority
from ..db.runs.merge import due_names
from ..db.store.attach import sync_pending

import psycopg

log = logging.getLogger("pm_vector.service")

#: the advisory lock (bigint key) of the one syncing process of a database: as
#: ``pm_vector.pm_lock_key(4, 0)`` (kinds 1-3: a run, an ingest, new items)
SYNC_LOCK_KEY = (20557 << 48) | (4 << 40)
#: the ``application_name`` of the sessions of the sync process (:func:`_child`: ``PGAPPNAME``, which
#: a name in the URL overrides), of the session that holds :data:`SYNC_LOCK_KEY`, and of a merge's
#: process (:mod:`pm_vector.service.merge_process`): what ``pg_stat_activity`` shows of them
SYNC_APPLICATION_NAME = "pm_vector sync"
SYNC_LOCK_APPLICATION_NAME = "pm_vector sync worker"
MERGE_APPLICATION_NAME = "pm_vector merge"
#: how often an idle worker looks for queued changes between passes (a pass starts at once on them)
POLL_S = 0.05
#: the least time from the start of one pass to the start of the next under a stream: a pass has a
#: fixed cost (about 80 ms at 100,000 items for 3 changes: its statements, the run's state read
#: again), and passes that followed each other at once kept a core busy whatever the rate, on the
#: 2 cores a single-row writer of the same database needed (docs/benchmarks.md, "Writes")
MIN_GAP_S = 0.5


def sync_once(url: str | None, health=None, conn=None) -> dict[str, Any]:
    """One pass of the attached tables' sync on ``url``: ``{collection: changes synced, or why it
    failed}``; nothing without a URL (a sync never starts the embedded server: an outage stays an
    outage) or while ``health`` (the pool's :class:`~pm_vector.service.dbhealth.DatabaseHealth`)
    knows the database is down. ``conn``: a connection to ``url`` to run it on (the sync process
    keeps one from pass to pass; None: one for the pass)."""
    if not url or (health is not None and health.reason() is not None):
        return {}
    out = sync_pending(url, conn=conn)
    if time.monotonic() - _merge_checked[0] >= MERGE_CHECK_S:  # (passes follow each other at once under a stream)
        _merge_checked[0] = time.monotonic()
        merge_in_background(url, conn=conn)
    return out


#: the background merge of this process (one at a time): :func:`merge_in_background`
_merging: list = []
#: seconds between two checks of which merges are due (a pass may follow the one before at once)
MERGE_CHECK_S = 1.0
_merge_checked = [float("-inf")]
#: how many nice levels below the sync a merge's process runs (:mod:`pm_vector.service.merge_process`)
MERGE_NICE = 10
#: the variable that gives a merge's process its CPUs (the service's ``merge_cpus``; unset: anywhere)
MERGE_CPUS_VAR = "PM_VECTOR_MERGE_CPUS"
#: the CPUs this process's merges run on (:func:`merge_in_background`; None: anywhere)
_merge_cpus: list = [None]


def merge_finished() -> dict[str, Any] | None:
    """The result of this process's background merge once it has ended (then forgotten; logged), None
    while it runs or when there is none: what :mod:`pm_vector.service.merge_process` wrote."""
    if not _merging or _merging[0].poll() is None:
        return None
    proc = _merging.pop()
    try:
        got = json.loads(proc.stdout.read() or "{}")
    except ValueError:
        got = {}
    finally:
        proc.stdout.close()
    if proc.returncode != 0 or "merges" not in got:
        got = {"error": got.get("error") or f"the merge process ended with code {proc.returncode}", "merges": {}}
    if got.get("error"):  # (the database unreachable, say: the next pass tries again)
        log.warning("merge check failed (%s)", got["error"])
    for name, res in got["merges"].items():
        if isinstance(res, str):
            log.warning("merge of %s failed (%s); it is tried again at the next pass", name, res)
        else:
            log.info("merged the delta of %s into run %s in %.1f s", name, res["run_id"], res["seconds"])
    return got


def merge_process_command(nice: int, *args: str) -> tuple[list[str], str]:
    """The command of :mod:`pm_vector.service.merge_process` at ``nice`` (and its optional
    arguments), and the directory to run it from: the one that holds this package (``python -m``
    puts its working directory first on the path, and the merge must run the code this process runs).
    The database URL goes on its stdin."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [sys.executable, "-m", "pm_vector.service.merge_process", str(max(0, int(nice))), *args], here


def merge_in_background(url: str, nice: int = MERGE_NICE, conn=None) -> bool:
    """Start the bulk merge of every collection whose merge is due
    (:func:`pm_vector.db.runs.merge.merge_due`) in a process of its own, ``nice`` levels below this
    one (:mod:`pm_vector.service.merge_process`: no share of the sync's GIL, the cores to the sync
    first), unless one runs or none is due (read here first, on ``conn`` or a connection of its own:
    the process's start alone -- its imports -- took about 4 s of a core, and it was started every
    second while any delta waited for its merge): the passes of the sync go on beside it (a merge
    builds its run beside the serving one and switches in one transaction, so writes and answers
    never wait on it). Returns whether one was started."""
    merge_finished()
    if _merging:
        return False
    if conn is None:
        with connect(url) as own:
            todo = due_names(own)
    else:
        todo = due_names(conn)
    if not todo:
        return False
    argv, here = merge_process_command(nice)
    env = dict(os.environ)
    env.pop(MERGE_CPUS_VAR, None)
    if _merge_cpus[0]:
        env[MERGE_CPUS_VAR] = ",".join(map(str, sorted(_merge_cpus[0])))
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=here,
                            text=True, env=env)
    proc.stdin.write(url)
    proc.stdin.close()
    _merging[:] = [proc]
    return True


def lower_request_priority(nice: int, keep: int | None) -> int:
    """Lower the CPU priority of this process's threads by ``nice`` (Linux: a nice value per
    thread), all but the thread whose native id is ``keep`` (the sync worker's); threads made later by
    a lowered one (the request pool's) inherit it. Returns how many threads were lowered (0 where
    the platform has no per-thread nice value, or with ``nice`` 0)."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return 0
    target = min(19, os.getpriority(os.PRIO_PROCESS, keep or 0) + nice)  # (again: no lower than that)
    n = 0
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            if tid != keep and os.getpriority(os.PRIO_PROCESS, tid) < target:
                os.setpriority(os.PRIO_PROCESS, tid, target)
                n += 1
        except OSError:  # a thread that ended meanwhile
            pass
    return n


def _child(conn, url: str, cpus: frozenset[int] | None = None, merge_cpus: frozenset[int] | None = None,
           nice: int = 0) -> None:
    """The sync process's loop (:class:`SyncProcess`): a pass on each request, until told to stop
    or the service process is gone (its end of the pipe closes). The caches a sync keeps
    (the run's items, the cell rows) live here from one pass to the next, and so does its database
    session (a new one per pass cost a server process and ~60 ms; made again when it broke). On
    ``cpus`` (:func:`pm_vector.db.postgres.priority.confine`): this process, the merges it starts
    and its session's backend; not confined, its numerical libraries run one thread, and so do the
    merges it starts (the variables they inherit): a pool's threads spin at every parallel region
    while the cores are busy (``python tools/search_cpu.py --threads 1,2 --busy 2``,
    ``docs/benchmarks.md``). ``nice`` levels below the priority it was started at: the same three
    (:func:`lower_request_priority`, :func:`~pm_vector.db.postgres.priority.lower_backend`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the service stops us
    os.environ["PGAPPNAME"] = SYNC_APPLICATION_NAME  # (this process's sessions; its merges name theirs)
    if not priority.confine(cpus):
        priority.size_pools(1)  # (a pool's threads spin at each parallel region while the cores are busy)
    lower_request_priority(nice, None)  # (every thread of this process, as the merge process's)
    _merge_cpus[0] = merge_cpus
    session = None
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            if msg is None:
                return
            if msg == "pools":  # (the sizes of its numerical libraries' thread pools: SyncProcess.pools)
                conn.send(("done", priority.pool_sizes()))
                continue
            try:
                if session is None or session.closed or session.broken:
                    if session is not None:
                        session.close()
                    session = connect(url, watch_client=True)
                    priority.confine_backend(session, cpus)
                    priority.lower_backend(session, nice)
                conn.send(("done", sync_once(url, conn=session)))
            except Exception as exc:  # noqa: BLE001 - said to the service, which logs it; the loop goes on
                if session is not None and not session.closed and not session.broken:
                    try:
                        session.rollback()
                    except Exception:  # noqa: BLE001 - made again at the next pass
                        session.close()
                conn.send(("failed", type(exc).__name__))
    finally:
        if session is not None:
            session.close()


class SyncProcess:
    """The passes of a :class:`SyncWorker` run in a process of its own (made for the first pass that
    has changes to apply, made again if it ends): no share of the service process's GIL. Measured: a pass of 5 changes at
    20,000 items beside a thread spinning Python took 2.3-5.5 s in the same process, 0.9-2.4 s in a
    process of its own (0.5-1.3 s alone; docs/benchmarks.md, the sync under query load).
    ``__call__(url, health)`` runs one pass (:func:`sync_once`) there; ``nice``: how many nice levels
    below the service the process and its session's backend run (``sync_nice``)."""

    def __init__(self, url: str, cpus: frozenset[int] | None = None, merge_cpus: frozenset[int] | None = None,
                 nice: int = 0):
        self.url, self.cpus, self.merge_cpus, self.nice = url, cpus, merge_cpus, int(nice)
        self._proc = None
        self._conn = None
        self._shut = False

    def _ensure(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        if self._shut:
            raise RuntimeError("the service is stopping: no new sync process")
        self.close()
        ctx = multiprocessing.get_context("spawn")
        mine, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(theirs, self.url, self.cpus, self.merge_cpus, self.nice),
                                 name="pm_vector-sync", daemon=True)
        self._proc.start()
        theirs.close()
        self._conn = mine

    def __call__(self, url: str, health=None) -> dict[str, Any]:
        if not url or (health is not None and health.reason() is not None):
            return {}
        self._ensure()
        try:
            self._conn.send("pass")
            kind, got = self._conn.recv()
        except (EOFError, OSError):
            self.close()
            raise RuntimeError("the sync process ended during a pass; a new one takes the next") from None
        if kind == "failed":
            raise RuntimeError(got)
        return got

    def pools(self) -> list[int]:
        """The sizes of the sync process's numerical libraries' thread pools (BLAS, OpenMP), as
        threadpoolctl reads them there: one each where the process is not confined (:func:`_child`).
        Starts the process if it is not running."""
        self._ensure()
        self._conn.send("pools")
        _, got = self._conn.recv()
        return list(got)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def shutdown(self, timeout: float = 30.0) -> None:
        """:meth:`close`, and no process is made again."""
        self._shut = True
        self.close(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Ask the process to stop after its pass; ended after ``timeout`` (a cut batch rolls back)."""
        proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        if conn is not None:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        if proc is not None:
            proc.join(timeout)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        if conn is not None:
            conn.close()


class SyncWorker:
    """The sync loop of one service process (module doc). ``url``: the database; ``interval_s``:
    seconds between passes; ``health``: the pool's monitor (None: none); ``retry_s``: how often a
    process that does not hold the lock tries again; ``pass_fn(url, health)``: one pass (default: a
    :class:`SyncProcess` of this worker's, made once it leads; :func:`sync_once` runs the pass on this
    thread instead); ``lock_key``: the advisory lock that elects the one syncing process (default
    :data:`SYNC_LOCK_KEY`; another key only for workers that must not meet the database's own, as in
    tests); ``poll_s``: how often it looks for queued changes between passes (:meth:`_wait_next`: a
    pass starts as soon as changes are queued but no sooner than ``min_gap_s`` after the one before
    began, at the latest ``interval_s`` after it); ``background_cpus``: the CPUs its sync process and
    the merges it starts run on (:func:`pm_vector.db.postgres.priority.background_cpus`: "off"
    anywhere, "auto", or a list); ``sync_nice``: how many nice levels below this process its sync
    process and that process's session's backend run (0: the same). :attr:`leader` says whether
    this one syncs; :attr:`passes` counts its passes."""

    def __init__(self, url: str, interval_s: float, *, health=None, retry_s: float = 5.0,
                 pass_fn: Callable[[str, Any], dict] | None = None, lock_key: int = SYNC_LOCK_KEY,
                 poll_s: float = POLL_S, min_gap_s: float = MIN_GAP_S, background_cpus: str = "off",
                 merge_cpus: str = "off", sync_nice: int = 0):
        self.url, self.interval_s, self.health, self.retry_s = url, float(interval_s), health, float(retry_s)
        self.poll_s = max(0.005, min(float(poll_s), self.interval_s))
        self.min_gap_s = max(0.0, min(float(min_gap_s), self.interval_s))
        self.lock_key = int(lock_key)
        self._pass = pass_fn if pass_fn is not None else SyncProcess(url, priority.background_cpus(background_cpus),
                                                                       priority.background_cpus(merge_cpus, "merge_cpus"),
                                                                       sync_nice)
        self._stop = threading.Event()
        self._lock_conn = None
        self.leader = False
        self.passes = 0
        self._thread = threading.Thread(target=self._run, name="pm_vector-sync", daemon=True)

    def start(self) -> "SyncWorker":
        self._thread.start()
        return self

    @property
    def native_id(self) -> int | None:
        """The worker thread's id for the operating system (None before it runs)."""
        return self._thread.native_id

    @property
    def process_pid(self) -> int | None:
        """The pid of its sync process (:class:`SyncProcess`; None before its first pass, or with a ``pass_fn``)."""
        return self._pass.pid if isinstance(self._pass, SyncProcess) else None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the pass running (a cut pass would leave its batch's changes queued anyway)."""
        self._stop.set()
        if isinstance(self._pass, SyncProcess):
            self._pass.shutdown(timeout)  # after the pass running, if any
        self._thread.join(timeout)
        self._release()

    def _release(self) -> None:
        conn, self._lock_conn = self._lock_conn, None
        self.leader = False
        if conn is not None:
            try:
                conn.close()  # the session ends: the lock goes with it
            except Exception:  # noqa: BLE001 - a dead session holds nothing
                pass

    def _lead(self) -> bool:
        """Whether this process holds the database's sync lock, taking it when free; a session that
        no longer answers (a restarted server) is dropped, and the lock taken again."""
        if self._lock_conn is not None:
            try:
                self._lock_conn.execute("SELECT 1")
                return True
            except Exception:  # noqa: BLE001 - the session (and its lock) is gone
                self._release()
                if isinstance(self._pass, SyncProcess):  # another process may lead by now
                    self._pass.close()
        conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5,
                               application_name=SYNC_LOCK_APPLICATION_NAME)
        try:
            got = conn.execute("SELECT pg_try_advisory_lock(%s)", [self.lock_key]).fetchone()[0]
        except Exception:
            conn.close()
            raise
        if not got:
            conn.close()
            return False
        self._lock_conn, self.leader = conn, True
        log.info("this process syncs the attached tables (every %g s)", self.interval_s)
        return True

    def _idle(self) -> bool:
        """Nothing queued and no sync process yet: a service whose tables never change (or that has
        no attached table) makes none."""
        if not isinstance(self._pass, SyncProcess) or self._pass.running:
            return False
        try:
            # (a delta waiting for its merge, too: the pass starts the merge when it is due)
            return not self._lock_conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pm_vector.attach_changes) OR EXISTS (SELECT 1 FROM "
                "pm_vector.delta_tombstones) OR EXISTS (SELECT 1 FROM pm_vector.delta_entries)").fetchone()[0]
        except Exception:  # noqa: BLE001 - the pass says what is wrong
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.health is not None and self.health.reason() is not None:
                    self._stop.wait(self.interval_s)
                    continue
                if not self._lead():
                    self._stop.wait(self.retry_s)
                    continue
            except Exception as exc:  # noqa: BLE001 - a database outage must not stop the loop
                log.warning("attached-table sync: no database session (%s); retrying in %g s", type(exc).__name__,
                            self.retry_s)
                self._stop.wait(self.retry_s)
                continue
            if self._idle():
                self._stop.wait(self.interval_s)
                continue
            t = time.monotonic()
            failed = True
            try:
                done = self._pass(self.url, self.health)
                self.passes += 1
                failed = False
                for name, n in done.items():
                    if isinstance(n, str):
                        failed = True
                        log.warning("sync of %s failed (%s); its queue waits for the next pass", name, n)
                    elif n:
                        log.info("synced %d change(s) of %s in %.2f s", n, name, time.monotonic() - t)
            except Exception as exc:  # noqa: BLE001 - a database outage must not stop the loop
                log.warning("attached-table sync failed (%s); retrying in %g s", type(exc).__name__,
                            self.interval_s)
            self._wait_next(t, failed)

    def _wait_next(self, began: float, failed: bool) -> None:
        """Until the next pass: when changes are queued (polled every ``poll_s``), but not before
        ``min_gap_s`` after the pass that ``began`` (under a stream a change waits for at most that
        and one pass, not for ``interval_s``; the pass takes what queued meanwhile), else
        ``interval_s`` after it (the merge's check). After a failed pass, ``interval_s`` (its queue
        stays: no pass at once on it)."""
        end, soonest = began + self.interval_s, began + self.min_gap_s
        while not self._stop.is_set():
            now = time.monotonic()
            left = end - now
            if left <= 0 or (not failed and now >= soonest and self._queued()):
                return
            self._stop.wait(left if failed else min(left, self.poll_s if now >= soonest else soonest - now))

    def _queued(self) -> bool:
        """Changes queued for a collection the pass syncs (not a broken one: its queue waits)."""
        try:
            return bool(self._lock_conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pm_vector.attach_changes a JOIN pm_vector.collections c "
                "ON c.id = a.collection_id WHERE NOT (c.settings ? 'broken'))").fetchone()[0])
        except Exception:  # noqa: BLE001 - the pass (after interval_s) says what is wrong
            return False
