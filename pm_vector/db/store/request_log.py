"""The request log: every resolved request, as the client released it, with its timing.

Only what the client released is stored (never raw client data); the rows are pruned by
:mod:`pm_vector.db.store.retention`.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from ...errors import InvalidInputError
from ..postgres import connect
from ..core.collection import iso_datetime
from ._validate import json_safe


def log_request(collection: str, request: Any, *, run_id: int | None = None, row_count: int | None = None,
                received_at: dt.datetime | None = None, finished_at: dt.datetime | None = None,
                duration_ms: float | None = None, status: str = "ok", error: str | None = None,
                conn=None, request_json: str | None = None) -> int:
    """Record a resolved request: only what the client released (``request``, JSON), timing and
    the number of rows returned. Never pass raw client data here. Returns the log id.

    ``request_json``: the request as the JSON text the client sent, stored instead of
    serialising ``request`` again (the server's copy of exactly what was received; PostgreSQL
    checks it is JSON). ``conn``: an idle connection to use (committed here) instead of a new one.
    """
    if status not in ("ok", "error"):
        raise InvalidInputError("status must be 'ok' or 'error'.")
    if request_json is not None:
        if not isinstance(request_json, str):
            raise InvalidInputError("request_json must be JSON text (str).")
        value = Jsonb(None, dumps=lambda _obj: request_json)
    else:
        json_safe(request, "request")
        value = Jsonb(request)
    if duration_ms is None and received_at is not None and finished_at is not None:
        duration_ms = (finished_at - received_at).total_seconds() * 1000.0
    if duration_ms is not None and not math.isfinite(float(duration_ms)):
        raise InvalidInputError("duration_ms must be finite.")
    own = conn is None
    if own:
        conn = connect()
    try:
        # the id from the sequence, not RETURNING id: the query role may insert into the log, never read it
        log_id = conn.execute(
            "WITH n AS (SELECT nextval('pm_vector.request_log_id_seq') AS id), "
            "l AS (INSERT INTO pm_vector.request_log (id, collection_id, collection_name, run_id, request, status, "
            "error, row_count, received_at, finished_at, duration_ms) "
            "SELECT n.id, (SELECT id FROM pm_vector.collections WHERE name = %s), %s, %s, %s, %s, %s, %s, "
            "coalesce(%s, now()), %s, %s FROM n RETURNING 1) "
            "SELECT n.id FROM n",
            [collection, collection, run_id, value, status, error, row_count, received_at,
             finished_at, duration_ms]).fetchone()[0]
        if not conn.autocommit:
            conn.commit()
    except BaseException:
        if not conn.autocommit:
            conn.rollback()
        raise
    finally:
        if own:
            conn.close()
    return int(log_id)


def list_requests(collection: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The newest logged requests (rows of ``pm_vector.pm_requests``), newest first."""
    with connect() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            if collection is None:
                cur.execute("SELECT * FROM pm_vector.pm_requests ORDER BY id DESC LIMIT %s", [int(limit)])
            else:
                cur.execute("SELECT * FROM pm_vector.pm_requests WHERE collection = %s ORDER BY id DESC LIMIT %s",
                            [collection, int(limit)])
            return [{k: iso_datetime(v) for k, v in r.items()} for r in cur.fetchall()]
