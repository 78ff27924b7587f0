"""Erasure of items from a run: how an item leaves each of the run's derived tables.

The kinds of run tables are the registry of :mod:`pm_vector.db.runs.kinds` (``KINDS``); a kind
names its erasure there (a function of this module for the built-in kinds, :func:`eraser`). Which
tables a run has follows from the releases it serves (:func:`pm_vector.db.runs.kinds.run_kinds`);
:func:`run_tables` are those of them that hold items.

:func:`erase_from_run` applies an erasure plan (:func:`plan`) to one run, inside the caller's
transaction. The plan is computed from the run's item set before the erasure (ids, labels,
features) and the erased ids:

* the erased items' rows leave ``items``, ``codes``, ``prior``, ``neighbors``, ``hubs`` and every
  list of ``cells`` (and a shard's fill list ``items``, refilled with the run's next item ids);
* every neighbour list that held an erased item is **refilled by the same ranking**: the nearest
  other remaining items by raw features (exact search; an attached table's sync above
  ``graph_exact_max_items`` ranks the candidates the erased neighbours leave:
  :mod:`pm_vector.db.runs.erase_plan`), so each list keeps ``graph_degree`` entries and the prior's
  ``nbrs`` stay rectangular;
* the hub counts lose the erased items' own lists' contributions and follow the refilled lists
  (``hub_c(i)`` = items of class c whose list holds i, over the remaining items), the prior's
  ``nhub`` follow the hub counts;
* the cell release's per-cell counts lose the erased items' contributions (their 32-neighbour
  lists recomputed by exact search over the run's items) and gain the refilled lists' new entries;
  level-0 rows are refilled from the class's whole counts (level -1) when the class has them;
  ``chubs`` follow the class counts. Approximation (as ``embed --new-items``): an item whose
  cell-release list held an erased item only beyond the class rows' ``graph_degree`` first entries
  loses it without a replacement until the next full job;
* ``class_rows`` records the new class sizes and ``graph_version`` + 1, so every process that
  holds the run's graph in memory (:mod:`pm_vector.db.resolve.run_graph`) reads it again.

The same code serves a single node (local tables) and a sharded run (the shard tables through
``postgres_fdw`` foreign tables created in the transaction: the shards' changes commit with the
coordinator's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
from psycopg import sql
from psycopg.types.json import Jsonb

from ..run_tables import create_foreign_table, drop_foreign_table, run_table, run_table_exists
from . import prior_rows, cell_counts, array_rows, run_cells, delta
from .erase_plan import Plan, is_ready, plan
from .prior_rows import add_hub_changes, read_listing, update_lists
from .run_copy import copy_hubs, copy_pairs
from ...protocol.bounds import MAX_K_PRIME
from .locations import KEY_KINDS, KEYS, parts_of
from .kinds import KINDS, RunTable, run_kinds, shard_columns
from .sharding import FILL


@dataclass(frozen=True)
class Place:
    """Where a run keeps its tables: the coordinator (``shard`` None) or one shard through foreign tables."""

    run_id: int
    shard: str | None

    def table(self, kind: str) -> sql.Identifier:
        """The run's table of ``kind`` here (:func:`pm_vector.db.run_tables.run_table`)."""
        return run_table(self.run_id, kind, self.shard)


def _exists(conn, place: Place, kind: str) -> bool:
    """Does ``place`` have the run's table of ``kind`` (any kind of :data:`KINDS`, a test's too)?"""
    return run_table_exists(conn, place.run_id, kind, place.shard)


# ----------------------------------------------------------------------------- per-table erasure

def _rows_of(kind: str) -> Callable[[Any, Place, Plan], None]:
    """Tables keyed by item id (``items``, ``codes``): the erased rows go. On a shard, ``items`` is the
    run's fill list (its first MAX_K_PRIME item ids): it is refilled with the next remaining ids."""

    def erase(conn, place: Place, plan: Plan) -> None:
        conn.execute(sql.SQL("DELETE FROM {} WHERE item_id = ANY(%s)").format(place.table(kind)), [plan.erased.tolist()])
        if kind == "items" and place.shard is not None:  # the shard's fill list keeps its MAX_K_PRIME first ids

            before = plan.ids[:FILL]
            after = plan.ids[~plan.gone][:FILL]
            add = np.setdiff1d(after, before)
            if add.size:
                conn.execute(sql.SQL("INSERT INTO {} (item_id) SELECT unnest(%s::bigint[])").format(place.table(kind)),
                             [add.tolist()])
    return erase


