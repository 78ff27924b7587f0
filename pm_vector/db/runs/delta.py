"""The delta beside a run's precomputed answers (issue 36): the ONE home of writes at database speed.

A write no longer rewrites the lists a release ranks (every list that names an item, at every
level) inside its transaction. It writes the delta of the runs it concerns (``sql/0023_delta.sql``):

* **tombstones** (:func:`tombstone`): ``delete_items``, ``update_items`` (the old version of a
  changed item) and an attached table's sync write ``(run, item)`` into
  ``pm_vector.delta_tombstones`` for every run that holds the item. From the delete's commit on, no
  answer of any release holds it: the location release ranks the base minus the tombstones (and
  the first live top hubs), the class-rows, cell and paper answers leave tombstoned candidates out
  (:func:`live_sql`, :func:`live_ids`). The item's row of ``pm_vector.items`` (its raw features,
  label, payload) goes in the same transaction; its derived rows (embedding, codes, prior, graph,
  hubs, cell and location rows) stay, never answered, until the merge (:mod:`pm_vector.db.runs.merge`).
* **new items** (:func:`place`): an item ingested into a collection with an active run, an
  update's new version and a sync's new row are embedded with the run's extension
  (:func:`pm_vector.db.runs.new_items.embed_new_items`, whose row goes into ``run_<id>_items``),
  get their product code (``run_<id>_codes``: the candidates' join), and one entry per published
  location level in ``pm_vector.delta_entries``: ``(level, cell of the item at that level, h, h_r)``.
  The estimate: the item's exact ``g`` nearest live run items (``g``: the locations' graph degree,
  32), ties by id, searched in numpy over the run's embeddings the process keeps in memory with each
  item's cells (:mod:`pm_vector.db.runs.run_nearest`: no SQL per item, no raw features read again),
  so two databases holding the same run and the same writes place a new item alike (an HNSW
  index, whose random levels differ between databases built apart, did not);
  ``h`` = ``g`` (the mean in-degree of a ``g``-NN graph, exactly),
  ``h_r`` = 1 + how many of those ``g`` lie in the item's cell at that level (the item itself, and its
  in-edges from the cell estimated by its out-edges into it: a k-NN graph is mostly mutual). The
  answer ranks them with the row's entries by the same :func:`pm_vector.shortlist.location_list`.
* ``embedding_runs.delta_version`` + 1 with every write: every cached answer's key holds it, and a
  repeated request's one statement checks the run row's version (``xmin``), which the write changes.

Shared tables keyed by run id, not ``run_<id>_delta`` tables: the migration makes them once, the
SQL ranking names them statically (no dynamic table per run in the answer's hot path), a run's
rows go with the run row (``ON DELETE CASCADE``), and the privilege matrix grants the query role
SELECT once; the merge and a run's drop delete a run's rows by its key.

A **sharded run** (:mod:`pm_vector.db.runs.sharding`) takes the same path: everything the delta
writes or reads is the coordinator's (its ``run_<id>_items`` with the embeddings, codes and location
rows, and the delta's tables), so a new item gets its entries there exactly as on one node, and the
tombstones filter every answer on the coordinator: the location ranking's, and the class-rows and
cell fan-outs' after the shards' lists are merged (:func:`live_sql` in the answer's item join), as a
single node filters its own ranked lists. The shards' prior, graph, hubs and cells take the new
items and lose the deleted ones with the merge, which builds them anew on the shards.

Runs whose class rows are not ready and the runs of a collection created with
``settings={"delta": False}`` keep the erasure and extension of before, in the write's transaction
(:func:`pm_vector.db.runs.erase.erase_in_runs`, :func:`pm_vector.db.runs.class_rows.extend`):
:func:`takes_delta` says which (and :func:`waits_for_job` which runs cannot take new items at all
before the next full job: sharded runs of such a collection).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from psycopg import sql
from psycopg.rows import dict_row

from ..postgres.adapt import Float8Array, Int4Array, Int8Array
from ..run_tables import run_table
from . import delta_sets, run_cells, run_nearest
from .delta_sets import tombstoned
from ...protocol.published_codes import unpack
from .class_rows import copy_codes


def takes_delta(doc: Mapping[str, Any] | None, coll: Mapping[str, Any] | None = None) -> bool:
    """Does a run with this ``class_rows`` document take writes into the delta (ready class rows, on
    one node or sharded), in collection ``coll`` (its ``settings["delta"]`` false: every write
    rewrites the rows in its own transaction, as before the delta)?"""
    if coll is not None and (coll.get("settings") or {}).get("delta") is False:
        return False
    return bool(doc) and doc.get("status") == "ready"


def waits_for_job(doc: Mapping[str, Any] | None, coll: Mapping[str, Any] | None = None) -> bool:
    """Do new items wait for the next full job in a run with this ``class_rows`` document: a sharded
    run that does not take the delta (its class rows live on the shards, which an incremental
    extension does not reach: :func:`pm_vector.db.runs.class_rows.extend`)?"""
    return bool((doc or {}).get("shards")) and not takes_delta(doc, coll)


def bump(conn, run_id: int, n_items: int = 0, *, dead=(), placed=(), unplaced=()) -> None:
    """The run's ``delta_version`` + 1, and its ``n_items`` (the column and the class-rows document's,
    which an answer reports: the items it holds now) by ``n_items``, in the caller's transaction; the
    write recorded with what it changed -- the ids it tombstoned, the items it placed and those whose
    entries it removed -- for the sets this process holds (:mod:`pm_vector.db.runs.delta_sets`)."""
    row = conn.execute("UPDATE pm_vector.embedding_runs SET delta_version = delta_version + 1, n_items = n_items + %s, "
                       "class_rows = CASE WHEN class_rows ? 'n_items' THEN jsonb_set(class_rows, '{n_items}', "
                       "to_jsonb((class_rows ->> 'n_items')::bigint + %s)) ELSE class_rows END WHERE id = %s "
                       "RETURNING delta_version, pg_current_xact_id()::text, created_at",
                       [int(n_items), int(n_items), int(run_id)]).fetchone()
    if row is not None:
        delta_sets.wrote(conn, run_id, row[2], row[0], row[1], dead=dead, placed=placed, unplaced=unplaced)


def tombstone(conn, ids, runs) -> list[int]:
    """Tombstones for ``ids`` in each run ``(run_id, class_rows)`` that holds them (its embedding row),
    in the caller's transaction; their delta entries go. Returns the runs that held some."""
    ids = [int(i) for i in np.asarray(ids, dtype=np.int64).tolist()]
    touched = []
    for rid, _doc in runs:
        rid = int(rid)
        dead = [r[0] for r in conn.execute(sql.SQL(
            "INSERT INTO pm_vector.delta_tombstones (run_id, item_id) SELECT %s, e.item_id FROM {} AS e "
            "WHERE e.item_id = ANY(%s) ON CONFLICT DO NOTHING RETURNING item_id").format(run_table(rid, "items")),
            [rid, ids]).fetchall()]
        conn.execute("DELETE FROM pm_vector.delta_entries WHERE run_id = %s AND item_id = ANY(%s)", [rid, ids])
        if dead:
            bump(conn, rid, -len(dead), dead=dead, unplaced=ids)
            touched.append(rid)
    return touched


