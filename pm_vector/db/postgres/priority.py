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

Without :func:`set_background`, :func:`lower` does nothing: ``pm-vector embed`` and ``pm-vector
merge`` run at the user's priority. A lowered session must not hold a lock others wait for: a task
at ``SCHED_IDLE`` waits behind every busy one, so the job's switch (the collection row held) runs on
a session of normal priority (:func:`pm_vector.db.runs.jobs.run_embedding_job`).

What it does not lower: the merge's WAL, which a writer's commit flushes with its own. The COPY
stages still slow a writer (the benchmark's per-stage figures).
"""

from __future__ import annotations

import ipaddress
import os

_state = {"background": False, "lowered": 0}


def set_background(on: bool = True) -> None:
    """This process's sessions made by jobs are background ones (:func:`lower` acts)."""
    _state["background"] = bool(on)


def lowered() -> int:
    """How many sessions :func:`lower` scheduled ``SCHED_IDLE`` in this process."""
    return int(_state["lowered"])


def _local_backend(conn) -> int | None:
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
    pid = _local_backend(conn)
    if pid is None or not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except OSError:  # another user's server, without CAP_SYS_NICE: it keeps its priority
        return False
    _state["lowered"] += 1
    return True
