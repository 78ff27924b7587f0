"""``pm-vector db cleanup``: everything :func:`pm_vector.db.core.abandoned.cleanup` does (runs
and ingests whose process died, kept consistent with the runs that serve queries), for every
collection, plus:

* :func:`drop_orphan_run_tables`: ``run_<id>_*`` tables whose run failed or no longer exists;
* :func:`prune_request_log`: the request log's retention
  (``pm_vector.db.store.retention.prune_request_log``).

:func:`cleanup_all` runs all three.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ..core.abandoned import cleanup
from ..postgres import connect
from . import retention
from ...errors import InvalidInputError


def orphan_run_tables(conn) -> dict[int, list[str]]:
    """``{run_id: [table, ...]}`` of ``pm_vector.run_<id>_*`` tables whose run is failed or gone
    (``pm_vector.pm_orphan_run_tables()``, migration 0010); never an active run's."""
    by_run: dict[int, list[str]] = {}
    for rid, table, _status in conn.execute("SELECT * FROM pm_vector.pm_orphan_run_tables()").fetchall():
        by_run.setdefault(int(rid), []).append(table)
    return by_run


def drop_orphan_run_tables() -> list[int]:
    """Drop the tables of failed or deleted runs (:func:`orphan_run_tables`); returns their run ids."""
    dropped: list[int] = []
    with connect() as conn:
        for rid in orphan_run_tables(conn):
            conn.execute("SET LOCAL lock_timeout = '30s'")
            # re-check under the run row's lock: a run that came back to life is not touched
            st = conn.execute("SELECT status FROM pm_vector.embedding_runs WHERE id = %s FOR UPDATE", [rid]).fetchone()
            if st is not None and st[0] != "failed":
                conn.rollback()
                continue
            conn.execute("SELECT pm_vector.pm_drop_run_tables(%s)", [rid])
            conn.commit()
            dropped.append(rid)
    return dropped


def cleanup_all(*, prune_requests: bool = True, retention_days: float | None = None) -> dict[str, Any]:
    """Everything :func:`cleanup` does for every collection, orphan run tables dropped, and the
    request log pruned: rows older than ``retention_days`` (None: no age limit) and rows of
    dropped collections.

    Returns ``{"runs", "ingests", "orphan_run_tables", "requests_pruned"}``
    (``requests_pruned`` is None when the request-log retention module is not available).
    """
    out: dict[str, Any] = dict(cleanup(None))
    out["orphan_run_tables"] = drop_orphan_run_tables()
    out["requests_pruned"] = prune_request_log(retention_days) if prune_requests else 0
    return out


def prune_request_log(older_than_days: float | None = None, *, drop_orphans: bool = True) -> int | None:
    """Prune the request log (``pm_vector.db.store.retention.prune_request_log``): rows older than
    ``older_than_days`` (None: no age limit) and, with ``drop_orphans``, rows of dropped
    collections. Returns the rows deleted, or None if that module is not installed."""
    age = None
    if older_than_days is not None:
        if isinstance(older_than_days, bool) or not float(older_than_days) >= 0:
            raise InvalidInputError(f"older_than_days must be a number >= 0, got {older_than_days!r}.")
        age = dt.timedelta(days=float(older_than_days))
    with connect() as conn:
        n = retention.prune_request_log(conn, older_than=age, drop_orphans=drop_orphans)
        if not conn.closed and not conn.autocommit:
            conn.commit()
    return int(n)
