"""Which streaming replica answers reads: in rotation while reachable and caught up.

:class:`ReadRouter` holds the read URLs (replicas of the primary pm_vector writes to) and checks
each, at most every ``check_interval`` seconds: a replica is in rotation while it answers and its
replay lag behind the primary's WAL insert position is at most ``max_lag_bytes``; otherwise it
is out until a later check finds it back. :meth:`pick` returns a replica in rotation (round
robin) or ``None``: read on the primary. Reads on a replica see the run its replayed catalog
names (see ``sql/README.md``, "Shards and replicas").
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .cluster import replica_lag_bytes

import psycopg


@dataclass
class ReplicaState:
    url: str
    in_rotation: bool = False
    lag_bytes: int | None = None
    error: str | None = None
    checked_at: float = 0.0


@dataclass
class ReadRouter:
    primary_url: Callable[[], str] | str
    read_urls: list[str] = field(default_factory=list)
    max_lag_bytes: int = 16 * 1024 * 1024
    check_interval: float = 2.0

    def __post_init__(self) -> None:
        if self.max_lag_bytes < 0 or self.check_interval < 0:
            raise ValueError("max_lag_bytes and check_interval must be >= 0")
        self.states_ = [ReplicaState(u) for u in self.read_urls]
        self._lock = threading.Lock()
        self._checking = threading.Lock()  # one check at a time; requests meanwhile use the last result
        self._rr = itertools.count()
        self._last = -1e9

    def _primary(self) -> str:
        return self.primary_url() if callable(self.primary_url) else self.primary_url

    def check(self) -> list[ReplicaState]:
        """Check every replica now (lag against the primary's current WAL insert position)."""
        try:
            with psycopg.connect(self._primary(), autocommit=True, connect_timeout=3) as c:
                lsn = c.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        except psycopg.Error as exc:  # primary down: no replica can be shown current
            for s in self.states_:
                s.in_rotation, s.error, s.checked_at = False, f"primary unreachable: {exc.__class__.__name__}", time.time()
            return self.states_
        for s in self.states_:
            lag = replica_lag_bytes(s.url, lsn)
            s.lag_bytes, s.checked_at = lag, time.time()
            s.in_rotation = lag is not None and lag <= self.max_lag_bytes
            s.error = None if lag is not None else "unreachable"
            if lag is not None and not s.in_rotation:
                s.error = f"replay lag {lag} bytes > {self.max_lag_bytes}"
        return self.states_

    def pick(self) -> str | None:
        """A replica URL in rotation, or ``None`` (read on the primary)."""
        if not self.states_:
            return None
        # the check connects to every node: the request that finds it due runs it, off the lock, and
        # no other request waits for it (they route on the previous result)
        if time.monotonic() - self._last >= self.check_interval and self._checking.acquire(blocking=False):
            try:
                self._last = time.monotonic()
                self.check()
            finally:
                self._checking.release()
        with self._lock:
            live = [s.url for s in self.states_ if s.in_rotation]
            if not live:
                return None
            return live[next(self._rr) % len(live)]

    def mark_failed(self, url: str, error: str) -> None:
        """Take a replica out of rotation now (a read on it failed); the next check may bring it back."""
        with self._lock:
            for s in self.states_:
                if s.url == url:
                    s.in_rotation, s.error = False, error[:200]