def tombstone_deleted(conn, run_id: int) -> int:
    """Tombstones, in run ``run_id``, for every item it holds that ``pm_vector.items`` no longer does
    (deleted since the run read its items: a job's catch-up and switch, :mod:`pm_vector.db.runs.merge`),
    in the caller's transaction; their delta entries go. Returns how many."""
    rid = int(run_id)
    gone = [r[0] for r in conn.execute(sql.SQL(
        "INSERT INTO pm_vector.delta_tombstones (run_id, item_id) SELECT %s, e.item_id FROM {} AS e WHERE NOT EXISTS "
        "(SELECT 1 FROM pm_vector.items AS i WHERE i.id = e.item_id) ON CONFLICT DO NOTHING RETURNING item_id").format(
        run_table(rid, "items")), [rid]).fetchall()]
    if gone:
        conn.execute("DELETE FROM pm_vector.delta_entries WHERE run_id = %s AND item_id = ANY(%s)", [rid, gone])
        bump(conn, rid, -len(gone), dead=gone, unplaced=gone)
    return len(gone)


def _same_space(conn, a: int, b: int) -> bool:
    """Do runs ``a`` and ``b`` embed, code and place an item alike: the same anchor set, embedding
    parameters, seed and dimension, and the same published codes and location cells (their digests;
    a merge publishes the documents of the run it replaces, :mod:`pm_vector.db.runs.published`)?"""
    rows = {r[0]: r[1:] for r in conn.execute(
        "SELECT id, anchor_set_id, params, seed, embedding_dim, class_rows -> 'codes' ->> 'digest', "
        "class_rows -> 'locations' ->> 'digest', class_rows -> 'codes' ->> 'status', class_rows -> 'locations' ->> 'status' "
        "FROM pm_vector.embedding_runs WHERE id = ANY(%s)", [[int(a), int(b)]]).fetchall()}
    ra, rb = rows.get(int(a)), rows.get(int(b))
    return (ra is not None and ra == rb and ra[6] == "ready" and ra[7] == "ready"
            and ra[4] is not None and ra[5] is not None)