_erase_items, _erase_codes = _rows_of("items"), _rows_of("codes")


def _erase_neighbors(conn, place: Place, plan: Plan) -> None:
    """The erased items' lists go; the refilled lists replace the old ones (rows of this place's items)."""
    t = place.table("neighbors")
    changed = np.array(sorted(plan.new_lists), dtype=np.int64)
    conn.execute(sql.SQL("DELETE FROM {} WHERE item_id = ANY(%s)").format(t), [np.concatenate([plan.erased, changed]).tolist()])
    if changed.size:
        here = _items_here(conn, place, plan, changed)
        if here.size:
            lists = np.stack([plan.new_lists[int(i)] for i in here])
            g = lists.shape[1]
            copy_pairs(conn, t, ("item_id", "neighbor_id"), np.repeat(here, g), lists.ravel(), 1 << 30, False)


def _items_here(conn, place: Place, plan: Plan, ids: np.ndarray) -> np.ndarray:
    """The ids whose class rows live at ``place`` (all of them on a single node)."""
    if place.shard is None:
        return ids
    mine = _shard_classes(plan, place.shard)
    lab = plan.labels[np.searchsorted(plan.ids, ids)]
    return ids[np.isin(lab, mine)]


def _shard_classes(plan: Plan, shard: str) -> np.ndarray:
    classes = plan.doc["classes"]
    return np.array([int(classes[int(k)]) for k in plan.doc["shards"][shard]], dtype=np.int64)


def _hubs_of(conn, place: Place, item_ids) -> dict[tuple[int, int], float]:
    """The stored hub counts ``(label, item id) -> hub`` of these items at ``place``."""
    rows = conn.execute(sql.SQL("SELECT h.label, h.item_id, h.hub FROM {} AS h JOIN unnest(%s::bigint[]) "
                                "AS s(id) ON s.id = h.item_id").format(place.table("hubs")),  # (a hash join: = ANY of a parameter compares every pair)
                        [sorted(set(int(i) for i in item_ids))]).fetchall()
    return {(int(a), int(b)): float(c) for a, b, c in rows}


def _erase_hubs(conn, place: Place, plan: Plan) -> None:
    """Hub counts: the erased items' rows go; the counts the erasure changed are written again."""
    t = place.table("hubs")
    cur = _hubs_of(conn, place, [i for _, i in plan.hub_delta])
    plan_classes = set(int(c) for c in plan.doc.get("classes", []))
    if place.shard is not None:
        plan_classes = set(int(c) for c in _shard_classes(plan, place.shard))
    erased = set(int(i) for i in plan.erased)
    by_class: dict[int, list[int]] = {}
    for (c, i) in list(plan.hub_delta):
        if c in plan_classes:
            by_class.setdefault(c, []).append(i)
    for c in plan_classes:
        keys = sorted(set(by_class.get(c, [])) | erased)
        if not keys:
            continue
        conn.execute(sql.SQL("DELETE FROM {} WHERE label = %s AND item_id = ANY(%s)").format(t), [c, keys])
        rows = [(i, cur.get((c, i), 0.0) + plan.hub_delta.get((c, i), 0.0)) for i in keys if i not in erased]
        rows = [(i, v) for i, v in rows if v > 0]
        if rows:
            copy_hubs(conn, t, np.full(len(rows), c, np.int64), np.array([r[0] for r in rows], np.int64),
                      np.array([r[1] for r in rows], np.float64), 1 << 30, False)


def _erase_prior(conn, place: Place, plan: Plan) -> None:
    """Prior rows: the erased go; rows whose list was refilled or whose neighbours' hub counts changed
    get their new ``nbrs`` (the refilled list) and ``nhub`` (the new counts) by an ``UPDATE`` of those
    two columns (the frame coordinates and their index stay). Only the rows that may change are read:
    the erased, the refilled and those listing an item whose hub count changed."""
    t = place.table("prior")
    g = conn.execute(sql.SQL("SELECT cardinality(nbrs) FROM {} LIMIT 1").format(t)).fetchone()
    if g is None:
        return
    g = int(g[0] or 0)
    if g == 0:  # lists of no entries: only the erased rows go
        conn.execute(sql.SQL("DELETE FROM {} WHERE item_id = ANY(%s)").format(t), [plan.erased.tolist()])
        return
    a = _prior_rows(conn, place, plan, g)
    ids, labels = a["item_id"], a["label"]
    nbrs, nhub = a["nbrs"].reshape(-1, g).copy(), a["nhub"].reshape(-1, g).copy()
    changed = _prior_changes(conn, place, plan, ids, labels, nbrs, nhub)
    gone = np.isin(ids, plan.erased)
    changed &= ~gone
    for c in np.unique(labels[gone]):
        conn.execute(sql.SQL("DELETE FROM {} WHERE label = %s AND item_id = ANY(%s)").format(t),
                     [int(c), ids[gone & (labels == c)].tolist()])
    prior_rows.forget(conn, t, labels[gone], ids[gone])
    update_lists(conn, t, ids[changed], labels[changed], nbrs[changed], nhub[changed])


