"""New items placed in the active run: ``embed --new-items``, an attached table's sync and an
update (:func:`embed_new_items`).

An out-of-sample extension, not a job: the new items are embedded from the run's anchors
(``embed_fn_extend``), their rows added to the run's table, and -- when the run has class rows -- placed
in the run's delta (:func:`pm_vector.db.runs.delta.place`: their codes and location entries, on the
coordinator of a sharded run; the prior, graph, hubs and cell rows -- on a sharded run's shards --
take them at the next merge, :mod:`pm_vector.db.runs.merge`), or, in a collection without the delta,
its rows extended as before (:func:`pm_vector.db.runs.class_rows.extend`; a sharded run's then wait
for the next full job), all in one transaction that commits only if the run is still active. The full job and its six
steps are :mod:`pm_vector.db.runs.jobs`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Mapping

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ...errors import PMVectorError
from .. import _binary
from ..errors import EmbeddingJobError, NoActiveRunError
from ..postgres import connect
from ..core.collection import collection_row, load_anchor_set, load_items
from ..run_tables import run_table
from .embeddings import embedding_matrix, vector_type, write_embeddings
from .jobs import ExtendFn, JobProgress
from . import class_rows as _cr, delta
from ...kahm.kernel import blas_single_thread
from ...manifold.laplacian import single_threaded


def embed_new_items(collection: str, embed_fn_extend: ExtendFn, *, progress: JobProgress | None = None,
                    write_batch_size: int = 20_000, conn=None, run_items: Mapping[str, np.ndarray] | None = None,
                    on_placed: Callable[[dict], None] | None = None, item_ids=None,
                    into_run: int | None = None) -> dict[str, Any]:
    """Embed items ingested after the active run was built into that run (out-of-sample extension).

    ``embed_fn_extend(anchor_X, anchor_y, anchor_embedding, new_X, new_y, params, seed) -> (m, k)``
    places new items in the active run's embedding space from the run's anchors (features,
    labels, embedding) and parameters. The rows are added to the active run's table (its HNSW
    index is updated as they go in) in one transaction, provided the run is still active then.
    When the run has class rows, the same transaction adds the new items to its prior, graph
    and hubs (:func:`pm_vector.db.runs.class_rows.extend`: each new item gets its own neighbour list;
    existing items' lists are not recomputed -- an approximation until the next full job).
    Returns ``{"run_id", "n_new"}``. ``conn``: work in the caller's open transaction (which commits;
    :func:`pm_vector.db.store.update.update_items` places an updated item so) instead of its own.
    ``run_items``: the active run's items now, as built (``id`` ascending, ``label``, ``features``),
    which the caller holds under the collection's lock (:mod:`pm_vector.db.runs.item_cache`), instead
    of reading them; ``on_placed``
    is then called with the items added to the run's class rows (``id``, ``label``, ``features``).
    ``item_ids``: place only these of the items missing from the run (a sync batch's new items).
    ``into_run``: place them in this run instead, a job's run before its switch (still ``running``;
    a merge's catch-up, :mod:`pm_vector.db.runs.merge`); only a run that takes the delta.
    """
    report = progress or (lambda *_a, **_k: None)
    extra = {"run_items": run_items, "on_placed": on_placed, "item_ids": item_ids, "into_run": into_run}
    if conn is not None:
        return _embed_new(conn, False, collection, embed_fn_extend, report, write_batch_size, **extra)
    with connect(watch_client=True) as own:
        return _embed_new(own, True, collection, embed_fn_extend, report, write_batch_size, **extra)


def _embed_new(conn, own: bool, collection: str, embed_fn_extend: ExtendFn, report, write_batch_size: int,
               run_items=None, on_placed=None, item_ids=None, into_run=None):
    coll = collection_row(conn, collection)
    run_id = coll["active_run_id"] if into_run is None else int(into_run)
    if run_id is None:
        raise NoActiveRunError(
            f"collection {collection!r} has no active embedding run; run_embedding_job() builds one "
            "(it embeds all items).")
    run = conn.execute("SELECT params, seed, anchor_set_id, embedding_dim, class_frames, class_rows "
                       "FROM pm_vector.embedding_runs WHERE id = %s", [run_id]).fetchone()
    params, seed, anchor_set_id, k, frames_doc, cr_doc = run
    has_cr = bool(cr_doc) and cr_doc.get("status") == "ready" and frames_doc is not None

    to_delta = has_cr and delta.takes_delta(cr_doc, coll)  # the new items go to the run's delta: no rows rewritten
    if into_run is not None and not to_delta:
        raise EmbeddingJobError(f"run {run_id} does not take the delta: new items wait for its switch.", run_id)
    report("load", 0, 1)
    new = load_items(conn, coll, missing_from_run=run_id, ids=item_ids)
    m = new["id"].shape[0]
    if m == 0:
        if own:
            conn.rollback()
        report("load", 1, 1)
        return {"run_id": int(run_id), "n_new": 0}
    anchors = load_anchor_set(conn, coll, "anchor", anchor_set_id)
    buf = _binary.copy_out(conn, sql.SQL("SELECT position, embedding FROM {} ORDER BY position").format(
        run_table(run_id, "anchors")))
    a_emb = _binary.decode([("position", "int4", 0), ("embedding", vector_type(k), k)], buf)["embedding"]
    old_items = ((run_items if run_items is not None else load_items(conn, coll, in_run=run_id))
                 if has_cr and not to_delta else None)
    if own:
        conn.rollback()
    report("load", 1, 1)

    report("embed", 0, 1)
    try:
        with one_thread(m):
            e = embed_fn_extend(anchors.features, anchors.labels, a_emb, new["features"], new["label"],
                                dict(params or {}), int(seed))
    except PMVectorError as exc:
        raise EmbeddingJobError(f"the extension function failed: {exc}", run_id) from exc
    emb = embedding_matrix(e, m, "new item embedding", k)
    report("embed", 1, 1)

    report("write", 0, m)
    try:
        if into_run is not None:
            # a job's run before its switch: still running. Its switch locks the run row FOR UPDATE, so
            # a share of the RUN row orders the two; not the collection row, which every sync batch,
            # delete and update holds for its whole transaction (sharing it stalled the sync for as long
            # as a catch-up pass placed items: ~50 s at 100,000 items). An item deleted meanwhile is
            # tombstoned by the switch (erase.apply_pending).
            st = conn.execute("SELECT status FROM pm_vector.embedding_runs WHERE id = %s FOR SHARE", [run_id]).fetchone()
            if st is None or st[0] != "running":
                raise EmbeddingJobError(f"run {run_id} is no longer being built; its switch placed the new items.",
                                        run_id)
        elif (row := conn.execute("SELECT active_run_id FROM pm_vector.collections WHERE id = %s FOR SHARE",
                                  [coll["id"]]).fetchone()) is None or row[0] != run_id:
            raise EmbeddingJobError(
                f"the active run of collection {collection!r} changed while new items were embedded; "
                "call embed_new_items() again.", run_id)
        conn.execute(sql.SQL("CREATE TEMP TABLE pm_new_emb (LIKE {}) ON COMMIT DROP").format(run_table(run_id, "items")))
        write_embeddings(conn, sql.Identifier("pm_new_emb"), "item_id", "int8", new["id"], emb, int(write_batch_size),
                          lambda d, tot: report("write", d, tot), commit=False)
        if has_cr:  # one class-rows extension at a time per run
            conn.execute("SELECT pg_advisory_xact_lock(pm_vector.pm_lock_key(3, %s))", [run_id])
        # (an item deleted since the load is not added: delete_items waits for this lock or ran before it)
        inserted = np.array([r[0] for r in conn.execute(
            sql.SQL("INSERT INTO {} (item_id, embedding) SELECT e.item_id, e.embedding FROM pm_new_emb e WHERE EXISTS "
                    "(SELECT 1 FROM pm_vector.items i WHERE i.id = e.item_id) ON CONFLICT (item_id) DO NOTHING "
                    "RETURNING item_id").format(run_table(run_id, "items"))).fetchall()], dtype=np.int64)
        if to_delta and inserted.size:
            keep = np.isin(new["id"], inserted)
            with one_thread(m):
                delta.place(conn, coll, run_id, cr_doc, new["id"][keep], new["features"][keep])
        elif has_cr and inserted.size:
            _extend_class_rows(conn, run_id, frames_doc, old_items, new, inserted, current=run_items is not None)
            if on_placed is not None:
                keep = np.isin(new["id"], inserted)
                on_placed({k_: new[k_][keep] for k_ in ("id", "label", "features")})
        if own:
            conn.commit()
    except psycopg.Error as exc:
        if own:
            conn.rollback()
        raise EmbeddingJobError(f"writing the new items' embeddings failed: {exc}", run_id) from exc
    return {"run_id": int(run_id), "n_new": int(m)}


#: new items at most placed on one thread (:func:`one_thread`)
ONE_THREAD_BELOW = 2_000


@contextmanager
def one_thread(m: int):
    """Around the small tensor and matrix work of placing ``m`` new items (the extension, the
    cells, the codes): torch, BLAS and OpenMP (faiss) on one thread when ``m`` is below
    :data:`ONE_THREAD_BELOW`. A sync batch of 100 items on the shared 2-core machine spent 1.1 s
    of its 2.8 s in the threads' start-up and spin-waits (``index_add_`` 43 ms a call on 1,064
    rows); the thread counts are process-wide and restored afterwards."""
    if m >= ONE_THREAD_BELOW:
        yield
        return

    with single_threaded(), blas_single_thread():
        yield


def _extend_class_rows(conn, run_id: int, frames_doc, old_items: dict, new: dict, inserted: np.ndarray,
                       current: bool = False) -> None:
    """In the caller's transaction: the run's class rows extended by the new items just inserted
    (against the run's items still there), and the run row's class-rows document updated.
    ``current``: ``old_items`` are the run's items now (a caller that holds them under the
    collection's lock and follows its own erasures: a sync batch); else those still in the run are
    kept."""
    if not current:
        still = np.array([r[0] for r in conn.execute(
            sql.SQL("SELECT item_id FROM {} WHERE item_id = ANY(%s)").format(run_table(run_id, "items")),
            [old_items["id"].tolist()]).fetchall()], dtype=np.int64)
        kept = np.isin(old_items["id"], still)
        old_items = {k_: v[kept] for k_, v in old_items.items()}
    cr_doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s",
                          [run_id]).fetchone()[0]
    keep = np.isin(new["id"], inserted)
    all_ids = np.concatenate([old_items["id"], new["id"][keep]])
    all_X = np.concatenate([old_items["features"], new["features"][keep]])
    if all_ids.size > 1 and not np.all(all_ids[1:] > all_ids[:-1]):  # (new ids follow the old ones: no copy)
        order = np.argsort(all_ids, kind="stable")
        all_ids, all_X = all_ids[order], all_X[order]
    doc2 = _cr.extend(conn, run_id, frames_doc, cr_doc, all_ids, all_X, new["id"][keep],
                      new["features"][keep], new["label"][keep])
    conn.execute("UPDATE pm_vector.embedding_runs SET class_rows = %s WHERE id = %s",
                 [Jsonb(doc2), run_id])
