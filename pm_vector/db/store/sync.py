"""The sync of an attached table (:mod:`pm_vector.db.store.attach`): its queued changes applied.

:func:`sync` (``pm-vector sync NAME``; the service's worker runs :func:`sync_pending` every
``sync_interval_s``) applies the queue ``pm_vector.attach_changes`` in order, in batches, each ONE
transaction that also deletes the queue rows it applied: exactly once, and a sync killed at any
point leaves the old state and its queue for the next sync to resume. Per key, the batch's net
effect: a row gone or no longer valid erases its item (:mod:`pm_vector.db.store.deletes`'s erasure: a
tombstone in the runs that take the delta, :mod:`pm_vector.db.runs.delta`); a new row, or a changed
vector or label, replaces the item (erase the old, insert the new, placed in the active run's delta
as ``embed --new-items`` does); a change of other columns updates
the payload only (and the runs' ``answers_version`` + 1: the cached answers carry payloads).

A bad row never blocks the queue: a change that cannot be applied (a NULL vector or one of another
dimension, a label that is not an integer or not in the label set, a payload over ingest's bounds,
a vector the active run cannot place) is **rejected** -- its key has no item, it is kept with its
reason in ``pm_vector.attach_rejected`` (:mod:`pm_vector.db.store.sync_rows`) until the key's next
change -- and the rest of the batch, deletes included, is applied.

A batch's cost: the erasure and the placement search the run's items by their features, which the
syncing process keeps between batches (:mod:`pm_vector.db.store.sync_items`,
:mod:`pm_vector.db.runs.item_cache`: read once from the table, then followed batch by batch, read
again when another process changed the run); the cell and location rows both touch are read once
and written once (:func:`pm_vector.db.runs.array_rows.deferred`), and the class rows' prior lists
(``nbrs``/``nhub``) both change are written once (:func:`pm_vector.db.runs.prior_rows.deferred`).
"""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb

from ...errors import InvalidInputError
from ..postgres import connect
from . import sync_rows
from ..core.collection import collection_row, load_items
from ..runs import array_rows, prior_rows, row_cache
from ..runs.delta import takes_delta, waits_for_job
from ..runs.jobs import anchor_frame_extend_fn
from ..runs.new_items import embed_new_items
from .capture import check_attached
from .deletes import erase_kahm, erase_or_tombstone, runs_with_tables
from .payloads import bump_answers_version, payload_bytes, raise_high
from .sync_items import RunItems

#: queue rows one sync transaction applies
SYNC_BATCH = 5_000


def not_attached(collection: str) -> InvalidInputError:
    return InvalidInputError(f"collection {collection!r} is not attached to a table (pm-vector attach).")


def sync(collection: str, *, batch: int = SYNC_BATCH, embed_fn_extend=None, max_batches: int | None = None,
         url: str | None = None, conn=None) -> dict[str, Any]:
    """Apply the changes queued before the call, in order, ``batch`` at a time, each batch one
    transaction (module doc). Returns the counts and the changes rejected (``"rejected": [(key,
    reason)]``, kept in ``pm_vector.attach_rejected`` until the key's next change: :mod:`~pm_vector.db.store.sync_rows`).
    InvalidInputError for a collection that is not attached, CollectionNotFoundError for an unknown one.
    ``url``: the database (None: pm_vector's, starting the embedded server if it is the mode; the
    service's worker gives its pool's, so that it never starts a server). ``conn``: a connection to use
    (:func:`sync_pending` gives one for all its collections: no connection made per batch), left
    open and rolled back on failure."""
    total = {"collection": collection, "applied": 0, "inserted": 0, "replaced": 0, "deleted": 0, "payloads": 0,
             "rejected": [], "batches": 0}
    t = time.perf_counter()
    own = conn is None
    if own:
        conn = connect(url, watch_client=True)
    try:
        # the changes queued before this call: a sync ends under a steady stream
        coll = collection_row(conn, collection)
        if not (coll["settings"] or {}).get("attached"):
            raise not_attached(collection)
        check_attached(conn, coll)  # (refused when broken, also with nothing queued)
        upto = conn.execute("SELECT max(seq) FROM pm_vector.attach_changes WHERE collection_id = %s",
                            [coll["id"]]).fetchone()[0]
        conn.rollback()
        while upto is not None and (max_batches is None or total["batches"] < max_batches):
            done = _sync_batch(conn, collection, int(batch), embed_fn_extend, int(upto))
            if done is None:
                break
            total["batches"] += 1
            for k in ("applied", "inserted", "replaced", "deleted", "payloads"):
                total[k] += done[k]
            total["rejected"] += done["rejected"]
    except BaseException:
        if not conn.closed:
            conn.rollback()
        raise
    finally:
        if own:
            conn.close()
    total["seconds"] = round(time.perf_counter() - t, 3)
    return total


