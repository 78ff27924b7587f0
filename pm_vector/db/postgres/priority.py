"""Background sessions: the server side of a job that runs beside the writes (the service's bulk
merge) at the machine's lowest CPU priority, where the server runs on this machine.

The merge's process is scheduled as Linux's ``SCHED_IDLE`` (:mod:`pm_vector.service.merge_process`),
but a good part of a merge's cores is spent by its server backend: the COPY of the new run's
tables and its HNSW index builds, with parallel workers. At normal priority on 2 cores that backend
took the core a single-row writer wakes up on: beside a merge of 100,000 items, a plain writer's
commits fell from about 1,980 a second alone to about 250 during the merge's index stage
(``pm-vector bench merge``, docs/benchmarks.md, "A writer beside a merge").

:func:`set_background` (the merge process, once) asks for it; then :func:`lower` on a session:

- its backend is scheduled ``SCHED_IDLE`` -- only if the server runs on this machine (a Unix
  socket or a loopback address, and the backend's pid here is a ``postgres`` process) and this
  process may (the server's user, or ``CAP_SYS_NICE``); otherwise it keeps its priority;
- it takes no parallel maintenance workers (``max_parallel_maintenance_workers`` 0 for the
  session), which would run at normal priority.

The sync process is lowered less, by a nice value (its threads as the merge's, and :func:`lower_backend`,
the service's ``sync_nice``): it must keep up with the stream, so it keeps a share of a busy core,
but a writer's commit waking up takes the core first.

Without :func:`set_background`, :func:`lower` does nothing: ``pm-vector embed`` and ``pm-vector
merge`` run at the user's priority. A lowered session must not hold a lock others wait for: a task
at ``SCHED_IDLE`` waits behind every busy one, so the job's switch (the collection row held) runs on
a session of normal priority (:func:`pm_vector.db.runs.jobs.run_embedding_job`).

What it does not lower: the merge's WAL, which a writer's commit flushes with its own. The COPY
stages still slow a writer (the benchmark's per-stage figures).

**Background cores.** Priority is not enough on a small virtual machine: on 2 cores, a single-row
writer kept its rate beside one busy core (normal priority or ``SCHED_IDLE``) and lost 85% of it
beside two (``SCHED_IDLE`` both; docs/benchmarks.md, "Background cores"). So the
service's background work -- the sync process, the merges it starts, and their sessions' backends
where the server runs on this machine -- can be confined to a set of CPUs (:func:`background_cpus`:
``auto`` the upper half of the CPUs this process may use, none on one CPU; the service's setting
is ``off`` by default: on one core of 2 the sync fell behind a stream at plain pgvector's rate),
leaving the others to the writers and the queries: :func:`confine` (every thread of this process, its numerical
libraries' thread pools sized to the set; the processes it starts inherit the set) and
:func:`confine_backend` (a session's backend). A merge process started by a confined process
finds the set as its own affinity (:func:`confined_to`) and confines its sessions' backends to it
in :func:`lower`.

**One thread where not confined.** A sync process that is not confined sizes its numerical pools
to one thread (:func:`size_pools`, :func:`pool_sizes` reads them; the merges it starts inherit the
variables): with the cores busy, a pool's threads spin at every parallel region. The sync's search of
360 new items among 300,000 took 3,594 ms of CPU on two threads beside two busy processes, 153 ms on
one (``python tools/search_cpu.py --threads 1,2 --busy 2``, docs/benchmarks.md).
"""

from __future__ import annotations

import ipaddress
import os
import sys

from threadpoolctl import threadpool_info, threadpool_limits

from ..errors import InvalidInputError

_state = {"background": False, "lowered": 0}


def _allowed() -> frozenset[int]:
    return frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()


