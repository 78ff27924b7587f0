"""API keys: created by ``pm-vector keys create``, stored hashed, checked on every request.

A key is ``pmv_`` + 32 random bytes (``secrets.token_urlsafe``). The database keeps its
SHA-256 (hex), a display prefix (the first 12 characters) and a name; the key itself is shown
once, at creation. A 256-bit random secret needs no slow hash: there is nothing to guess.
Clients send it as ``Authorization: Bearer <key>`` (or ``X-API-Key: <key>``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from typing import Any

from ..errors import InvalidInputError, PMVectorError

TABLE = "pm_vector_service.api_keys"
KEY_PREFIX = "pmv_"
_MAX_KEY_LEN = 200


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
            "active": r[4] is None}


def _connect(conn):
    if conn is not None:
        return conn, False
    from ..db.engine import connect

    return connect(), True


def create_key(name: str, *, conn=None) -> dict[str, Any]:
    """Create a key; returns its record plus ``"key"``, the secret (shown only this once)."""
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= 200:
        raise InvalidInputError("an API key needs a name of 1-200 characters, e.g. --name alice-laptop.")
    key = new_key()
    c, own = _connect(conn)
    try:
        r = c.execute(f"INSERT INTO {TABLE} (name, prefix, key_hash) VALUES (%s, %s, %s) "
                      "RETURNING id, name, prefix, created_at, revoked_at",
                      [name.strip(), key[:12], hash_key(key)]).fetchone()
        c.commit()
    finally:
        if own:
            c.close()
    return {**_row(r), "key": key}


def list_keys(*, include_revoked: bool = True, conn=None) -> list[dict[str, Any]]:
    c, own = _connect(conn)
    try:
        rows = c.execute(f"SELECT id, name, prefix, created_at, revoked_at FROM {TABLE} "
                         "WHERE %s OR revoked_at IS NULL ORDER BY id", [include_revoked]).fetchall()
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
            where, arg = "id = %s", int(s)
        elif s.startswith(KEY_PREFIX):
            where, arg = "prefix = %s", s[:12]
        else:
            raise InvalidInputError(f"give a key's id (e.g. 3) or its prefix (e.g. pmv_AbCdEfGh); got {ident!r}.")
        rows = c.execute(f"UPDATE {TABLE} SET revoked_at = coalesce(revoked_at, now()) WHERE {where} "
                         "RETURNING id, name, prefix, created_at, revoked_at", [arg]).fetchall()
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


def verify_key(conn, key: str | None) -> dict[str, Any] | None:
    """The active key's record, or None (unknown, revoked, malformed). Read-only."""
    if not key or not isinstance(key, str) or len(key) > _MAX_KEY_LEN or not key.startswith(KEY_PREFIX):
        return None
    h = hash_key(key)
    r = conn.execute(f"SELECT id, name, prefix, created_at, revoked_at, key_hash FROM {TABLE} "
                     "WHERE key_hash = %s AND revoked_at IS NULL", [h]).fetchone()
    if r is None or not hmac.compare_digest(r[5], h):
        return None
    return _row(r[:5])
