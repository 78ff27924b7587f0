"""API keys: created by ``pm-vector keys create``, stored hashed, checked on every request.

A key is ``pmv_`` + 32 random bytes (``secrets.token_urlsafe``). The database keeps its
SHA-256 (hex), a display prefix (the first 12 characters) and a name; the key itself is shown
once, at creation. A 256-bit random secret needs no slow hash: there is nothing to guess.
Clients send it as ``Authorization: Bearer <key>`` (or ``X-API-Key: <key>``).

Each key has a role (:data:`ROLES`): ``query`` reads collections, the anchor document and KAHM
model listings and resolves requests / asks KAHM distances; ``admin`` also fetches items by id,
starts jobs and lists keys. A key may be limited to a set of collections (``collections``;
others look absent to it: 404) and carry its own request rate (``rate_per_minute``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any

from psycopg import sql

from ..errors import InvalidInputError, PMVectorError
from ..db.postgres import connect

TABLE = sql.Identifier("pm_vector_service", "api_keys")
#: the channel key changes are announced on (migration 0012; pm_vector.service.keycache)
KEY_CHANNEL = "pm_vector_keys"
KEY_PREFIX = "pmv_"
_MAX_KEY_LEN = 200
#: query: anchor document + resolve (+ reading collections); admin: everything
ROLES = ("query", "admin")
_COLS = sql.SQL("id, name, prefix, created_at, revoked_at, role, collections, rate_per_minute")


class ApiKeyNotFoundError(PMVectorError, LookupError):
    """No API key with that id or prefix."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def _iso(v):
    return v.isoformat() if isinstance(v, (dt.datetime, dt.date)) else v


def _row(r) -> dict[str, Any]:
    return {"id": int(r[0]), "name": r[1], "prefix": r[2], "created_at": _iso(r[3]), "revoked_at": _iso(r[4]),
            "active": r[4] is None, "role": r[5], "collections": None if r[6] is None else list(r[6]),
            "rate_per_minute": r[7]}


def in_scope(rec: dict[str, Any] | None, collection: str) -> bool:
    """May the key ``rec`` (None: auth is off) see ``collection``?"""
    return rec is None or rec.get("collections") is None or collection in rec["collections"]


def _check_scope(collections) -> list[str] | None:
    if collections is None:
        return None
    if isinstance(collections, str) or not all(isinstance(c, str) for c in collections):
        raise InvalidInputError("collections must be a list of collection names, e.g. --collection digits.")
    out = sorted({c.strip() for c in collections})
    if not out or any(not 1 <= len(c) <= 200 or "\x00" in c for c in out):
        raise InvalidInputError("each --collection must be a collection name of 1-200 characters (no NUL); "
                                "leave the option out for a key that sees every collection.")
    return out


def _connect(conn):
    if conn is not None:
        return conn, False

    return connect(), True


def create_key(name: str, *, role: str = "query", collections=None, rate_per_minute: int | None = None,
               conn=None) -> dict[str, Any]:
    """Create a key; returns its record plus ``"key"``, the secret (shown only this once).

    ``role``: ``query`` (the default: least privilege) or ``admin``; ``collections``: the names the
    key may see (None: all); ``rate_per_minute``: its own rate limit (None: the service's)."""
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= 200 or "\x00" in name:
        raise InvalidInputError("an API key needs a name of 1-200 characters, e.g. --name alice-laptop.")
    if role not in ROLES:
        raise InvalidInputError(f"role must be one of {list(ROLES)} (query: anchor + resolve; admin: also items, "
                                f"jobs, keys), got {role!r}.")
    scope = _check_scope(collections)
    if rate_per_minute is not None and (isinstance(rate_per_minute, bool) or not isinstance(rate_per_minute, int)
                                        or not 1 <= rate_per_minute <= 10_000_000):
        raise InvalidInputError(f"rate_per_minute must be an integer >= 1 (or left out), got {rate_per_minute!r}.")
    key = new_key()
    c, own = _connect(conn)
    try:
        r = c.execute(sql.SQL("INSERT INTO {} (name, prefix, key_hash, role, collections, rate_per_minute) "
                              "VALUES (%s, %s, %s, %s, %s, %s) RETURNING {}").format(TABLE, _COLS),
                      [name.strip(), key[:12], hash_key(key), role, scope, rate_per_minute]).fetchone()
        # services forget the keys they refused (pm_vector.service.keycache): a new key works at once
        c.execute("SELECT pg_notify(%s, '')", [KEY_CHANNEL])
        c.commit()
    finally:
        if own:
            c.close()
    return {**_row(r), "key": key}


def list_keys(*, include_revoked: bool = True, conn=None) -> list[dict[str, Any]]:
    c, own = _connect(conn)
    try:
        rows = c.execute(sql.SQL("SELECT {} FROM {} WHERE %s OR revoked_at IS NULL ORDER BY id").format(_COLS, TABLE),
                         [include_revoked]).fetchall()
        c.rollback()
    finally:
        if own:
            c.close()
    return [_row(r) for r in rows]


