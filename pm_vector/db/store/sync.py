"""The sync of an attached table (:mod:`pm_vector.db.store.attach`): its queued changes applied.

:func:`sync` (``pm-vector sync NAME``; the service's worker runs :func:`sync_pending` every
``sync_interval_s``) applies the queue ``pm_vector.attach_changes`` in order, in batches, each ONE
transaction that also deletes the queue rows it applied: exactly once, and a sync killed at any
point leaves the old state and its queue for the next sync to resume. Per key, the batch's net
effect: a row gone or no longer valid erases its item (:mod:`pm_vector.db.store.erase`'s erasure:
every run table); a new row, or a changed vector or label, replaces the item (erase the old, insert
the new, placed in the active run as ``embed --new-items`` does); a change of other columns updates
the payload only. Skipped rows are reported with their reason.

A batch's cost: the erasure and the placement search the run's items by their features, which the
syncing process keeps between batches (:mod:`pm_vector.db.store.sync_items`,
:mod:`pm_vector.db.runs.item_cache`: read once from the table, then followed batch by batch, read
again when another process changed the run); the cell and location rows both touch are read once
and written once (:func:`pm_vector.db.runs.array_rows.deferred`), and the class rows' prior lists
(``nbrs``/``nhub``) both change are written once (:func:`pm_vector.db.runs.prior_rows.deferred`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ...errors import InvalidInputError
from ..postgres import connect
from ._common import collection_row
from .sync_items import RunItems

#: queue rows one sync transaction applies
SYNC_BATCH = 5_000


def not_attached(collection: str) -> InvalidInputError:
    return InvalidInputError(f"collection {collection!r} is not attached to a table (pm-vector attach).")


def sync(collection: str, *, batch: int = SYNC_BATCH, embed_fn_extend=None, max_batches: int | None = None,
         url: str | None = None) -> dict[str, Any]:
    """Apply the changes queued before the call, in order, ``batch`` at a time, each batch one
    transaction (module doc). Returns the counts and the skipped rows (``[(key, reason)]``).
    ``url``: the database (None: pm_vector's, starting the embedded server if it is the mode; the
    service's worker gives its pool's, so that it never starts a server)."""
    total = {"collection": collection, "applied": 0, "inserted": 0, "replaced": 0, "deleted": 0, "payloads": 0,
             "skipped": [], "batches": 0}
    t = time.perf_counter()
    with connect(url) as conn:  # the changes queued before this call: a sync ends under a steady stream
        coll = collection_row(conn, collection)
        upto = conn.execute("SELECT max(seq) FROM pm_vector.attach_changes WHERE collection_id = %s",
                            [coll["id"]]).fetchone()[0]
    while upto is not None and (max_batches is None or total["batches"] < max_batches):
        done = _sync_batch(collection, int(batch), embed_fn_extend, int(upto), url)
        if done is None:
            break
        total["batches"] += 1
        for k in ("applied", "inserted", "replaced", "deleted", "payloads"):
            total[k] += done[k]
        total["skipped"] += done["skipped"]
    total["seconds"] = round(time.perf_counter() - t, 3)
    return total


def sync_pending(url: str | None = None) -> dict[str, Any]:
    """:func:`sync` every attached collection that has queued changes (what the service's worker
    runs every ``sync_interval_s``, with its pool's ``url``: it never starts a server). Returns
    ``{name: changes applied}``, and for a collection whose sync failed ``{name: "the error's
    type"}`` (its queue stays for the next pass).

    Several processes may run it at once: a batch locks its collection's row, and a batch that
    finds its changes already applied by another process applies nothing."""
    with connect(url) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT c.name FROM pm_vector.collections c WHERE EXISTS (SELECT 1 FROM pm_vector.attach_changes a "
            "WHERE a.collection_id = c.id) ORDER BY c.name").fetchall()]
    out: dict[str, Any] = {}
    for name in names:
        try:
            out[name] = sync(name, url=url)["applied"]
        except Exception as exc:  # noqa: BLE001 - one collection's failure must not stop the others
            out[name] = type(exc).__name__
    return out


def _source_rows(conn, att: dict, keys: list) -> dict:
    """The user's table's rows of the changed keys: key -> (vector is NULL, its dimensions, label,
    payload)."""
    from ._source import quote_ident

    lab = f"s.{quote_ident(att['label_column'])}::bigint" if att.get("label_column") else "0::bigint"
    pcols = att.get("payload_columns") or []
    pay = ("jsonb_build_object(" + ", ".join(f"'{c}', s.{quote_ident(c)}" for c in pcols) + ")") if pcols else "NULL::jsonb"
    v = f"s.{quote_ident(att['vector_column'])}"
    return {r[0]: r[1:] for r in conn.execute(
        f"SELECT s.{quote_ident(att['id_column'])}::text, {v} IS NULL, CASE WHEN {v} IS NULL THEN NULL ELSE "
        f"vector_dims({v}) END, {lab}, {pay} FROM {att['table']} AS s "
        f"WHERE s.{quote_ident(att['id_column'])} = ANY(%s::{att['id_type']}[])", [keys]).fetchall()}


def _classify_changes(coll, keys: list, ops: dict, src: dict, items: dict) -> tuple:
    """Per changed key, what the batch does: the items to erase, the rows to insert, the payloads to
    update, the rows skipped and why. Returns (erase, insert, payloads, skipped)."""
    allowed = set(int(x) for x in coll["labels"])
    erase, insert, payloads, skipped = [], [], [], []
    for key in keys:
        s = src.get(key)
        reason = None
        if s is not None:
            isnull, dims, label, _p = s
            if isnull:
                reason = "vector is NULL"
            elif dims != coll["feature_dim"]:
                reason = f"vector has {dims} dimensions, the collection {coll['feature_dim']}"
            elif label is None or int(label) not in allowed:
                reason = f"label {label} is not in the collection's label set"
        if reason is not None:
            skipped.append((key, reason))
        valid = s is not None and reason is None
        item = items.get(key)
        replace = any(op in ("I", "U", "D") for op, _ in ops[key])
        if item is not None and (not valid or replace):
            erase.append(item[0])
        if valid and (item is None or replace):
            insert.append((key, int(s[2]), s[3]))
        elif valid and item is not None:
            payloads.append((s[3], item[0]))
    return erase, insert, payloads, skipped



def _sync_batch(collection: str, batch: int, embed_fn_extend, upto: int, url: str | None = None
                ) -> dict[str, Any] | None:
    from ..runs import array_rows, erase as _erase, prior_rows, row_cache
    from .erase import erase_kahm, runs_with_tables

    with connect(url, watch_client=True) as conn:
        coll = collection_row(conn, collection, lock="FOR NO KEY UPDATE")
        att = (coll["settings"] or {}).get("attached")
        if not att:
            raise not_attached(collection)
        rows = conn.execute("SELECT seq, op, key, old_vector FROM pm_vector.attach_changes WHERE collection_id = %s "
                            "AND seq <= %s ORDER BY seq LIMIT %s", [coll["id"], upto, batch]).fetchall()
        if not rows:
            conn.rollback()
            return None
        last = rows[-1][0]
        ops: dict[str, list] = {}
        for _seq, op, key, old in rows:
            ops.setdefault(key, []).append((op, old))
        keys = sorted(ops)
        src = _source_rows(conn, att, keys)
        items = {r[0]: (r[1], r[2]) for r in conn.execute(
            "SELECT external_id, id, label FROM pm_vector.items WHERE collection_id = %s AND external_id = ANY(%s)",
            [coll["id"], keys]).fetchall()}
        erase, insert, payloads, skipped = _classify_changes(coll, keys, ops, src, items)
        gone = np.array(sorted(int(i) for i in erase), dtype=np.int64)
        runs = runs_with_tables(conn, coll["id"])
        run_items = RunItems(conn, coll, runs)
        kept = row_cache.Kept(conn, runs)
        # the cell and location rows, and the class rows' prior lists: written once, by the batch
        with array_rows.deferred(conn), prior_rows.deferred(conn):
            kept.seed(conn)  # the rows this process held after its last batch, still as the tables hold them
            if gone.size:
                _erase.erase_in_runs(conn, gone, runs, run_items.load, quick=True)
                run_items.erased(gone)
                erase_kahm(conn, coll, gone)
                conn.execute("DELETE FROM pm_vector.items WHERE id = ANY(%s)", [gone.tolist()])
            _write_items(conn, coll, insert, payloads)
            if insert and coll["active_run_id"] is not None:
                _place_new(conn, collection, coll, embed_fn_extend, run_items)
            kept.collect(conn)
        conn.execute("DELETE FROM pm_vector.attach_changes WHERE collection_id = %s AND seq <= %s", [coll["id"], last])
        cache_keys = run_items.keys()
        conn.commit()
    run_items.keep(cache_keys)
    kept.keep(cache_keys)
    n_replaced = sum(1 for k, _l, _p in insert if k in items)
    return {"applied": len(rows), "inserted": len(insert) - n_replaced, "replaced": n_replaced,
            "deleted": int(gone.size) - n_replaced, "payloads": len(payloads), "skipped": skipped}


def _write_items(conn, coll, insert: list, payloads: list) -> None:
    """The batch's new items rows and payload updates."""
    from psycopg.types.json import Jsonb

    if insert:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO pm_vector.items (collection_id, external_id, label, payload) "
                            "VALUES (%s, %s, %s, %s)",
                            [(coll["id"], k, lab_, None if p is None else Jsonb(p)) for k, lab_, p in insert])
    if payloads:
        with conn.cursor() as cur:
            cur.executemany("UPDATE pm_vector.items SET payload = %s WHERE id = %s",
                            [(None if p is None else Jsonb(p), i) for p, i in payloads])


def _place_new(conn, collection: str, coll, embed_fn_extend, run_items: RunItems) -> None:
    """The batch's new items placed in the active run (``embed --new-items``, against the run's items
    as built); a sharded run takes them with the next full job."""
    from ..runs.jobs import anchor_frame_extend_fn
    from ..runs.new_items import embed_new_items

    rid = int(coll["active_run_id"])
    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0] or {}
    if doc.get("shards"):
        return
    ready = doc.get("status") == "ready"
    if ready and rid not in run_items.items:  # (its current version: the batch erased nothing from it)
        run_items.docs[rid] = doc
    embed_new_items(collection, embed_fn_extend or anchor_frame_extend_fn, conn=conn,
                    run_items=run_items.load(rid) if ready else None,
                    on_placed=(lambda added: run_items.placed(rid, added)) if ready else None)
