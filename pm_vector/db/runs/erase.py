"""Erasure of items from a run: ONE registry of the run's derived tables and how an item leaves each.

:data:`RUN_TABLES` lists every per-run table that holds items, where a sharded run keeps it
(``coordinator`` or ``shards``) and the function that removes the erased items from it. A new
per-run table is added to the erasure by one line there (and :func:`test_every_run_table_is_registered`
in ``tests/db/test_db_erase.py`` fails while a run table is missing from it).

:func:`erase_from_run` applies an erasure plan (:func:`plan`) to one run, inside the caller's
transaction. The plan is computed from the run's item set before the erasure (ids, labels,
features) and the erased ids:

* the erased items' rows leave ``items``, ``codes``, ``prior``, ``neighbors``, ``hubs`` and every
  list of ``cells`` (and a shard's fill list ``items``, refilled with the run's next item ids);
* every neighbour list that held an erased item is **refilled by the same ranking**: the nearest
  other remaining items by raw features (exact search), so each list keeps ``graph_degree``
  entries and the prior's ``nbrs`` stay rectangular;
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

from .. import _binary
from .erase_plan import Plan, is_ready, plan
from .run_copy import copy_hubs, copy_pairs, copy_prior


@dataclass(frozen=True)
class Place:
    """Where a run keeps its tables: the coordinator (``shard`` None) or one shard through foreign tables."""

    run_id: int
    shard: str | None

    def table(self, kind: str) -> str:
        if self.shard is None:
            return f"pm_vector.run_{int(self.run_id)}_{kind}"
        return f'pm_vector."run_{int(self.run_id)}_{kind}_at_{self.shard}"'


def _exists(conn, place: Place, kind: str) -> bool:
    if place.shard is not None:
        return conn.execute("SELECT to_regclass(%s) IS NOT NULL", [place.table(kind)]).fetchone()[0]
    return conn.execute("SELECT to_regclass(pm_vector.pm_run_table(%s, %s)) IS NOT NULL",
                        [place.run_id, kind]).fetchone()[0]


# ----------------------------------------------------------------------------- per-table erasure

def _rows_of(kind: str) -> Callable[[Any, Place, Plan], None]:
    """Tables keyed by item id (``items``, ``codes``): the erased rows go. On a shard, ``items`` is the
    run's fill list (its first MAX_K_PRIME item ids): it is refilled with the next remaining ids."""

    def erase(conn, place: Place, plan: Plan) -> None:
        conn.execute(f"DELETE FROM {place.table(kind)} WHERE item_id = ANY(%s)", [plan.erased.tolist()])
        if kind == "items" and place.shard is not None:  # the shard's fill list keeps its MAX_K_PRIME first ids
            from .sharding import FILL

            before = plan.ids[:FILL]
            after = plan.ids[~plan.gone][:FILL]
            add = np.setdiff1d(after, before)
            if add.size:
                conn.execute(f"INSERT INTO {place.table(kind)} (item_id) SELECT unnest(%s::bigint[])", [add.tolist()])
    return erase