def _prior_rows(conn, place: Place, plan: Plan, g: int) -> dict[str, np.ndarray]:
    """The prior rows that may change: the erased, the refilled, and those of class c listing an item
    whose class-c hub count changed (hash joins with temp tables of those pairs, analysed so that
    the planner knows their sizes)."""
    want = np.array(sorted(set(int(i) for i in plan.new_lists) | set(int(i) for i in plan.erased)), np.int64)
    lab = plan.labels[np.searchsorted(plan.ids, want)]
    listed = np.array(sorted(plan.hub_delta), dtype=np.int64).reshape(-1, 2)
    for name, (c, i) in (("pm_erase_want", (lab, want)), ("pm_erase_listed", (listed[:, 0], listed[:, 1]))):
        name = sql.Identifier(name)
        conn.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (label bigint, item_id bigint) ON COMMIT DROP").format(name))
        conn.execute(sql.SQL("TRUNCATE {}").format(name))
        copy_pairs(conn, name, ("label", "item_id"), c, i, 1 << 30, False)
        conn.execute(sql.SQL("ANALYZE {}").format(name))
    return read_listing(conn, place.table, sql.Identifier("pm_erase_listed"), g,
                        sql.SQL("SELECT label, item_id FROM pm_erase_want"), want.size + 16 * listed.shape[0])


def _prior_changes(conn, place: Place, plan: Plan, ids, labels, nbrs, nhub) -> np.ndarray:
    """The new ``nbrs``/``nhub`` of the prior rows read (in place); returns which rows changed."""
    g = nbrs.shape[1]
    changed = np.zeros(ids.shape[0], bool)
    for r in np.flatnonzero(np.isin(ids, np.fromiter(plan.new_lists, np.int64, len(plan.new_lists)))):
        nbrs[r] = plan.new_lists[int(ids[r])][:g]
        changed[r] = True
    # nhub follows the hub counts: current (stored) counts + the erasure's changes; new entries read theirs
    delta = plan.hub_delta
    if changed.any():
        hub_now = _hubs_of(conn, place, nbrs[changed].ravel())
        for r in np.flatnonzero(changed):
            c = int(labels[r])
            nhub[r] = [hub_now.get((c, int(j)), 0.0) + delta.get((c, int(j)), 0.0) for j in nbrs[r]]
    # the other rows: + the change of each listed item's count in the row's class
    dk = np.array([(c, i) for c, i in delta], dtype=np.int64).reshape(-1, 2)
    changed |= add_hub_changes(labels, nbrs, nhub, dk, np.array(list(delta.values()), np.float64), changed)
    return changed


def _erase_cells(conn, place: Place, plan: Plan) -> None:
    """Cell rows: the erased items leave every list; the counts change by the plan; level-0 rows are
    cut again from the class's whole counts (level -1); ``chubs`` follow the class counts
    (:func:`pm_vector.db.runs.cell_counts.apply`: only the rows that change are read and written)."""
    cell_counts.apply(conn, place.table("cells"), plan.cell_delta, plan.erased, MAX_K_PRIME)