def copy_placed(conn, from_run: int, to_run: int) -> int:
    """The items run ``from_run`` placed in its delta that run ``to_run`` does not hold yet (ingested
    after ``to_run`` read its items: a merge's catch-up and switch), copied into ``to_run``: their
    embedding rows, codes and location entries, in the caller's transaction, when the two runs embed,
    code and place alike (:func:`_same_space`); a live item only (not deleted, not tombstoned). An item
    is then placed once, by the write that brought it, not embedded and estimated again at the
    merge (a merge's catch-up at 100,000 items under 100 changes a second placed about as many items
    a second as came in, and never caught up). Returns how many (0 when the runs differ: the caller
    places them itself)."""
    a, b = int(from_run), int(to_run)
    if a == b or not _same_space(conn, a, b):
        return 0
    ids = [r[0] for r in conn.execute(sql.SQL(
        "INSERT INTO {tb} (item_id, embedding) SELECT e.item_id, e.embedding FROM {ta} AS e "
        "JOIN (SELECT DISTINCT d.item_id FROM pm_vector.delta_entries AS d WHERE d.run_id = %s) AS n ON n.item_id = e.item_id "
        "WHERE EXISTS (SELECT 1 FROM pm_vector.items AS i WHERE i.id = e.item_id) "
        "AND NOT EXISTS (SELECT 1 FROM pm_vector.delta_tombstones AS z WHERE z.run_id = %s AND z.item_id = e.item_id) "
        "AND NOT EXISTS (SELECT 1 FROM {tb} AS t WHERE t.item_id = e.item_id) "
        "ON CONFLICT (item_id) DO NOTHING RETURNING item_id").format(
        ta=run_table(a, "items"), tb=run_table(b, "items")), [a, a]).fetchall()]
    if not ids:
        return 0
    conn.execute(sql.SQL("INSERT INTO {tb} (item_id, code) SELECT c.item_id, c.code FROM {ta} AS c "
                         "WHERE c.item_id = ANY(%s)").format(ta=run_table(a, "codes"), tb=run_table(b, "codes")), [ids])
    conn.execute("INSERT INTO pm_vector.delta_entries (run_id, level, cell, item_id, h, h_r) "
                 "SELECT %s, d.level, d.cell, d.item_id, d.h, d.h_r FROM pm_vector.delta_entries AS d "
                 "WHERE d.run_id = %s AND d.item_id = ANY(%s) ON CONFLICT DO NOTHING", [b, a, ids])
    bump(conn, b, len(ids), placed=ids)
    return len(ids)


def split_runs(runs, coll: Mapping[str, Any] | None = None) -> tuple[list, list]:
    """``(runs that take the delta, the others)`` of ``(run_id, class_rows)`` pairs of collection ``coll``."""
    runs = list(runs)
    return [r for r in runs if takes_delta(r[1], coll)], [r for r in runs if not takes_delta(r[1], coll)]