def _erase_neighbors(conn, place: Place, plan: Plan) -> None:
    """The erased items' lists go; the refilled lists replace the old ones (rows of this place's items)."""
    t = place.table("neighbors")
    changed = np.array(sorted(plan.new_lists), dtype=np.int64)
    conn.execute(f"DELETE FROM {t} WHERE item_id = ANY(%s)", [np.concatenate([plan.erased, changed]).tolist()])
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
    rows = conn.execute(f"SELECT label, item_id, hub FROM {place.table('hubs')} WHERE item_id = ANY(%s)",
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
        conn.execute(f"DELETE FROM {t} WHERE label = %s AND item_id = ANY(%s)", [c, keys])
        rows = [(i, cur.get((c, i), 0.0) + plan.hub_delta.get((c, i), 0.0)) for i in keys if i not in erased]
        rows = [(i, v) for i, v in rows if v > 0]
        if rows:
            copy_hubs(conn, t, np.full(len(rows), c, np.int64), np.array([r[0] for r in rows], np.int64),
                      np.array([r[1] for r in rows], np.float64), 1 << 30, False)


def _erase_prior(conn, place: Place, plan: Plan) -> None:
    """Prior rows: the erased go; rows whose list was refilled or whose neighbours' hub counts changed
    are written again (``nbrs`` the refilled list, ``nhub`` the new counts)."""
    t = place.table("prior")
    d = int(plan.doc["n_components"])
    n = conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
    g = conn.execute(f"SELECT cardinality(nbrs) FROM {t} LIMIT 1").fetchone()
    if not n or g is None:
        return
    g = int(g[0])
    a = _binary.copy_out_columns(conn, f"SELECT item_id, label, coords8, nbrs, nhub FROM {t}",
                                 [("item_id", "int8", 0), ("label", "int8", 0), ("coords8", "float8[]", d),
                                  ("nbrs", "int8[]", g), ("nhub", "float8[]", g)], int(n))
    ids, labels = a["item_id"], a["label"]
    nbrs, nhub = a["nbrs"].reshape(-1, g).copy(), a["nhub"].reshape(-1, g).copy()
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
    if delta:  # the other rows: + the change of each listed item's count in the row's class (vectorised)
        dk = np.array([(c, i) for c, i in delta], dtype=np.int64).reshape(-1, 2)
        dv = np.array(list(delta.values()), dtype=np.float64)
        cs = np.unique(np.concatenate([labels, dk[:, 0]]))  # labels by position (few): ids below 2^44
        key = lambda c, i: np.searchsorted(cs, c).astype(np.int64) * np.int64(1 << 44) + i  # noqa: E731
        order = np.argsort(key(dk[:, 0], dk[:, 1]))
        sk, sv = key(dk[:, 0], dk[:, 1])[order], dv[order]
        q = key(np.repeat(labels, g).reshape(-1, g), nbrs)
        pos = np.clip(np.searchsorted(sk, q), 0, max(sk.size - 1, 0))
        hit = (sk.size > 0) & (sk[pos] == q)
        rows = ~changed & hit.any(axis=1)
        add = np.where(hit, sv[pos], 0.0)
        nhub[rows] += add[rows]
        changed |= rows
    gone = np.isin(ids, plan.erased)
    changed &= ~gone
    drop = ids[gone | changed]
    if drop.size:
        for c in np.unique(labels[gone | changed]):
            sel = (labels == c) & (gone | changed)
            conn.execute(f"DELETE FROM {t} WHERE label = %s AND item_id = ANY(%s)", [int(c), ids[sel].tolist()])
    if changed.any():
        coords = a["coords8"].reshape(-1, d)[changed]
        copy_prior(conn, plan.run_id, ids[changed], labels[changed], coords, 1 << 30, False,
                   nbrs=nbrs[changed], nhub=nhub[changed], table=t)


def _erase_cells(conn, place: Place, plan: Plan) -> None:
    """Cell rows: the erased items leave every list; the counts change by the plan; level-0 rows are
    cut again from the class's whole counts (level -1); ``chubs`` follow the class counts."""
    from ...protocol.bounds import MAX_K_PRIME

    t = place.table("cells")
    rows = conn.execute(f"SELECT level, label, cell, item_ids, hubs FROM {t}").fetchall()
    erased = set(int(i) for i in plan.erased)
    new_rows: dict[tuple, dict[int, float]] = {}
    for level, label, cell, ids, hubs in rows:
        new_rows[(int(level), int(label), int(cell))] = {int(i): float(h) for i, h in zip(ids, hubs)}
    touched: set = set()
    for (level, label, cell, item), dv in plan.cell_delta.items():
        keys = [(level, label, cell)] + ([(-1, label, 0)] if level == 0 else [])
        for key in keys:
            row = new_rows.get(key)
            if row is None:
                continue
            row[item] = row.get(item, 0.0) + dv
            touched.add(key)
    for key, row in new_rows.items():
        before = len(row)
        for i in [i for i, v in row.items() if i in erased or v <= 0]:
            del row[i]
        if len(row) != before:
            touched.add(key)
    for c in {k[1] for k in touched}:  # level 0 is the first MAX_K_PRIME of the whole counts when the class keeps them
        whole = new_rows.get((-1, c, 0))
        if whole is not None:
            top = sorted(whole.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_K_PRIME]
            new_rows[(0, c, 0)] = dict(top)
            touched.add((0, c, 0))
    # the items whose class count changed: a row listing one is written again (its chubs follow)
    moved: dict[int, set] = {}
    for (level, label, _cell, item) in plan.cell_delta:
        if level == 0:
            moved.setdefault(label, set()).add(item)
    for key, row in new_rows.items():
        if key not in touched and key[1] in moved and not moved[key[1]].isdisjoint(row):
            touched.add(key)
    if not touched:
        return
    from .cell_data import CellsData, copy_cell_rows

    keys = sorted(touched)
    lv, lab, cel, ids_, hubs_, chubs_ = [], [], [], [], [], []
    for key in keys:
        level, c, cell = key
        row = new_rows[key]
        class_counts = new_rows.get((-1, c, 0)) or new_rows.get((0, c, 0)) or {}
        items = sorted(row.items(), key=(lambda kv: (-kv[1], kv[0])) if level <= 0 else (lambda kv: kv[0]))
        lv.append(level)
        lab.append(c)
        cel.append(cell)
        ids_.append(np.array([i for i, _ in items], np.int64))
        hubs_.append(np.array([h for _, h in items], np.float64))
        chubs_.append(np.array([class_counts.get(i, 0.0) for i, _ in items], np.float64))
    k = np.array(keys, dtype=np.int64).reshape(-1, 3)
    conn.execute(f"DELETE FROM {t} WHERE (level, label, cell) IN (SELECT * FROM unnest(%s::int[], %s::bigint[], "
                 "%s::int[]))", [k[:, 0].tolist(), k[:, 1].tolist(), k[:, 2].tolist()])
    data = CellsData(cells=None, graph_degree=0, levels=np.asarray(lv, np.int32), labels=np.asarray(lab, np.int64),
                     cell=np.asarray(cel, np.int32), item_ids=ids_, hubs=hubs_, chubs=chubs_)
    copy_cell_rows(conn, t, data, np.ones(len(keys), bool), commit=False)


def _erase_locations(conn, place: Place, plan: Plan) -> None:
    """Location rows (:mod:`pm_vector.db.runs.locations`): the erased items leave every row (their
    counts with them); an answer is ranked from the remaining entries and the top hubs at each
    resolve, so a list that lost items is refilled by the same ranking. The counts the erased
    items' own neighbour lists gave to other items stay until the next full job (as ``embed
    --new-items``, an approximation of the counts, never of who may be listed)."""
    conn.execute(
        f"UPDATE {place.table('locations')} AS r SET (item_ids, hubs, chubs) = (SELECT "
        "coalesce(array_agg(x.id ORDER BY x.k), '{}'), coalesce(array_agg(x.h ORDER BY x.k), '{}'), "
        "coalesce(array_agg(x.c ORDER BY x.k), '{}') FROM unnest(r.item_ids, r.hubs, r.chubs) WITH ORDINALITY "
        "AS x(id, h, c, k) WHERE x.id <> ALL(%s::bigint[])) WHERE r.item_ids && %s::bigint[]",
        [plan.erased.tolist(), plan.erased.tolist()])


@dataclass(frozen=True)
class RunTable:
    """A per-run table holding items: its kind (``run_<id>_<kind>``), where a sharded run keeps it,
    and how the erased items leave it."""

    kind: str
    where: str  # "coordinator" | "shards" | "both" (a sharded run's coordinator and its shards)
    erase: Callable[[Any, Place, Plan], None]
    needs: str = "run"  # "run": always; "class_rows": ready class rows; "cells" / "locations": ready cells / locations


#: every per-run table that holds items (``run_<id>_anchors`` holds none). Order matters only where a
#: function reads another table: the prior reads the hub counts as they were, so it comes before them.
RUN_TABLES: tuple[RunTable, ...] = (
    RunTable("items", "both", _rows_of("items")),
    RunTable("codes", "coordinator", _rows_of("codes")),
    RunTable("prior", "shards", _erase_prior, "class_rows"),
    RunTable("neighbors", "shards", _erase_neighbors, "class_rows"),
    RunTable("hubs", "shards", _erase_hubs, "class_rows"),
    RunTable("cells", "shards", _erase_cells, "cells"),
    RunTable("locations", "coordinator", _erase_locations, "locations"),
)


def stored_lists(conn, run_id: int, doc: Mapping[str, Any] | None, erased) -> dict[int, np.ndarray]:
    """The run's stored class-rows neighbour lists of the erased items and of every item whose list
    holds one (nearest first where the prior keeps the order, else by id)."""
    if not is_ready(doc):
        return {}
    out: dict[int, list] = {}
    erased = [int(i) for i in erased]
    for place in places(conn, run_id, doc):
        t = place.table("neighbors")
        aff = [r[0] for r in conn.execute(f"SELECT DISTINCT item_id FROM {t} WHERE neighbor_id = ANY(%s)",
                                          [erased]).fetchall()]
        want = sorted(set(aff) | set(erased))
        for item, nbr in conn.execute(f"SELECT item_id, neighbor_id FROM {t} WHERE item_id = ANY(%s) "
                                      "ORDER BY item_id, neighbor_id", [want]).fetchall():
            out.setdefault(int(item), []).append(int(nbr))
        # the prior keeps each list nearest first: that order where it has it
        if _exists(conn, place, "prior"):
            for item, nbrs in conn.execute(f"SELECT item_id, nbrs FROM {t.replace('neighbors', 'prior')} "
                                           "WHERE item_id = ANY(%s)", [want]).fetchall():
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
    cols = {"prior": f"item_id bigint, label bigint, coords vector({d}), coords8 float8[], nbrs bigint[], "
                     "nhub float8[]",
            "neighbors": "item_id bigint, neighbor_id bigint", "hubs": "label bigint, item_id bigint, hub float8",
            "items": "item_id bigint",
            "cells": "level integer, label bigint, cell integer, item_ids bigint[], hubs float8[], chubs float8[]"}
    for s in shards:
        for kind, c in cols.items():
            if kind == "cells" and (doc.get("cells") or {}).get("status") != "ready":
                continue
            conn.execute(f'CREATE FOREIGN TABLE IF NOT EXISTS pm_vector."run_{rid}_{kind}_at_{s}" ({c}) '
                         f'SERVER "pm_shard_{s}" OPTIONS (schema_name \'pm_vector\', table_name \'run_{rid}_{kind}\')')
        out.append(Place(rid, s))
    return out


def done(conn, run_id: int, doc: Mapping[str, Any] | None) -> None:
    for s in (doc or {}).get("shards") or {}:
        for kind in ("prior", "neighbors", "hubs", "items", "cells"):
            conn.execute(f'DROP FOREIGN TABLE IF EXISTS pm_vector."run_{int(run_id)}_{kind}_at_{s}"')


def erase_from_run(conn, p: Plan) -> dict[str, Any] | None:
    """Apply ``p`` to its run in the caller's transaction (every table of :data:`RUN_TABLES` the run
    has, here and on its shards). Returns the run's new ``class_rows`` document (None: unchanged)."""
    if not p.gone.any():
        return None
    doc = p.doc
    coord = Place(p.run_id, None)
    shard_places = [q for q in places(conn, p.run_id, doc) if q.shard is not None]
    cells_ready = (doc.get("cells") or {}).get("status") == "ready"
    for rt in RUN_TABLES:
        if rt.needs == "class_rows" and not is_ready(doc):
            continue
        if rt.needs == "cells" and not (is_ready(doc) and cells_ready):
            continue
        if rt.needs == "locations" and not (is_ready(doc) and (doc.get("locations") or {}).get("status") == "ready"):
            continue
        targets = []
        if rt.where in ("coordinator", "both") or not shard_places:
            targets.append(coord)
        if rt.where in ("shards", "both"):
            targets += shard_places
        for place in targets:
            if _exists(conn, place, rt.kind):
                rt.erase(conn, place, p)
    done(conn, p.run_id, doc)
    if not is_ready(doc):
        return None
    new_doc = dict(doc)
    keep = ~p.gone
    new_doc["class_sizes"] = [int(np.sum(p.labels[keep] == int(c))) for c in doc["classes"]]
    new_doc["n_items"] = int(keep.sum())
    new_doc["graph_version"] = int(doc.get("graph_version", 0)) + 1
    return new_doc


def erase_in_runs(conn, ids: np.ndarray, runs, load: Callable[[int], dict]) -> list[int]:
    """Erase ``ids`` from each run ``(run_id, class_rows, public_cells)`` in the caller's transaction.
    ``load(run_id)``: the run's items before the erasure (``id``, ``label``, ``features``, ascending ids).
    Returns the runs that held some of them."""
    from psycopg.types.json import Jsonb

    touched = []
    ids = np.asarray(ids, dtype=np.int64)
    for rid, doc, cells_json in runs:
        rid = int(rid)
        present = np.array([r[0] for r in conn.execute(
            f"SELECT item_id FROM pm_vector.run_{rid}_items WHERE item_id = ANY(%s) ORDER BY item_id",
            [ids.tolist()]).fetchall()], dtype=np.int64)
        if present.size == 0:
            continue
        have = load(rid)
        cells = None
        if cells_json and ((doc or {}).get("cells") or {}).get("status") == "ready":
            from ...manifold.public_cells import PublicCells

            cells = PublicCells.from_dict(cells_json)
        p = plan(conn, rid, doc, have["id"], have["label"], have["features"], present,
                 neighbor_lists=stored_lists(conn, rid, doc, present), cells_doc=cells)
        new_doc = erase_from_run(conn, p)
        conn.execute("UPDATE pm_vector.embedding_runs SET n_items = n_items - %s"
                     + (", class_rows = %s" if new_doc is not None else "") + " WHERE id = %s",
                     [int(present.size)] + ([Jsonb(new_doc)] if new_doc is not None else []) + [rid])
        touched.append(rid)
    return touched


def apply_pending(conn, run_id: int, items: dict) -> int:
    """At a job's switch (the collection row locked, in the switch transaction): erase from the new
    run the items it embedded that were deleted since the job read them. ``items``: what the job read
    (``id``, ``label``, ``features``). Returns how many."""
    gone = np.array([r[0] for r in conn.execute(
        f"SELECT e.item_id FROM pm_vector.run_{int(run_id)}_items e WHERE NOT EXISTS "
        "(SELECT 1 FROM pm_vector.items i WHERE i.id = e.item_id) ORDER BY 1").fetchall()], dtype=np.int64)
    if gone.size == 0:
        return 0
    runs = conn.execute("SELECT id, class_rows, public_cells FROM pm_vector.embedding_runs WHERE id = %s",
                        [int(run_id)]).fetchall()
    erase_in_runs(conn, gone, runs, lambda _rid: items)
    return int(gone.size)