def background_cpus(spec: str = "auto", setting: str = "background_cpus") -> frozenset[int] | None:
    """The CPUs background work runs on (module doc): ``"auto"`` the upper half of the CPUs this
    process may use (None when it may use one: nowhere to leave free), ``"off"`` (or ``""``) None
    (anywhere), else a comma-separated list of CPU numbers, each one this process may use
    (InvalidInputError)."""
    allowed = _allowed()
    spec = str(spec).strip()
    if spec in ("", "off") or not allowed:
        return None
    if spec == "auto":
        cpus = sorted(allowed)
        return frozenset(cpus[len(cpus) // 2:]) if len(cpus) > 1 else None
    try:
        got = frozenset(int(x) for x in spec.split(","))
    except ValueError:
        raise InvalidInputError(f"{setting} must be 'auto', 'off' or CPU numbers like '2,3'; got {spec!r}.") from None
    if not got or not got <= allowed:
        raise InvalidInputError(f"{setting} {spec!r} names CPUs this process may not use (it may use "
                                f"{','.join(map(str, sorted(allowed)))}).")
    return got


def confine(cpus: frozenset[int] | None) -> int:
    """Every thread of this process on ``cpus`` (a thread's affinity is its own, and the threads
    numpy's BLAS started at its import would keep theirs), and the numerical libraries' thread pools
    (BLAS, OpenMP: faiss's) sized to them; threads and processes started later inherit the set.
    Returns how many threads were confined (0 with None, or where the platform has no affinity)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return 0
    n = 0
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            os.sched_setaffinity(tid, cpus)
            n += 1
        except OSError:  # a thread that ended meanwhile
            pass
    size_pools(len(cpus))
    return n


def size_pools(n: int) -> None:
    """This process's numerical libraries' thread pools (BLAS, OpenMP: faiss's) sized to ``n``: the
    libraries loaded now (threadpoolctl) and those loaded later (their variables)."""
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = str(int(n))
    threadpool_limits(limits=int(n))


def pool_sizes() -> list[int]:
    """The sizes of this process's numerical libraries' thread pools loaded now (threadpoolctl)."""
    return [int(p["num_threads"]) for p in threadpool_info()]


def confined_to() -> frozenset[int] | None:
    """The CPUs this process is confined to, when fewer than the machine's (None otherwise)."""
    mine, every = _allowed(), os.cpu_count() or 0
    return mine if mine and len(mine) < every else None


def confine_backend(conn, cpus: frozenset[int] | None) -> bool:
    """The session's backend on ``cpus`` where the server runs on this machine and this process may
    (module doc). Returns whether it is."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return False
    pid = local_backend(conn)
    if pid is None:
        return False
    try:
        os.sched_setaffinity(pid, cpus)
    except OSError:  # another user's server, without CAP_SYS_NICE
        return False
    return True


def lower_backend(conn, nice: int) -> bool:
    """The session's backend ``nice`` levels below its priority now (at most 19), where the server runs
    on this machine and this process may (module doc: the server's user; raising a nice value needs
    no privilege). Returns whether it is. A lowered backend still gets its share of a busy core, so
    the locks it holds are not held for long: not :func:`lower`'s ``SCHED_IDLE``."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return False
    pid = local_backend(conn)
    if pid is None:
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, pid) + int(nice)))
    except OSError:  # another user's server
        return False
    return True


def set_background(on: bool = True) -> None:
    """This process's sessions made by jobs are background ones (:func:`lower` acts)."""
    _state["background"] = bool(on)


def lowered() -> int:
    """How many sessions :func:`lower` scheduled ``SCHED_IDLE`` in this process."""
    return int(_state["lowered"])


def local_backend(conn) -> int | None:
    """The session's backend pid if the server runs on this machine (module doc), else None."""
    host = conn.info.host or ""
    if not host.startswith("/"):
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return None
        except ValueError:
            if host != "localhost":
                return None
    pid = int(conn.info.backend_pid)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read(64)
    except OSError:
        return None
    return pid if cmd.startswith(b"postgres") else None


def lower(conn) -> bool:
    """The session ``conn`` made a background one (module doc) when this process asked for them.
    Returns whether its backend is now scheduled ``SCHED_IDLE``. Leaves ``conn`` idle (committed)."""
    if not _state["background"]:
        return False
    conn.execute("SELECT set_config('max_parallel_maintenance_workers', '0', false)")
    if not conn.autocommit:
        conn.commit()
    confine_backend(conn, confined_to())
    pid = local_backend(conn)
    if pid is None or not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except OSError:  # another user's server, without CAP_SYS_NICE: it keeps its priority
        return False
    _state["lowered"] += 1
    return True
