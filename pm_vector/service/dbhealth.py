"""The service's view of whether its database is up, kept by one monitor thread.

A connection pool left to itself recovers slowly from an outage: psycopg_pool retries a failed
connection with exponential back-off (1, 2, 4, ... s), so the first success after an outage of a
minute comes up to a minute late, and after ``reconnect_timeout`` (5 min) it stops retrying; a
request meanwhile waits the pool's whole timeout before it fails. :class:`DatabaseHealth` makes
the state explicit instead:

* **up**: the monitor keeps one connection of its own and runs ``SELECT 1`` on it every
  ``heartbeat_s`` seconds, and at once when a request reports a failure
  (:meth:`~DatabaseHealth.report_failure`). If that fails and a fresh connection
  (``connect_timeout`` :data:`CONNECT_TIMEOUT_S`) fails too, the database is **down**:
  ``on_down()`` runs (the service closes its pool, so that requests waiting for a connection
  fail at once).
* **down**: :meth:`~DatabaseHealth.check` raises :class:`DatabaseUnavailableError` at once (no
  pool wait), and the monitor tries a fresh connection every ``probe_s`` seconds -- a fixed
  interval, no back-off, for as long as the outage lasts. The first one that answers
  ``SELECT 1`` runs ``on_up()`` (the service opens a fresh pool) and the state is up again.

So while the database refuses connections a request fails within milliseconds, and the first
request after the database accepts connections again succeeds within about ``probe_s`` plus one
connection set-up, however long the outage was. A database that hangs instead of refusing
(a network partition) is noticed after ``connect_timeout`` (:data:`CONNECT_TIMEOUT_S`) or the
operating system's TCP timeout of the monitor's connection.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import psycopg

log = logging.getLogger("pm_vector.service")

#: libpq's connect_timeout of the monitor's connections (psycopg rounds values below 2 up to 2)
CONNECT_TIMEOUT_S = 2
#: application_name of the monitor's session (pg_stat_activity)
APPLICATION_NAME = "pm_vector health"


class DatabaseUnavailableError(psycopg.OperationalError):
    """The service knows its database is down (the last connection attempt failed); raised
    without waiting for a pool. A psycopg.OperationalError, so it is answered with 503."""


class DatabaseHealth:
    """Whether the database at ``url`` is up, kept current by a monitor thread (module doc).

    ``heartbeat_s``: seconds between ``SELECT 1`` while up; ``probe_s``: seconds between
    connection attempts while down (a fixed interval, never given up). ``on_down()`` /
    ``on_up()`` run in the monitor thread when the state changes; an ``on_up()`` that raises
    keeps the state down (the next probe tries again)."""

    def __init__(self, url: str, *, heartbeat_s: float = 0.5, probe_s: float = 0.25,
                 on_down: Callable[[], None] | None = None, on_up: Callable[[], None] | None = None):
        if not (0 < heartbeat_s <= 60 and 0 < probe_s <= 60):
            raise ValueError("heartbeat_s and probe_s must be in (0, 60] seconds.")
        self.url, self.heartbeat_s, self.probe_s = url, float(heartbeat_s), float(probe_s)
        self._on_down, self._on_up = on_down, on_up
        self._lock = threading.Lock()
        self._up = True
        self._down_since: float | None = None
        self._reason: str | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection | None = None
        #: (monotonic time, "down" | "up") of every change, newest last (at most 100)
        self.transitions: list[tuple[float, str]] = []

    # -- the request path
    @property
    def up(self) -> bool:
        with self._lock:
            return self._up

    def reason(self) -> str | None:
        """Why the database is down (the last failure), or None while it is up."""
        with self._lock:
            return None if self._up else self._reason

    def down_for(self) -> float | None:
        """Seconds since the database went down, or None while it is up."""
        with self._lock:
            return None if self._up or self._down_since is None else time.monotonic() - self._down_since

    def check(self) -> None:
        """Raise :class:`DatabaseUnavailableError` at once while the database is down."""
        with self._lock:
            if self._up:
                return
            why = self._reason
        raise DatabaseUnavailableError(f"the database is unreachable ({why}); the service reconnects by itself")

    def report_failure(self) -> None:
        """A request lost its connection or could not get one: check the database now."""
        self._wake.set()

    def probe_now(self) -> bool:
        """Can a fresh connection be made right now (in the caller's thread, ``connect_timeout``
        :data:`CONNECT_TIMEOUT_S`)? If not the state is down from now on (the monitor runs
        ``on_down()`` at once); a request whose pooled connection failed its check so learns
        within milliseconds whether to answer 503."""
        try:
            self._connect().close()
            return True
        except Exception as exc:  # noqa: BLE001 - any failure to connect means down
            self._mark_down(_describe(exc))
            return False

    def _mark_down(self, reason: str) -> None:
        with self._lock:
            if not self._up:
                return
            self._reason = reason
        self._set(False)
        self._wake.set()

    # -- the monitor thread
    def start(self) -> "DatabaseHealth":
        self._thread = threading.Thread(target=self._run, name="pm_vector-dbhealth", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=CONNECT_TIMEOUT_S + 3)
        self._drop_conn()

    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                               application_name=APPLICATION_NAME)
        try:
            conn.execute("SELECT 1")
        except BaseException:
            conn.close()
            raise
        return conn

    def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a dead session: nothing to close cleanly
                pass

    def _alive(self) -> bool:
        """SELECT 1 on the kept connection, else on a fresh one (kept if it works)."""
        if self._conn is not None:
            try:
                self._conn.execute("SELECT 1")
                return True
            except Exception:  # noqa: BLE001 - the session is gone; try a new one
                self._drop_conn()
        try:
            self._conn = self._connect()
            return True
        except Exception as exc:  # noqa: BLE001 - any failure to connect means down
            with self._lock:
                self._reason = _describe(exc)
            return False

    def _set(self, up: bool) -> None:
        with self._lock:
            self._up = up
            self._down_since = None if up else time.monotonic()
            if up:
                self._reason = None
            self.transitions = (self.transitions + [(time.monotonic(), "up" if up else "down")])[-100:]

    def _went_down(self) -> None:
        log.warning("database unreachable (%s): answering 503 until it is back", self.reason())
        self._drop_conn()
        self._call(self._on_down, "on_down")

    def _run(self) -> None:
        handled_down = False  # on_down ran for the current down state
        while not self._stop.is_set():
            if self.up:
                handled_down = False
                self._wake.wait(self.heartbeat_s)
                self._wake.clear()
                if self._stop.is_set():
                    break
                if self.up and self._alive():
                    continue
                if self.up:
                    self._set(False)
            if not handled_down:  # marked down here or by probe_now
                self._went_down()
                handled_down = True
            if self._alive():
                if self._call(self._on_up, "on_up"):
                    t_down = self.transitions[-1][0]
                    self._set(True)
                    log.warning("database reachable again after %.1f s", time.monotonic() - t_down)
                    continue
                self._drop_conn()
            self._stop.wait(self.probe_s)
            self._wake.clear()

    @staticmethod
    def _call(fn: Callable[[], None] | None, what: str) -> bool:
        if fn is None:
            return True
        try:
            fn()
            return True
        except Exception as exc:  # noqa: BLE001 - the monitor must keep running
            log.warning("database health %s failed (%s); retrying", what, _describe(exc))
            return False


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
