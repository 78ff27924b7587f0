"""Work whose process died: embedding runs and ingests left ``running`` by a worker that is gone.

A worker holds a session-level advisory lock for as long as its work runs (``pm_lock_key(kind,
id)``: :data:`RUN_LOCK_KIND` for a run, taken by :func:`pm_vector.db.runs.jobs.run_embedding_job`;
:data:`INGEST_LOCK_KIND` for an ingest of older versions); when the process dies the server ends
its session and the lock goes. :func:`cleanup` (run at the start of every embedding job, and by
``pm-vector db cleanup``) finds such work and undoes it:

* a stale ``running`` run is marked ``failed`` and its tables dropped (:func:`fail_run`, which the
  job also calls when it fails; :func:`cleanup_stale_runs`);
* an abandoned ``running`` ingest is marked ``failed``. Ingests are one transaction, so a killed
  one leaves nothing to delete. Ingests written by older versions committed batch by batch; an
  abandoned one of those may have rows that a run already embedded. Deleting those items would
  leave the run's tables pointing at nothing (every resolve answered 0 neighbours), so such rows
  are kept and the ingest is marked failed saying so; rows no run holds are deleted.

Below :mod:`pm_vector.db.runs` and :mod:`pm_vector.db.store` (:mod:`pm_vector.db.core`);
``pm_vector.db.store.maintenance.cleanup_all`` adds the orphan run tables and the request log.
"""

from __future__ import annotations

from psycopg import sql

from ..postgres import connect
from ..run_tables import run_table
from .collection import collection_row

#: advisory-lock kind of an embedding run (``pm_vector.pm_lock_key(1, run_id)``)
RUN_LOCK_KIND = 1
#: advisory-lock kind of an ingest (``pm_vector.pm_lock_key(2, ingest_id)``) of older versions
INGEST_LOCK_KIND = 2


def _runs_holding(conn, cid: int, ingest_id: int) -> list[int]:
    """Runs of the collection (not failed, tables present) whose items table has a row of the ingest."""
    runs = conn.execute(
        "SELECT id FROM pm_vector.embedding_runs WHERE collection_id = %s AND status <> 'failed' "
        "AND to_regclass(pm_vector.pm_run_table(id, 'items')) IS NOT NULL ORDER BY id", [cid]).fetchall()
    held = []
    for (rid,) in runs:
        hit = conn.execute(
            sql.SQL("SELECT EXISTS (SELECT 1 FROM {} r JOIN pm_vector.items i ON i.id = r.item_id "
                    "WHERE i.collection_id = %s AND i.ingest_id = %s)").format(run_table(rid, "items")),
            [cid, ingest_id]).fetchone()[0]
        if hit:
            held.append(int(rid))
    return held


def _lock_free(conn, collection: str | None, table: str, statuses: tuple[str, ...],
               lock_kind: int) -> list[tuple[int, int]]:
    """``(id, collection id)`` of the rows of ``pm_vector.<table>`` in one of ``statuses`` (of
    ``collection``, or of every collection) whose advisory lock (``pm_lock_key(lock_kind, id)``) no
    session holds: work whose worker is gone, by id. Ends the reading transaction; the caller
    checks each row again under its own lock before it undoes it."""
    cid = None if collection is None else collection_row(conn, collection)["id"]
    rows = conn.execute(
        sql.SQL("SELECT id, collection_id FROM {} WHERE status = ANY(%s) AND (%s::bigint IS NULL OR collection_id = %s) "
                "AND NOT pm_vector.pm_lock_held(pm_vector.pm_lock_key(%s, id)) ORDER BY id").format(
                    sql.Identifier("pm_vector", table)), [list(statuses), cid, cid, lock_kind]).fetchall()
    conn.rollback()
    return [(int(i), int(c)) for i, c in rows]


def _abandoned_ingests(collection: str | None) -> list[int]:
    done: list[int] = []
    with connect() as conn:
        for iid, c in _lock_free(conn, collection, "ingests", ("running",), INGEST_LOCK_KIND):
            conn.execute("SET LOCAL lock_timeout = '30s'")
            row = conn.execute("SELECT status FROM pm_vector.ingests WHERE id = %s FOR UPDATE", [iid]).fetchone()
            held = conn.execute("SELECT pm_vector.pm_lock_held(pm_vector.pm_lock_key(%s, %s))",
                                [INGEST_LOCK_KIND, iid]).fetchone()[0]
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


def fail_run(conn, run_id: int, error: str) -> None:
    """Mark a run failed and drop its tables (one transaction on ``conn``); no-op if already final."""
    conn.execute("SET LOCAL lock_timeout = '30s'")
    row = conn.execute("SELECT status FROM pm_vector.embedding_runs WHERE id = %s FOR UPDATE", [run_id]).fetchone()
    if row is not None and row[0] in ("running", "pending"):
        conn.execute("UPDATE pm_vector.embedding_runs SET status = 'failed', error = %s, finished_at = now() "
                     "WHERE id = %s", [error[:4000], run_id])
    active = conn.execute("SELECT 1 FROM pm_vector.collections WHERE active_run_id = %s", [run_id]).fetchone()
    if active is None:
        conn.execute("SELECT pm_vector.pm_drop_run_tables(%s)", [run_id])
    conn.commit()


def cleanup_stale_runs(collection: str | None = None) -> list[int]:
    """Mark ``running`` runs whose worker is gone as ``failed`` and drop their tables.

    "Gone" means no session holds the run's advisory lock (the job takes it before its row is
    visible and keeps it until the run is final). Returns the ids of the runs cleaned up.
    """
    done: list[int] = []
    with connect() as conn:
        for rid, _c in _lock_free(conn, collection, "embedding_runs", ("running", "pending"), RUN_LOCK_KIND):
            # take the lock ourselves: if we get it, no worker can hold it (re-check under lock)
            got = conn.execute("SELECT pg_try_advisory_lock(pm_vector.pm_lock_key(%s, %s))",
                               [RUN_LOCK_KIND, rid]).fetchone()[0]
            conn.commit()
            if not got:
                continue
            try:
                st = conn.execute("SELECT status FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()
                conn.rollback()
                if st is not None and st[0] in ("running", "pending"):
                    fail_run(conn, rid, "abandoned: the job's process ended (killed or lost its database "
                                         "connection) before the run finished; its tables were dropped")
                    done.append(int(rid))
            finally:
                conn.execute("SELECT pg_advisory_unlock(pm_vector.pm_lock_key(%s, %s))", [RUN_LOCK_KIND, rid])
                conn.commit()
    return done
