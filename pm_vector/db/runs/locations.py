"""The per-run data of the location release (requests with ``release: "location"``), built by the
embedding job beside the class rows and the cells, on the same neighbour graph.

For a run, :func:`build` computes in memory, from the run's public anchor set and the graph:

* the run's location cells (:func:`~pm_vector.manifold.public_cells.fit_location_cells`: k-means of the
  whole public anchor at nested levels M = 2, 4, ... and the anchor's size), fit on the public
  anchor set ONLY (``embedding_runs.public_locations``; digest and levels in
  ``embedding_runs.class_rows -> 'locations'``);
* the hub counts ``h(i)`` (how many items have ``i`` among their 32 nearest) and, per level M and
  cell r, ``h_r(i)``: the same count over the items of cell r, plus 1 when ``i`` itself lies in r.

A report ``r`` is answered by :func:`pm_vector.shortlist.location_list` on the row of ``(M, r)``
and the top hubs (row ``(0, 0)``: every item by ``h`` desc then id, so an answer always holds
``min(S, N)`` items). A row keeps only the entries an answer of at most
:data:`~pm_vector.shortlist.MAX_LOCATION_CANDIDATES` can use
(:func:`pm_vector.db.runs.cell_data.useful_entries`), so a million items fit.

:func:`write` stores them in ``run_<id>_locations(level, cell, item_ids, hubs, chubs)`` by binary
COPY on the coordinator (beside the codes, where a sharded run joins its candidates); nothing points
at the run before the job's switch, so a killed job leaves the previous run serving.
``embed --new-items`` (:func:`extend`) adds new items' edges to the rows they touch, as the cells do
(the neighbour lists of existing items are not recomputed; a full job rebuilds everything exactly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .. import _binary
from . import array_rows
from .cell_data import useful_entries

#: the rows of a run's locations table go in one COPY per this many rows
_BATCH = 2_000


@dataclass
class LocationsData:
    cells: Any  # PublicCells of the whole anchor (one class)
    graph_degree: int
    levels: np.ndarray  # (R,) int: the rows' level M (0: the top hubs)
    cell: np.ndarray  # (R,) int: the rows' cell
    item_ids: list  # R int64 arrays
    hubs: list  # R float64 arrays: h_r(i) (level 0: h(i))
    chubs: list  # R float64 arrays: h(i)

    def doc(self) -> dict[str, Any]:
        """What ``embedding_runs.class_rows -> 'locations'`` records (public)."""
        return {"status": "ready", "digest": self.cells.digest(), "levels": [int(k) for k in self.cells.levels_],
                "graph_degree": int(self.graph_degree)}


def unavailable(error: str) -> dict[str, Any]:
    return {"status": "unavailable", "error": str(error)[:2000]}


def _top_hubs(h: np.ndarray, k_max: int) -> np.ndarray:
    """Every item by (h desc, position), the first ``k_max``: items no one lists come last, so an
    answer of ``S`` candidates always has ``min(S, N)`` of them."""
    return np.lexsort((np.arange(h.size), -h))[:k_max]


def build(anchor_X, item_X, item_ids, *, neighbors: np.ndarray, k_max: int | None = None) -> LocationsData:
    """The run's location cells and per-cell hub counts (module doc) on ``neighbors`` (positions,
    the first :data:`~pm_vector.shortlist.CELL_GRAPH_DEGREE` columns are used)."""
    from ...manifold.public_cells import fit_location_cells
    from ...shortlist import CELL_GRAPH_DEGREE, MAX_LOCATION_CANDIDATES

    k_max = int(k_max or MAX_LOCATION_CANDIDATES)
    cells = fit_location_cells(np.asarray(anchor_X, dtype=np.float64))  # public data only
    ids = np.asarray(item_ids, dtype=np.int64)
    N = ids.shape[0]
    nb = np.asarray(neighbors)[:, :CELL_GRAPH_DEGREE]
    g = nb.shape[1]
    h = np.bincount(nb.ravel(), minlength=N).astype(np.float64)
    X = np.asarray(item_X)
    out_lv, out_cell, out_ids, out_h, out_ch = [0], [0], [], [], []
    top = _top_hubs(h, k_max)
    out_ids.append(ids[top])
    out_h.append(h[top])
    out_ch.append(h[top])
    own = np.arange(N)
    for M in cells.levels_:
        M = int(M)
        cell_of = np.empty(N, np.int64)
        for s in range(0, N, 20_000):
            cell_of[s:s + 20_000] = cells.assign(np.asarray(X[s:s + 20_000], dtype=np.float64), 0, M)
        # (cell, neighbour) of every edge j -> i, and (cell, j) for j itself, counted
        key = np.concatenate([(cell_of[:, None] * N + nb).ravel(), cell_of * N + own])
        u, cnt = np.unique(key, return_counts=True)
        group, item = u // N, u % N
        ch = h[item]
        keep = useful_entries(group, item, cnt.astype(np.float64), ch, k_max)
        group, item, cnt, ch = group[keep], item[keep], cnt[keep].astype(np.float64), ch[keep]
        bounds = np.searchsorted(group, np.arange(M + 1))
        for r in range(M):
            a, b = bounds[r], bounds[r + 1]
            out_lv.append(M)
            out_cell.append(r)
            out_ids.append(ids[item[a:b]])
            out_h.append(cnt[a:b])
            out_ch.append(ch[a:b])
    return LocationsData(cells=cells, graph_degree=g, levels=np.asarray(out_lv, np.int32),
                         cell=np.asarray(out_cell, np.int32), item_ids=out_ids, hubs=out_h, chubs=out_ch)


def _copy(conn, table: str, data: LocationsData) -> None:
    n = data.levels.shape[0]
    for s in range(0, n, _BATCH):
        part = np.arange(s, min(n, s + _BATCH))
        stream = _binary.encode_with_tail(
            [("level", "int4", 0), ("cell", "int4", 0)], {"level": data.levels[part], "cell": data.cell[part]},
            [[_binary.binary_array(data.item_ids[i], "int8") for i in part],
             [_binary.binary_array(data.hubs[i], "float8") for i in part],
             [_binary.binary_array(data.chubs[i], "float8") for i in part]])
        _binary.copy_in(conn, f"COPY {table} (level, cell, item_ids, hubs, chubs) FROM STDIN (FORMAT BINARY)", stream)
        conn.commit()


def write(conn, run_id: int, data: LocationsData) -> None:
    """Create the run's locations table on this node (the coordinator of a sharded run) and COPY the
    rows in; the cells' document goes to ``embedding_runs.public_locations``. Each step committed
    (nothing points at the run yet)."""
    from psycopg.types.json import Json

    rid = int(run_id)
    conn.execute("UPDATE pm_vector.embedding_runs SET public_locations = %s WHERE id = %s",
                 [Json(data.cells.to_dict()), rid])
    conn.execute("SELECT pm_vector.pm_create_locations_table(%s)", [rid])
    array_rows.store_uncompressed(conn, f"pm_vector.run_{rid}_locations")
    conn.commit()
    _copy(conn, f"pm_vector.run_{rid}_locations", data)
    conn.execute(f"ANALYZE pm_vector.run_{rid}_locations")
    conn.commit()


def extend(conn, run_id: int, doc: Mapping[str, Any], all_ids, all_X, new_ids, new_X, *,
           near: np.ndarray | None = None) -> None:
    """Add new items to the run's location rows, inside the caller's transaction: each new item's
    ``graph_degree`` nearest other items (against every item of the run, new ones included) count
    in its cell's row at every level (and the item itself), and ``h`` grows by those edges in the
    top-hubs row and in every row touched. The neighbour lists of existing items are not recomputed.
    ``near``: the new items' nearest positions in ``all_X`` when the caller searched them already."""
    from ...manifold.public_cells import PublicCells
    from ...neighbors import knn_search

    rid = int(run_id)
    t = f"pm_vector.run_{rid}_locations"
    cells = PublicCells.from_dict(conn.execute("SELECT public_locations FROM pm_vector.embedding_runs WHERE id = %s",
                                               [rid]).fetchone()[0])
    all_ids = np.asarray(all_ids, dtype=np.int64)
    ids = np.asarray(new_ids, dtype=np.int64)
    X = np.asarray(new_X, dtype=np.float64)
    g = min(int(doc.get("graph_degree") or 0), all_ids.shape[0] - 1)
    if ids.size == 0 or g < 1:
        return
    found = all_ids[(near if near is not None else knn_search(X, all_X, g + 1))[:, :g + 1]]
    nb = np.stack([found[r][found[r] != ids[r]][:g] for r in range(ids.size)])
    dh = dict(zip(*np.unique(nb.ravel(), return_counts=True)))
    touched: dict[tuple[int, int], dict[int, float]] = {}
    for M in cells.levels_:
        cell = cells.assign(X, 0, int(M))
        for r in range(ids.size):
            d = touched.setdefault((int(M), int(cell[r])), {})
            for i in nb[r].tolist() + [int(ids[r])]:
                d[i] = d.get(i, 0.0) + 1.0
    _apply(conn, t, touched, dh)