def revoke_key(ident: str | int, *, conn=None) -> dict[str, Any]:
    """Revoke a key by id (an integer) or display prefix (``pmv_...``, 12 characters)."""
    c, own = _connect(conn)
    try:
        s = str(ident).strip()
        if s.isdigit():
            where, arg = sql.SQL("id = %s"), int(s)
        elif s.startswith(KEY_PREFIX):
            where, arg = sql.SQL("prefix = %s"), s[:12]
        else:
            raise InvalidInputError(f"give a key's id (e.g. 3) or its prefix (e.g. pmv_AbCdEfGh); got {ident!r}.")
        rows = c.execute(sql.SQL("UPDATE {} SET revoked_at = coalesce(revoked_at, now()) WHERE {} RETURNING {}").format(
            TABLE, where, _COLS), [arg]).fetchall()
        if len(rows) != 1:
            c.rollback()
            if not rows:
                raise ApiKeyNotFoundError(f"no API key {ident!r}; `pm-vector keys list` shows them.")
            raise InvalidInputError(f"prefix {ident!r} matches {len(rows)} keys; revoke by id instead.")
        c.commit()
    finally:
        if own:
            c.close()
    return _row(rows[0])


def well_formed(key) -> bool:
    """Could ``key`` be an API key at all (``pmv_...``, at most 200 characters)? No lookup."""
    return bool(key) and isinstance(key, str) and len(key) <= _MAX_KEY_LEN and key.startswith(KEY_PREFIX)


def verify_key(conn, key: str | None) -> dict[str, Any] | None:
    """The active key's record, or None (unknown, revoked, malformed). Read-only."""
    if not well_formed(key):
        return None
    h = hash_key(key)
    r = conn.execute(sql.SQL("SELECT {}, key_hash FROM {} WHERE key_hash = %s AND revoked_at IS NULL").format(_COLS, TABLE),
                     [h]).fetchone()
    if r is None or not hmac.compare_digest(r[8], h):
        return None
    return _row(r[:8])


class RateLimiter:
    """Per-key token buckets: ``rate`` requests per minute, bursts up to ``burst``. In memory, per
    service process (a restart refills every bucket; several workers each allow the rate)."""

    def __init__(self, rate_per_minute: int, burst: int | None = None):
        self.rate = int(rate_per_minute)
        self.burst = int(burst) if burst is not None else max(1, self.rate // 6)
        self._buckets: dict[int, list[float]] = {}
        self._lock = threading.Lock()

    def take(self, key_id: int, rate_per_minute: int | None = None, now: float | None = None) -> float:
        """0.0 when the request may go ahead (a token is taken), else the seconds until one is free."""
        if not (rate_per_minute or self.rate):  # 0: no limit
            return 0.0
        rate = (rate_per_minute or self.rate) / 60.0
        burst = self.burst if rate_per_minute is None else max(1, int(rate_per_minute) // 6)
        t = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._buckets.get(key_id, (float(burst), t))
            tokens = min(float(burst), tokens + (t - last) * rate)
            if tokens >= 1.0:
                self._buckets[key_id] = [tokens - 1.0, t]
                return 0.0
            self._buckets[key_id] = [tokens, t]
            return (1.0 - tokens) / rate


class FailedAuthLimiter:
    """Failed authentications per client address: a token bucket of ``per_minute`` failures
    (bursts up to ``per_minute``), refilled continuously. :meth:`wait` says whether an address
    is over it (checked before any key lookup: a blocked address costs the database nothing),
    :meth:`fail` counts one failure. In memory, per service process, which also counts the
    failures the other processes announce (:mod:`pm_vector.service.keycache`); at most
    ``max_addresses`` addresses are tracked (least recently failed out)."""

    def __init__(self, per_minute: int, max_addresses: int = 65_536):
        self.per_minute = int(per_minute)
        self.max_addresses = int(max_addresses)
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _tokens(self, address: str, t: float) -> float:
        b = self._buckets.get(address)
        if b is None:
            return float(self.per_minute)
        return min(float(self.per_minute), b[0] + (t - b[1]) * self.per_minute / 60.0)

    def wait(self, address: str, now: float | None = None) -> float:
        """0.0 if ``address`` may try a key, else the seconds until it may again."""
        if self.per_minute <= 0:
            return 0.0
        t = time.monotonic() if now is None else now
        with self._lock:
            tokens = self._tokens(address, t)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) * 60.0 / self.per_minute

    def fail(self, address: str, now: float | None = None) -> None:
        """Count one failed authentication of ``address``."""
        if self.per_minute <= 0:
            return
        t = time.monotonic() if now is None else now
        with self._lock:
            self._buckets[address] = [max(0.0, self._tokens(address, t) - 1.0), t]
            self._buckets.move_to_end(address)
            while len(self._buckets) > self.max_addresses:
                self._buckets.popitem(last=False)