def _erase_locations(conn, place: Place, plan: Plan) -> None:
    """Location rows (:mod:`pm_vector.db.runs.locations`): the erased items leave every row (their
    counts with them); an answer is ranked from the remaining entries and the top hubs at each
    resolve, so a list that lost items is refilled by the same ranking. The counts the erased
    items' own neighbour lists gave to other items stay until the next full job (as ``embed
    --new-items``, an approximation of the counts, never of who may be listed). Only the parts
    listing an erased item are read and written: the erased items' stored parts (rows of level -1),
    then the rows of those parts and the top hubs that list one (a run of one part, or an erased
    item the level -1 rows do not place: every row that lists one)."""
    t = place.table("locations")
    erased = np.unique(plan.erased)
    listed = lambda r: bool(array_rows.member(r.item_ids, erased).any())  # noqa: E731
    placed = parts_of(conn, t, plan.doc["locations"], erased) if int(
        (plan.doc.get("locations") or {}).get("part_level") or 0) else {}
    if placed and len(placed) == erased.size:  # a part's rows tested against its own erased items only
        rows = array_rows.read(conn, t, KEYS, "level = 0 AND item_ids && %s::bigint[]", [erased.tolist()],
                               match=lambda r: r.key[0] == 0 and listed(r))
        rows += array_rows.read(
            conn, t, KEYS, "level <> 0 AND item_ids && pm_g.pm_ids", match=lambda r: r.key[0] != 0 and listed(r),
            join=sql.SQL("JOIN (SELECT u.p AS pm_part, array_agg(u.e) AS pm_ids FROM unnest(%s::int[], %s::bigint[]) "
                         "AS u(p, e) GROUP BY u.p) AS pm_g ON pm_g.pm_part = {}.part").format(t),
            join_params=[[placed[int(i)] for i in erased], erased.tolist()])
    else:  # one part per row, or an erased item the rows do not place (damaged): every row that lists one
        rows = array_rows.read(conn, t, KEYS, "item_ids && %s::bigint[]", [erased.tolist()], match=listed)
    for r in rows:
        keep = ~array_rows.member(r.item_ids, erased)
        r.item_ids, r.hubs, r.chubs = r.item_ids[keep], r.hubs[keep], r.chubs[keep]
    array_rows.write(conn, t, KEY_KINDS, rows)


def eraser(rt: RunTable) -> Callable[[Any, Place, Plan], None] | None:
    """The function that erases items from a table of kind ``rt``: its own, or the function of this
    module the registry names (the built-in kinds)."""
    return globals()[rt.erase] if isinstance(rt.erase, str) else rt.erase


def run_tables(doc: Mapping[str, Any] | None) -> list[RunTable]:
    """The run's tables that hold items (:func:`~pm_vector.db.runs.kinds.run_kinds` with an erasure), in order."""
    return [KINDS[k] for k in run_kinds(doc) if KINDS[k].erase is not None]


def stored_lists(conn, run_id: int, doc: Mapping[str, Any] | None, erased) -> dict[int, np.ndarray]:
    """The run's stored class-rows neighbour lists of the erased items and of every item whose list
    holds one (nearest first where the prior keeps the order, else by id)."""
    if not is_ready(doc):
        return {}
    out: dict[int, list] = {}
    erased = [int(i) for i in erased]
    for place in places(conn, run_id, doc):
        t = place.table("neighbors")
        aff = [r[0] for r in conn.execute(sql.SQL("SELECT DISTINCT item_id FROM {} WHERE neighbor_id = ANY(%s)").format(t),
                                          [erased]).fetchall()]
        want = sorted(set(aff) | set(erased))
        for item, nbr in conn.execute(sql.SQL("SELECT item_id, neighbor_id FROM {} WHERE item_id = ANY(%s) "
                                              "ORDER BY item_id, neighbor_id").format(t), [want]).fetchall():
            out.setdefault(int(item), []).append(int(nbr))
        # the prior keeps each list nearest first: that order where it has it
        if _exists(conn, place, "prior"):
            for item, nbrs in conn.execute(sql.SQL("SELECT item_id, nbrs FROM {} WHERE item_id = ANY(%s)").format(
                    place.table("prior")), [want]).fetchall():
                if nbrs:
                    out[int(item)] = [int(x) for x in nbrs]
    return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}


def places(conn, run_id: int, doc: Mapping[str, Any] | None) -> list[Place]:
    """Where the run's class rows and cells live: the coordinator, or each shard (foreign tables
    ``run_<id>_<kind>_at_<shard>`` created in the caller's transaction, dropped by :func:`done`)."""
    shards = (doc or {}).get("shards")
    if not shards:
        return [Place(int(run_id), None)]
    rid = int(run_id)
    out = []
    d = int(doc["n_components"])
    cols = {k: shard_columns(k, d) for k in run_kinds(doc) if KINDS[k].shard_columns}
    for s in shards:
        for kind, c in cols.items():
            create_foreign_table(conn, rid, kind, s, c, replace=False)
        out.append(Place(rid, s))
    return out


def done(conn, run_id: int, doc: Mapping[str, Any] | None) -> None:
    for s in (doc or {}).get("shards") or {}:
        for kind in (k for k, rt in KINDS.items() if rt.shard_columns):
            drop_foreign_table(conn, run_id, kind, s)