def _apply(conn, t: str, touched: dict, dh: dict) -> None:
    """Rows ``(0, 0)`` and ``touched`` (``(level, cell) -> {item: added count}``) with the new edges:
    ``h`` (the rows' ``chubs``) grows by ``dh``; the top-hubs row takes the new ``h`` of those items
    and keeps its first :data:`~pm_vector.shortlist.MAX_LOCATION_CANDIDATES` by (``h`` desc, id);
    a cell's row adds its counts, by id. Read and written as arrays (:mod:`pm_vector.db.runs.array_rows`)."""
    from ...shortlist import MAX_LOCATION_CANDIDATES

    keys = [(0, 0)] + list(touched)
    wanted = set(keys)
    rows = array_rows.read(conn, t, ("level", "cell"), "(level, cell) IN (SELECT * FROM unnest(%s::integer[], "
                           "%s::integer[]))", [[k[0] for k in keys], [k[1] for k in keys]], lock=True,
                           match=lambda r: r.key in wanted)
    # h as the rows know it (a later row's value wins), plus the new edges
    all_ids = np.concatenate([r.item_ids for r in rows] + [np.zeros(0, np.int64)])[::-1]
    all_h = np.concatenate([r.chubs for r in rows] + [np.zeros(0)])[::-1]
    h_ids, first = np.unique(all_ids, return_index=True)
    dk = np.array(sorted(dh), dtype=np.int64)
    dv = np.array([float(dh[int(i)]) for i in dk])
    h_ids, inv = np.unique(np.concatenate([h_ids, dk]), return_inverse=True)
    h_val = np.bincount(inv, weights=np.concatenate([all_h[first], dv]), minlength=h_ids.size)
    for r in rows:
        if r.key[0] == 0:  # the new edges' items take their new h
            u, inv = np.unique(np.concatenate([r.item_ids, dk]), return_inverse=True)
            cur = np.zeros(u.size)
            cur[inv[:r.item_ids.size]] = r.hubs
            cur[inv[r.item_ids.size:]] = h_val[np.searchsorted(h_ids, dk)]
            o = np.lexsort((u, -cur))[:MAX_LOCATION_CANDIDATES]
        else:
            add = touched.get(r.key, {})
            ak = np.fromiter(add, np.int64, len(add))
            av = np.fromiter(add.values(), np.float64, len(add))
            u, inv = np.unique(np.concatenate([r.item_ids, ak]), return_inverse=True)
            cur = np.bincount(inv, weights=np.concatenate([r.hubs, av]), minlength=u.size)
            o = np.arange(u.size)
        r.item_ids, r.hubs = u[o], cur[o]
        p = np.clip(np.searchsorted(h_ids, r.item_ids), 0, max(h_ids.size - 1, 0))
        r.chubs = np.where(h_ids[p] == r.item_ids, h_val[p], 0.0) if h_ids.size else np.zeros(r.item_ids.size)
    array_rows.write(conn, t, (("level", "int4"), ("cell", "int4")), rows)
