"""Verified API keys kept in a service process's memory while it hears of every key change.

Without it each request looks its key up in PostgreSQL: a connection from the pool, a round trip
and a hop to a worker thread before the request itself starts. Migration 0012 makes every change of ``pm_vector_service.api_keys`` (a
revocation, an UPDATE or DELETE by hand) send ``NOTIFY pm_vector_keys`` when it commits.
:class:`KeyCache` holds a connection that ``LISTEN``\\ s on that channel, in a thread of its own:

* a key verified by the database is kept (by its SHA-256, the record the lookup returned) for at
  most ``ttl`` seconds, and only while the listening connection is up;
* every notification forgets every key, so a revoked key is refused by every service process
  as soon as the revocation commits (a lookup that was under way when it happened is not kept:
  the cache counts notifications and keeps a record only if none came in between);
* when the listening connection fails the cache forgets everything and stays off (each request
  looks its key up, as without the cache) until the thread has listened again.

Unknown and revoked keys are kept apart, in a short negative cache (:meth:`KeyCache.failed`):
the SHA-256 of a key the database refused is remembered for ``failed_ttl`` seconds (a few; at
most ``max_failed`` of them, least recently refused out), so that a flood repeating bad keys costs
no lookup. It follows the same rules -- kept only while listening, forgotten on every
notification, not kept when a change raced with the lookup -- and
:func:`pm_vector.service.auth.create_key` announces each new key on the channel too (the trigger
of migration 0012 fires on UPDATE and DELETE only), so a key created or un-revoked is accepted at
once. A key INSERTed by hand in SQL is refused for at most ``failed_ttl`` seconds if a client
tried it before it existed.

The same connection listens on :data:`FAILURE_CHANNEL`: each service process announces the client
address of every failed authentication there (:meth:`KeyCache.announce_failure`), and every other
process counts it in its own per-address limit (``on_auth_failure``), so that N processes give an
address the limit once, not N times (while the listener is down each process counts alone).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any

import psycopg
from psycopg import sql

from .auth import KEY_CHANNEL

log = logging.getLogger("pm_vector.service")

#: failed authentications, announced by every service process to the others ("<token> <address>")
FAILURE_CHANNEL = "pm_vector_auth_failures"
#: the listening session's application_name (pg_stat_activity)
APPLICATION_NAME = "pm_vector key cache"


class KeyCache:
    """``lookup(key_hash)`` / ``store(key_hash, record, generation)`` with ``generation()`` read
    before the database lookup (``failed`` / ``store_failed`` for refused keys); ``start()``
    begins listening, ``close()`` ends it."""

    def __init__(self, url: str, *, ttl: float = 60.0, reconnect_s: float = 1.0, failed_ttl: float = 5.0,
                 max_failed: int = 10_000, on_auth_failure=None):
        self.url, self.ttl, self.reconnect_s = url, float(ttl), float(reconnect_s)
        #: called with a client address another service process refused (:data:`FAILURE_CHANNEL`)
        self.on_auth_failure = on_auth_failure
        self.token = uuid.uuid4().hex  # this process's failures come back on the channel: not counted twice
        self.failed_ttl, self.max_failed = float(failed_ttl), int(max_failed)
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[dict[str, Any], float]] = {}
        self._failed: OrderedDict[str, float] = OrderedDict()  # key hash -> expiry
        self._generation = 0
        self._listening = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn = None

    # -- the request path
    def generation(self) -> int:
        with self._lock:
            return self._generation

    def lookup(self, key_hash: str) -> dict[str, Any] | None:
        now = time.monotonic()
        with self._lock:
            if not self._listening:
                return None
            hit = self._entries.get(key_hash)
            if hit is None or hit[1] < now:
                return None
            return hit[0]

    def store(self, key_hash: str, record: dict[str, Any], generation: int) -> None:
        with self._lock:
            if self._listening and generation == self._generation:
                if len(self._entries) > 10_000:
                    self._entries.clear()
                self._entries[key_hash] = (record, time.monotonic() + self.ttl)

    def failed(self, key_hash: str) -> bool:
        """Did the database refuse this key hash within the last ``failed_ttl`` seconds (and no
        key changed since)?"""
        now = time.monotonic()
        with self._lock:
            if not self._listening:
                return False
            exp = self._failed.get(key_hash)
            if exp is None:
                return False
            if exp < now:
                del self._failed[key_hash]
                return False
            return True

    def store_failed(self, key_hash: str, generation: int) -> None:
        """Remember a key hash the database refused (lookup begun at ``generation``)."""
        if self.failed_ttl <= 0 or self.max_failed <= 0:
            return
        with self._lock:
            if self._listening and generation == self._generation:
                self._failed[key_hash] = time.monotonic() + self.failed_ttl
                self._failed.move_to_end(key_hash)
                while len(self._failed) > self.max_failed:
                    self._failed.popitem(last=False)

    @property
    def listening(self) -> bool:
        with self._lock:
            return self._listening

    # -- the listening thread
    def _forget(self, listening: bool | None = None) -> None:
        with self._lock:
            self._entries.clear()
            self._failed.clear()
            self._generation += 1
            if listening is not None:
                self._listening = listening

    def start(self, wait: float = 5.0) -> "KeyCache":
        self._thread = threading.Thread(target=self._run, name="pm_vector-keycache", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not self.listening and self._thread.is_alive():
            time.sleep(0.01)
        return self

    def _run(self) -> None:
        warned = False
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=5,
                                     application_name=APPLICATION_NAME) as conn:
                    self._conn = conn
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(KEY_CHANNEL)))
                    if self.on_auth_failure is not None:
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(FAILURE_CHANNEL)))
                    self._forget(listening=True)  # only what is verified from now on is kept
                    warned = False
                    while not self._stop.is_set():
                        for n in conn.notifies(timeout=1.0):
                            if n.channel == FAILURE_CHANNEL:
                                self._failure_heard(n.payload)
                            else:
                                self._forget()
                        conn.execute("SELECT 1")  # a dead server is noticed within a second
            except Exception as exc:  # noqa: BLE001 - any failure: off until listening again
                if not self._stop.is_set():  # once per outage, not once per retry
                    (log.debug if warned else log.warning)(
                        "API key cache off (%s); keys are looked up per request until it listens again",
                        type(exc).__name__)
                    warned = True
            finally:
                self._conn = None
                self._forget(listening=False)
            self._stop.wait(self.reconnect_s)

    # -- failed authentications, shared by the service processes of one database
    def _failure_heard(self, payload: str) -> None:
        token, _, address = (payload or "").partition(" ")
        if token != self.token and address and self.on_auth_failure is not None:
            try:
                self.on_auth_failure(address)
            except Exception:  # noqa: BLE001 - a limiter's failure must not stop the listener
                log.exception("failed-authentication notice not counted")

    def announce_failure(self, conn, address: str) -> None:
        """Tell the other service processes that ``address`` failed to authenticate (on ``conn``,
        a pooled connection; they count it in their limiter)."""
        conn.execute("SELECT pg_notify(%s, %s)", [FAILURE_CHANNEL, f"{self.token} {address[:200]}"])

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._forget(listening=False)