def live_ids(conn, run_id: int, ids) -> np.ndarray:
    """A mask of ``ids``: True where the run holds no tombstone of the id."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size == 0:
        return np.zeros(0, bool)
    return ~np.isin(ids, tombstoned(conn, run_id, np.unique(ids)))


def live_sql(run_id: int, item: sql.Composable) -> sql.Composed:
    """A SQL condition: no tombstone of item ``item`` (an SQL expression of the caller's statement) in
    run ``run_id`` (an index lookup of the tombstones' primary key)."""
    return sql.SQL("NOT EXISTS (SELECT 1 FROM pm_vector.delta_tombstones AS pm_z WHERE pm_z.run_id = {} "
                   "AND pm_z.item_id = {})").format(sql.Literal(int(run_id)), item)


def estimate(conn, coll: Mapping[str, Any], run_id: int, doc: Mapping[str, Any], ids, X) -> dict[int, tuple]:
    """Per published location level M: ``(cells (n,), h (n,), h_r (n,))`` of the new items ``ids`` with
    raw features ``X``, whose rows the run holds now (module doc: their exact ``g`` nearest live run
    items, the batch's other new items among them, and the neighbours' cells, from the process's
    memory: :mod:`pm_vector.db.runs.run_nearest`)."""
    rid = int(run_id)
    loc = doc.get("locations") or {}
    cells = run_cells.get(conn, rid, doc, "locations")
    ids = np.asarray(ids, dtype=np.int64)
    X = np.asarray(X, dtype=np.float64)
    g = int(loc.get("graph_degree") or 32)
    levels = [int(M) for M in cells.levels_]
    own = np.stack([cells.assign(X, 0, M).astype(np.int64) for M in levels]) if levels else np.zeros((0, ids.size))
    with run_nearest.LOCK:
        ent, live = run_nearest.get(conn, rid, levels, ids, own)
        at = np.flatnonzero(live)
        near = run_nearest.nearest(ent.emb[at], ent.ids[at], ent.emb[ent.positions(ids)], ids, g, coll["metric"])
        # (n, g): each new item's neighbours as positions of the entry, -1 past its list
        P = np.full((ids.size, g), -1, np.int64)
        for k, got in enumerate(near):
            P[k, :got.size] = at[got]
        run_nearest.cells_of(conn, coll, ent, P[P >= 0], cells)
        theirs = ent.cells[:, np.maximum(P, 0)].astype(np.int64)  # (L, n, g)
    out = {}
    for r, M in enumerate(levels):
        h_r = 1.0 + ((P >= 0) & (theirs[r] == own[r][:, None])).sum(1)
        out[M] = (own[r], np.full(ids.size, float(g)), h_r.astype(np.float64))
    return out


def place(conn, coll: Mapping[str, Any], run_id: int, doc: Mapping[str, Any], ids, X) -> int:
    """New items whose embedding rows the run holds now (in the caller's transaction) placed in its
    delta: their product codes, and their entries at every published location level (module doc).
    Returns how many."""
    rid = int(run_id)
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size == 0:
        return 0
    X = np.asarray(X)
    if (doc.get("codes") or {}).get("status") == "ready":
        pc_doc = conn.execute("SELECT public_projection FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
        copy_codes(conn, rid, ids, unpack(pc_doc, doc["codes"]["digest"]).encode(X), 1 << 30, False)
    entered = ids[:0]
    if (doc.get("locations") or {}).get("status") == "ready":
        est = estimate(conn, coll, rid, doc, ids, X)
        lv = np.concatenate([np.full(ids.size, M, np.int64) for M in est])
        if lv.size:
            entered = ids
            conn.execute(
                "INSERT INTO pm_vector.delta_entries (run_id, level, cell, item_id, h, h_r) "
                "SELECT %s, u.l, u.c, u.i, u.h, u.hr FROM unnest(%s::integer[], %s::integer[], %s::bigint[], "
                "%s::float8[], %s::float8[]) AS u(l, c, i, h, hr) ON CONFLICT DO NOTHING",
                [rid, Int4Array(lv), Int4Array(np.concatenate([e[0] for e in est.values()])),
                 Int8Array(np.tile(ids, len(est))), Float8Array(np.concatenate([e[1] for e in est.values()])),
                 Float8Array(np.concatenate([e[2] for e in est.values()]))])
    bump(conn, rid, int(ids.size), placed=entered)
    return int(ids.size)


def cell_entries(conn, run_id: int, level: int, cell: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(item_ids, h_r, h)`` of the delta entries of location cell ``(level, cell)`` (by id)."""
    rows = conn.execute("SELECT item_id, h_r, h FROM pm_vector.delta_entries WHERE run_id = %s AND level = %s "
                        "AND cell = %s ORDER BY item_id", [int(run_id), int(level), int(cell)]).fetchall()
    return (np.array([r[0] for r in rows], np.int64), np.array([r[1] for r in rows], np.float64),
            np.array([r[2] for r in rows], np.float64))


def status(conn, collection: str) -> dict[str, Any] | None:
    """The view ``pm_vector.delta_status`` of one collection: ``{"run_id", "delta_version",
    "pending_purge", "oldest_purge_at", "purge_age_s", "delta_items"}`` (None: no active run)."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT run_id, delta_version, pending_purge, oldest_purge_at, purge_age_s, delta_items "
                          "FROM pm_vector.delta_status WHERE collection = %s", [collection]).fetchone()
    return None if row is None else dict(row)
