"""Clean-up of work whose process died, kept consistent with the runs that serve queries.

* :func:`cleanup` (run by every embedding job, and by ``pm-vector db cleanup``): stale
  ``running`` runs (their worker's advisory lock is gone) are marked ``failed`` and their tables
  dropped; abandoned ``running`` ingests are marked ``failed``.
* :func:`drop_orphan_run_tables`: ``run_<id>_*`` tables whose run failed or no longer exists.
* :func:`cleanup_all`: both, for every collection, plus the request log's retention
  (``pm_vector.db.store.retention.prune_request_log``).

Ingests are one transaction (:func:`pm_vector.db.store.api.ingest`), so a killed one leaves nothing to
delete. Ingests written by older versions committed batch by batch; an abandoned one of those
may have rows that a run already embedded. Deleting those items would leave the run's tables
pointing at nothing (every resolve answered 0 neighbours), so such rows are kept and the ingest
is marked failed saying so; rows no run holds are deleted.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from . import retention
from ._common import collection_row, cleanup_stale_runs
from ..postgres import connect
from ...errors import InvalidInputError

INGEST_LOCK_KIND = 2


def _runs_holding(conn, cid: int, ingest_id: int) -> list[int]:
    """Runs of the collection (not failed, tables present) whose items table has a row of the ingest."""
    runs = conn.execute(
        "SELECT id FROM pm_vector.embedding_runs WHERE collection_id = %s AND status <> 'failed' "
        "AND to_regclass(pm_vector.pm_run_table(id, 'items')) IS NOT NULL ORDER BY id", [cid]).fetchall()
    held = []
    for (rid,) in runs:
        hit = conn.execute(
            f"SELECT EXISTS (SELECT 1 FROM pm_vector.run_{int(rid)}_items r JOIN pm_vector.items i "
            "ON i.id = r.item_id WHERE i.collection_id = %s AND i.ingest_id = %s)", [cid, ingest_id]).fetchone()[0]
        if hit:
            held.append(int(rid))
    return held


def _abandoned_ingests(collection: str | None) -> list[int]:
    done: list[int] = []
    with connect() as conn:
        cid = None
        if collection is not None:
            cid = collection_row(conn, collection)["id"]
        rows = conn.execute(
            "SELECT id, collection_id FROM pm_vector.ingests WHERE status = 'running' "
            "AND (%s::bigint IS NULL OR collection_id = %s) "
            f"AND NOT pm_vector.pm_lock_held(pm_vector.pm_lock_key({INGEST_LOCK_KIND}, id))", [cid, cid]).fetchall()
        conn.rollback()
        for iid, c in rows:
            conn.execute("SET LOCAL lock_timeout = '30s'")
            row = conn.execute("SELECT status FROM pm_vector.ingests WHERE id = %s FOR UPDATE", [iid]).fetchone()
            held = conn.execute(f"SELECT pm_vector.pm_lock_held(pm_vector.pm_lock_key({INGEST_LOCK_KIND}, %s))",
                                [iid]).fetchone()[0]
            if row is None or row[0] != "running" or held:
                conn.rollback()
                continue
            # as a job's switch does (NO KEY: running ingests hold KEY SHARE through their foreign
            # key); no switch happens between the check below and the delete
            conn.execute("SELECT 1 FROM pm_vector.collections WHERE id = %s FOR NO KEY UPDATE", [c])
            runs = _runs_holding(conn, c, iid)
            if runs:
                msg = (f"abandoned: its process ended before the ingest finished; its rows were kept because "
                       f"run(s) {runs} already embedded them")
            else:
                conn.execute("DELETE FROM pm_vector.items WHERE collection_id = %s AND ingest_id = %s", [c, iid])
                msg = "abandoned: its process ended before the ingest finished; its rows were deleted"
            conn.execute("UPDATE pm_vector.ingests SET status = 'failed', finished_at = now(), error = %s "
                         "WHERE id = %s", [msg, iid])
            conn.commit()
            done.append(int(iid))
    return done


def cleanup(collection: str | None = None) -> dict[str, list[int]]:
    """Find work whose process died and undo it; returns ``{"runs": [...], "ingests": [...]}``.

    A ``running`` embedding run or ingest whose advisory lock no session holds has lost its
    worker (process killed, connection gone). Such runs are marked ``failed`` and their tables
    dropped (they were never active); such ingests are marked ``failed`` and their rows deleted
    unless a run already embedded them (see the module doc). Safe to run any time, from any
    process; never removes a row an active run serves.
    """
    runs = cleanup_stale_runs(collection)
    return {"runs": runs, "ingests": _abandoned_ingests(collection)}


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
    collections. Returns the rows deleted."""
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