def erase_from_run(conn, p: Plan) -> dict[str, Any] | None:
    """Apply ``p`` to its run in the caller's transaction (every table of :func:`run_tables` the run
    has, here and on its shards). Returns the run's new ``class_rows`` document (None: unchanged)."""
    if not p.gone.any():
        return None
    doc = p.doc
    coord = Place(p.run_id, None)
    shard_places = [q for q in places(conn, p.run_id, doc) if q.shard is not None]
    for rt in run_tables(doc):
        targets = []
        if rt.where in ("coordinator", "both") or not shard_places:
            targets.append(coord)
        if rt.where in ("shards", "both"):
            targets += shard_places
        for place in targets:
            if _exists(conn, place, rt.kind):
                eraser(rt)(conn, place, p)
    if shard_places:  # rows held by a deferred write (array_rows.deferred, prior_rows.deferred) reach the shards

        array_rows.flush(conn)
        prior_rows.flush(conn)
    done(conn, p.run_id, doc)
    if not is_ready(doc):
        return None
    new_doc = dict(doc)
    keep = ~p.gone
    new_doc["class_sizes"] = [int(np.sum(p.labels[keep] == int(c))) for c in doc["classes"]]
    new_doc["n_items"] = int(keep.sum())
    new_doc["graph_version"] = int(doc.get("graph_version", 0)) + 1
    return new_doc


def erase_in_runs(conn, ids: np.ndarray, runs, load: Callable[[int], dict], *, quick: bool = False) -> list[int]:
    """Erase ``ids`` from each run ``(run_id, class_rows)`` in the caller's transaction.
    ``load(run_id)``: the run's items before the erasure (``id``, ``label``, ``features``, ascending ids).
    ``quick``: the refill of :func:`pm_vector.db.runs.erase_plan.plan` an attached table's sync uses.
    Returns the runs that held some of them."""
    touched = []
    ids = np.asarray(ids, dtype=np.int64)
    for rid, doc in runs:
        rid = int(rid)
        present = np.array([r[0] for r in conn.execute(
            sql.SQL("SELECT item_id FROM {} WHERE item_id = ANY(%s) ORDER BY item_id").format(run_table(rid, "items")),
            [ids.tolist()]).fetchall()], dtype=np.int64)
        if present.size == 0:
            continue
        have = load(rid)
        cells = run_cells.get(conn, rid, doc, "cells")
        p = plan(conn, rid, doc, have["id"], have["label"], have["features"], present,
                 neighbor_lists=stored_lists(conn, rid, doc, present), cells_doc=cells, quick=quick)
        new_doc = erase_from_run(conn, p)
        if new_doc is None:
            conn.execute("UPDATE pm_vector.embedding_runs SET n_items = n_items - %s WHERE id = %s",
                         [int(present.size), rid])
        else:
            conn.execute("UPDATE pm_vector.embedding_runs SET n_items = n_items - %s, class_rows = %s WHERE id = %s",
                         [int(present.size), Jsonb(new_doc), rid])
        touched.append(rid)
    return touched


def apply_pending(conn, run_id: int, items: dict) -> int:
    """At a job's switch (the collection row locked, in the switch transaction): the items the new
    run embedded that were deleted since the job read them leave it before it serves. A run that
    takes the delta tombstones them, one statement (:func:`pm_vector.db.runs.delta.tombstone_deleted`:
    their rows go with the next merge, as any delete's): the switch holds the collection row, and
    with it every write and the attached tables' sync, and erasing thousands of items from every
    list there (a merge's build under a stream of 100 changes a second: 3,351 items, a 68 s switch;
    12,002, 166 s) held them for as long. A merge tombstones most of them before its switch
    (:func:`pm_vector.db.runs.merge.catch_up_run`). Other runs are erased from every run table.
    ``items``: what the job read (``id``, ``label``, ``features``). Returns how many."""
    rid, doc, settings = conn.execute(
        "SELECT r.id, r.class_rows, c.settings FROM pm_vector.embedding_runs r JOIN pm_vector.collections c "
        "ON c.id = r.collection_id WHERE r.id = %s", [int(run_id)]).fetchone()
    if delta.takes_delta(doc, {"settings": settings}):
        return delta.tombstone_deleted(conn, rid)
    gone = np.array([r[0] for r in conn.execute(
        sql.SQL("SELECT e.item_id FROM {} e WHERE NOT EXISTS (SELECT 1 FROM pm_vector.items i WHERE i.id = e.item_id) "
                "ORDER BY 1").format(run_table(run_id, "items"))).fetchall()], dtype=np.int64)
    if gone.size:
        erase_in_runs(conn, gone, [(rid, doc)], lambda _rid: items)
    return int(gone.size)
