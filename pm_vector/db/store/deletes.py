"""Deleting items: ``delete_items(collection, item_ids=... | external_ids=...)``.

ONE transaction removes the items from every answer: a tombstone in the active run and in every
run kept for switching back (:mod:`pm_vector.db.runs.delta`; their derived rows leave with the next
merge, :mod:`pm_vector.db.runs.merge`, on a sharded run's shards too; a run without ready class rows,
or any run of a collection created with ``settings={"delta": False}``, is erased as before by :func:`pm_vector.db.runs.erase.erase_from_run`, which walks the single registry of
the run's tables), the stored KAHM class scores, and the items themselves; raw KAHM models that may have been fit on a deleted item are marked
``erased_at`` and stop serving until they are refit (noisy and fabricated models keep serving).

Concurrency: the transaction holds the collection row ``FOR NO KEY UPDATE``, as an embedding job's
switch and ``embed --new-items`` do (``FOR SHARE``), so a delete and a switch are ordered: a job
that switches after the delete takes the deleted items out of its new run in its switch
transaction (:func:`pm_vector.db.runs.erase.apply_pending`: tombstones where the run takes the delta,
the erasure otherwise); a job that switched before is an active run the delete walks.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from psycopg import sql

from ...errors import InvalidInputError
from ..errors import DatabaseError
from ..postgres import connect
from ..core.collection import collection_row, load_items
from ..runs import delta, erase as _erase

#: ids one call may delete (the run tables are rewritten in one transaction)
MAX_DELETE = 1_000_000


class ItemNotFoundError(DatabaseError, LookupError):
    """Some of the ids to delete or update are not items of the collection (nothing was changed)."""


def ids_to_erase(item_ids, external_ids) -> tuple[str, list]:
    if (item_ids is None) == (external_ids is None):
        raise InvalidInputError("give exactly one of item_ids and external_ids.")
    if item_ids is not None:
        vals = list(item_ids) if not isinstance(item_ids, (str, bytes)) else None
        if vals is None or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in vals):
            raise InvalidInputError("item_ids must be a list of integers.")
        vals = [int(v) for v in vals]
        if any(not 1 <= v < 2**63 for v in vals):
            raise InvalidInputError("item_ids must be positive 64-bit integers.")
        kind = "id"
    else:
        vals = list(external_ids) if not isinstance(external_ids, (str, bytes)) else None
        if vals is None or any(not isinstance(v, str) or not v or len(v) > 1000 for v in vals):
            raise InvalidInputError("external_ids must be a list of non-empty strings (at most 1,000 characters).")
        kind = "external_id"
    if len(vals) > MAX_DELETE:
        raise InvalidInputError(f"{len(vals):,} ids; at most {MAX_DELETE:,} per call.")
    return kind, sorted(set(vals))


def resolve_item_ids(conn, coll, kind: str, vals: list, missing_ok: bool) -> np.ndarray:
    rows = conn.execute(sql.SQL("SELECT id, {k} FROM pm_vector.items WHERE collection_id = %s AND {k} = ANY(%s)").format(
        k=sql.Identifier(kind)), [coll["id"], vals]).fetchall()
    found = {r[1] for r in rows}
    missing = [v for v in vals if v not in found]
    if missing and not missing_ok:
        raise ItemNotFoundError(
            f"{len(missing):,} of the {len(vals):,} {kind}s are not items of collection {coll['name']!r} "
            f"(first: {missing[:5]}); nothing was deleted. Pass missing_ok=True (--missing-ok) to delete the others.")
    return np.array(sorted(r[0] for r in rows), dtype=np.int64)


def check_not_attached(coll, what: str) -> None:
    att = (coll["settings"] or {}).get("attached")
    if att:
        raise InvalidInputError(
            f"collection {coll['name']!r} is attached to table {att['table']}: {what} the rows there, and "
            f"`pm-vector sync {coll['name']}` (pm_vector.db.sync) applies the change everywhere. Nothing was changed.")


def runs_with_tables(conn, coll_id: int) -> list[tuple]:
    return conn.execute(
        "SELECT id, class_rows FROM pm_vector.embedding_runs WHERE collection_id = %s "
        "AND status = 'succeeded' AND to_regclass(pm_vector.pm_run_table(id, 'items')) IS NOT NULL ORDER BY id",
        [coll_id]).fetchall()


def delete_items(collection: str, *, item_ids=None, external_ids=None, missing_ok: bool = False) -> dict[str, Any]:
    """Delete items by ``item_ids`` or ``external_ids`` (exactly one) and everything derived from them,
    in ONE transaction (module doc). Unknown ids raise :class:`ItemNotFoundError` and delete nothing,
    unless ``missing_ok``. Returns ``{"collection", "deleted", "item_ids", "runs", "kahm_refit_needed",
    "seconds"}``."""
    kind, vals = ids_to_erase(item_ids, external_ids)
    t = time.perf_counter()
    with connect(watch_client=True) as conn:
        coll = collection_row(conn, collection, lock="FOR NO KEY UPDATE")
        check_not_attached(coll, "delete")
        ids = resolve_item_ids(conn, coll, kind, vals, missing_ok)
        out = {"collection": collection, "deleted": int(ids.size), "item_ids": ids.tolist(), "runs": [],
               "kahm_refit_needed": []}
        if ids.size == 0:
            conn.rollback()
            out["seconds"] = round(time.perf_counter() - t, 3)
            return out
        out["runs"] = erase_or_tombstone(conn, coll, ids, runs_with_tables(conn, coll["id"]))
        out["kahm_refit_needed"] = erase_kahm(conn, coll, ids)
        conn.execute("DELETE FROM pm_vector.items WHERE collection_id = %s AND id = ANY(%s)", [coll["id"], ids.tolist()])
        conn.commit()
    out["seconds"] = round(time.perf_counter() - t, 3)
    return out


def erase_or_tombstone(conn, coll, ids: np.ndarray, runs, load=None, *, quick: bool = False) -> list[int]:
    """The items ``ids`` leave the answers of each run ``(run_id, class_rows)``, in the caller's
    transaction: a tombstone where the run takes the delta (:mod:`pm_vector.db.runs.delta`: its
    derived rows stay, never answered, until the merge), else the erasure of every run table
    (:func:`pm_vector.db.runs.erase.erase_in_runs`; ``load(run_id)``: the run's items, read when None).
    Returns the runs that held some of them."""
    fast, slow = delta.split_runs(runs, coll)
    touched = delta.tombstone(conn, ids, fast)
    if slow:
        touched += _erase.erase_in_runs(conn, ids, slow, load or (lambda rid: load_items(conn, coll, in_run=rid)),
                                        quick=quick)
    return sorted(touched)


def erase_kahm(conn, coll, ids: np.ndarray) -> list[int]:
    """The deleted items' stored class scores go; raw models fit after the first of them was stored
    (which may hold it among their training rows) are marked ``erased_at``: they stop serving."""
    conn.execute("DELETE FROM pm_vector.kahm_item_scores s USING pm_vector.kahm_models m WHERE m.id = s.model_id "
                 "AND m.collection_id = %s AND s.item_id = ANY(%s)", [coll["id"], ids.tolist()])
    rows = conn.execute(
        "UPDATE pm_vector.kahm_models SET erased_at = now() WHERE collection_id = %s AND kind = 'raw' "
        "AND erased_at IS NULL AND created_at >= (SELECT min(created_at) FROM pm_vector.items WHERE id = ANY(%s)) "
        "RETURNING id", [coll["id"], ids.tolist()]).fetchall()
    return sorted(int(r[0]) for r in rows)