def sync_pending(url: str | None = None, *, conn=None) -> dict[str, Any]:
    """:func:`sync` every attached collection that has queued changes (what the service's worker
    runs every ``sync_interval_s``, with its pool's ``url``: it never starts a server; ``conn``: a
    connection to use, left open -- the worker's sync process keeps one from pass to pass). Returns
    ``{name: changes applied}``, and for a collection whose sync failed ``{name: "the error's
    type"}`` (its queue stays for the next pass). A broken collection is left out (its queue waits
    for ``pm-vector attach NAME --resync``; ``sync_status`` shows it).

    Several processes may run it at once: a batch locks its collection's row, and a batch that
    finds its changes already applied by another process applies nothing."""
    out: dict[str, Any] = {}
    if conn is None:
        with connect(url, watch_client=True) as own:  # one connection for the pass (each costs ~60 ms to set up)
            return sync_pending(url, conn=own)
    names = [r[0] for r in conn.execute(
        "SELECT c.name FROM pm_vector.collections c WHERE EXISTS (SELECT 1 FROM pm_vector.attach_changes a "
        "WHERE a.collection_id = c.id) AND NOT (c.settings ? 'broken') ORDER BY c.name").fetchall()]
    conn.rollback()
    for name in names:
        try:
            out[name] = sync(name, url=url, conn=conn)["applied"]
        except Exception as exc:  # noqa: BLE001 - one collection's failure must not stop the others
            out[name] = type(exc).__name__
            if conn.closed or conn.broken:  # (the session is gone: the next pass makes a new one)
                break
    return out


def _sync_batch(conn, collection: str, batch: int, embed_fn_extend, upto: int) -> dict[str, Any] | None:
    coll = collection_row(conn, collection, lock="FOR NO KEY UPDATE")
    att = (coll["settings"] or {}).get("attached")
    if not att:
        raise not_attached(collection)
    check_attached(conn, coll)  # (a table changed under it: marked broken, refused)
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
    src = sync_rows.source_rows(conn, att, keys)
    items = {r[0]: (r[1], r[2]) for r in conn.execute(
        "SELECT external_id, id, label FROM pm_vector.items WHERE collection_id = %s AND external_id = ANY(%s)",
        [coll["id"], keys]).fetchall()}
    erase, insert, payloads, rejected = sync_rows.classify(coll, keys, ops, src, items)
    gone = np.array(sorted(int(i) for i in erase), dtype=np.int64)
    runs = runs_with_tables(conn, coll["id"])
    run_items = RunItems(conn, coll, runs)
    kept = row_cache.Kept(conn, runs)
    # the cell and location rows, and the class rows' prior lists: written once, by the batch
    with array_rows.deferred(conn), prior_rows.deferred(conn):
        kept.seed(conn)  # the rows this process held after its last batch, still as the tables hold them
        if gone.size:
            erase_or_tombstone(conn, coll, gone, runs, run_items.load, quick=True)
            run_items.erased(gone)
            erase_kahm(conn, coll, gone)
            conn.execute("DELETE FROM pm_vector.items WHERE id = ANY(%s)", [gone.tolist()])
        new_ids = _write_items(conn, coll, insert, payloads)
        if insert and coll["active_run_id"] is not None:
            refused = _place_new(conn, collection, coll, embed_fn_extend, run_items, new_ids)
            if refused:
                rejected += refused
                refused_keys = {k for k, _ in refused}
                insert = [r for r in insert if r[0] not in refused_keys]
        kept.collect(conn)
    # the high-water mark of the payloads this batch stored (classify measured each: none fails)
    raise_high(conn, coll["id"], max((payload_bytes(p) for p in [r[2] for r in insert] + [p for p, _ in payloads]),
                                     default=0))
    if payloads:  # (new and erased items change the runs' graph_version, which the answers' keys hold too)
        bump_answers_version(conn, coll["id"])
    sync_rows.record(conn, coll["id"], keys, rejected)
    conn.execute("DELETE FROM pm_vector.attach_changes WHERE collection_id = %s AND seq <= %s", [coll["id"], last])
    cache_keys = run_items.keys()
    conn.commit()
    run_items.keep(cache_keys)
    kept.keep(cache_keys)
    n_replaced = sum(1 for k, _l, _p in insert if k in items)
    return {"applied": len(rows), "inserted": len(insert) - n_replaced, "replaced": n_replaced,
            "deleted": int(gone.size) - n_replaced, "payloads": len(payloads), "rejected": rejected}


def _write_items(conn, coll, insert: list, payloads: list) -> list[int]:
    """The batch's new items rows and payload updates, one statement each (no round trip per row).
    Returns the new items' ids."""
    new: list[int] = []
    if insert:
        new = [r[0] for r in conn.execute(
            "INSERT INTO pm_vector.items (collection_id, external_id, label, payload) SELECT %s, u.k, u.l, u.p "
            "FROM unnest(%s::text[], %s::bigint[], %s::jsonb[]) AS u(k, l, p) RETURNING id",
            [coll["id"], [k for k, _l, _p in insert], [lab_ for _k, lab_, _p in insert],
             [None if p is None else Jsonb(p) for _k, _l, p in insert]]).fetchall()]
    if payloads:
        conn.execute("UPDATE pm_vector.items AS i SET payload = u.p FROM unnest(%s::jsonb[], %s::bigint[]) AS u(p, id) "
                     "WHERE i.id = u.id", [[None if p is None else Jsonb(p) for p, _i in payloads],
                                           [i for _p, i in payloads]])
    return new


def _place_new(conn, collection: str, coll, embed_fn_extend, run_items: RunItems, new_ids: list) -> list:
    """The batch's new items ``new_ids`` placed in the active run (``embed --new-items``, against the run's
    items as built; only those: no anti-join of the whole collection against the run); a sharded run
    without the delta takes them with the next full job. The rows the extension refuses
    (an :class:`InvalidInputError` of its own, e.g. a vector with no anchor near it) are found by
    halving, their items rows removed, and the others placed: returns ``[(key, reason)]`` of the
    refused ones (empty when every row was placed)."""
    rid = int(coll["active_run_id"])
    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0] or {}
    if waits_for_job(doc, coll):
        return []

    # (a run that takes the delta places them without its items: delta.place)
    ready = doc.get("status") == "ready" and not takes_delta(doc, coll)
    if ready and rid not in run_items.items:  # (its current version: the batch erased nothing from it)
        run_items.docs[rid] = doc
    extend = _rows_apart(embed_fn_extend or anchor_frame_extend_fn)
    try:
        embed_new_items(collection, extend, conn=conn, run_items=run_items.load(rid) if ready else None,
                        on_placed=(lambda added: run_items.placed(rid, added)) if ready else None, item_ids=new_ids)
        return []
    except _Refused as exc:
        refused = exc.rows
    # the same rows embed_new_items read, in its order: the refused ones leave, the others are placed
    ids = load_items(conn, coll, missing_from_run=rid, ids=new_ids)["id"]
    bad = {int(ids[i]): why for i, why in refused.items()}
    keys = dict(conn.execute("SELECT id, external_id FROM pm_vector.items WHERE id = ANY(%s)",
                             [list(bad)]).fetchall())
    conn.execute("DELETE FROM pm_vector.items WHERE id = ANY(%s)", [list(bad)])
    if ids.size > len(bad):
        embed_new_items(collection, embed_fn_extend or anchor_frame_extend_fn, conn=conn,
                        run_items=run_items.load(rid) if ready else None,
                        on_placed=(lambda added: run_items.placed(rid, added)) if ready else None,
                        item_ids=sorted(set(new_ids) - set(bad)))
    return [(keys[i], f"the active run cannot place its vector: {why}") for i, why in sorted(bad.items())]


class _Refused(Exception):
    """Rows of a placement the extension refuses: ``rows`` {index among the new rows: reason}."""

    def __init__(self, rows: dict):
        super().__init__(f"{len(rows)} row(s) refused")
        self.rows = rows


def _rows_apart(fn):
    """``fn`` (an ``embed_fn_extend``), and when it refuses the rows with an InvalidInputError (a
    row's fault, e.g. no anchor near it), the rows it refuses found by halving (:class:`_Refused`).
    A refusal no single row causes is the placement's own and stays as it was raised."""

    def extend(anchor_X, anchor_y, anchor_emb, new_X, new_y, params, seed):
        try:
            return fn(anchor_X, anchor_y, anchor_emb, new_X, new_y, params, seed)
        except InvalidInputError:
            bad: dict[int, str] = {}
            todo = [np.arange(len(new_X))]
            while todo:
                idx = todo.pop()
                try:
                    fn(anchor_X, anchor_y, anchor_emb, new_X[idx], new_y[idx], params, seed)
                except InvalidInputError as exc:
                    if idx.size == 1:
                        bad[int(idx[0])] = re.sub(r"^row \d+ ", "it ", str(exc))
                    else:
                        todo += [idx[: idx.size // 2], idx[idx.size // 2:]]
            if not bad:
                raise
            raise _Refused(bad) from None

    return extend
