"""The per-run data of the location release (requests with ``release: "location"``), built by the
embedding job beside the class rows and the cells, on the same neighbour graph.

For a run, :func:`build` computes in memory, from the run's public anchor set and the graph:

* the run's location cells (:func:`~pm_vector.manifold.public_cells.fit_location_cells`: k-means of the
  whole public anchor at nested levels M = 2, 4, ... and the anchor's size), fit on the public
  anchor set ONLY (``embedding_runs.public_locations``; digest and levels in
  ``embedding_runs.class_rows -> 'locations'``);
* the hub counts ``h(i)`` (how many items have ``i`` among their 32 nearest) and, per level M and
  cell r, ``h_r(i)``: the same count over the items of cell r, plus 1 when ``i`` itself lies in r.

A row is stored in PARTS (:func:`part_level`): the entries of item ``i`` sit in part ``p(i)``, the cell of
``i`` at the run's part level (a published level with about :data:`PART_ITEMS` items a cell), and the
rows ``(-1, p, p)`` list the items of part ``p`` -- where each item's entries are, stored, never
recomputed from floats. A row lists the items of its cell and their nearest neighbours, so each
part appears in few rows: erasing an item or placing a new one reads and writes the parts of the
items concerned, not whole rows (a coarse level's row holds up to 65,536 entries). The top hubs
row is ``(0, 0, 0)``, one part in rank order. A run built before has one part (0) per row.

A report ``r`` is answered by :func:`pm_vector.shortlist.location_list` on the parts of row ``(M, r)``
and the top hubs (row ``(0, 0)``: every item by ``h`` desc then id, so an answer always holds
``min(S, N)`` items). A row keeps only the entries an answer of at most
:data:`~pm_vector.shortlist.MAX_LOCATION_CANDIDATES` can use
(:func:`pm_vector.db.runs.cell_data.useful_entries`), so a million items fit.

:func:`write` stores them in ``run_<id>_locations(level, cell, part, item_ids, hubs, chubs)`` by binary
COPY on the coordinator (beside the codes, where a sharded run joins its candidates); nothing points
at the run before the job's switch, so a killed job leaves the previous run serving.
``embed --new-items`` (:func:`extend`) adds new items' edges to the rows they touch, as the cells do
(the neighbour lists of existing items are not recomputed; a full job rebuilds everything exactly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from psycopg import sql
from psycopg.types.json import Json

from .. import _binary
from ..run_tables import run_table
from . import array_rows, run_cells
from .cell_data import useful_entries
from ...manifold.public_cells import fit_location_cells
from ...neighbors import knn_search
from ...shortlist import CELL_GRAPH_DEGREE, MAX_LOCATION_CANDIDATES
from ..errors import EmbeddingJobError

#: the rows of a run's locations table go in one COPY per this many rows
_BATCH = 2_000

#: the key columns of a location row, and their binary kinds (:mod:`pm_vector.db.runs.array_rows`)
KEYS = ("level", "cell", "part")
KEY_KINDS = (("level", "int4"), ("cell", "int4"), ("part", "int4"))

#: the level of the rows that list each part's items (``(-1, p, p)``)
BOOK_LEVEL = -1

#: a part holds at least this many items on average (:func:`part_level`)
PART_ITEMS = 64

#: :func:`parts_of` more ids than this reads every part's list instead of testing each with ``&&``
#: (which compares each entry with every id: 157 ms for 1,700 ids at 100,000 items, against 9 ms
#: for all 1,000 lists)
_FEW = 64


def part_level(levels, n_items: int) -> int:
    """The part level of a run of ``n_items`` items: its finest published level with at least
    :data:`PART_ITEMS` items a cell on average (0: one part per row, for a small run). A public
    function of the published levels and the item count."""
    ok = [int(M) for M in levels if int(M) * PART_ITEMS <= int(n_items)]
    return max(ok) if ok else 0


@dataclass
class LocationsData:
    cells: Any  # PublicCells of the whole anchor (one class)
    graph_degree: int
    levels: np.ndarray  # (R,) int: the rows' level M (0: the top hubs, -1: each part's items)
    cell: np.ndarray  # (R,) int: the rows' cell
    part: np.ndarray  # (R,) int: the rows' part
    part_level: int  # the level whose cells are the parts (0: one part)
    item_ids: list  # R int64 arrays
    hubs: list  # R float64 arrays: h_r(i) (level 0: h(i))
    chubs: list  # R float64 arrays: h(i)

    def row(self, level: int, cell: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(item_ids, hubs, chubs)`` of row ``(level, cell)``: its parts joined (in part order;
        the top hubs ``(0, 0)`` are one part, in rank order); empty when the row lists no item."""
        k = np.flatnonzero((self.levels == int(level)) & (self.cell == int(cell)))
        k = k[np.argsort(self.part[k], kind="stable")]
        return (np.concatenate([self.item_ids[i] for i in k] + [np.zeros(0, np.int64)]),
                np.concatenate([self.hubs[i] for i in k] + [np.zeros(0)]),
                np.concatenate([self.chubs[i] for i in k] + [np.zeros(0)]))

    def doc(self) -> dict[str, Any]:
        """What ``embedding_runs.class_rows -> 'locations'`` records (public)."""
        return {"status": "ready", "digest": self.cells.digest(), "levels": [int(k) for k in self.cells.levels_],
                "graph_degree": int(self.graph_degree), "part_level": int(self.part_level)}


def unavailable(error: str) -> dict[str, Any]:
    return {"status": "unavailable", "error": str(error)[:2000]}


def _top_hubs(h: np.ndarray, k_max: int) -> np.ndarray:
    """Every item by (h desc, position), the first ``k_max``: items no one lists come last, so an
    answer of ``S`` candidates always has ``min(S, N)`` of them."""
    return np.lexsort((np.arange(h.size), -h))[:k_max]


def build(anchor_X, item_X, item_ids, *, neighbors: np.ndarray, k_max: int | None = None,
          cells=None) -> LocationsData:
    """The run's location cells and per-cell hub counts (module doc) on ``neighbors`` (positions,
    the first :data:`~pm_vector.shortlist.CELL_GRAPH_DEGREE` columns are used). ``cells``: the
    location cells to publish again (:mod:`pm_vector.db.runs.published`) instead of fitting them."""
    k_max = int(k_max or MAX_LOCATION_CANDIDATES)
    if cells is None:
        cells = fit_location_cells(np.asarray(anchor_X, dtype=np.float64))  # public data only
    ids = np.asarray(item_ids, dtype=np.int64)
    N = ids.shape[0]
    nb = np.asarray(neighbors)[:, :CELL_GRAPH_DEGREE]
    g = nb.shape[1]
    h = np.bincount(nb.ravel(), minlength=N).astype(np.float64)
    X = np.asarray(item_X)
    L = part_level(cells.levels_, N)
    part_of = np.zeros(N, np.int64)
    if L:
        for s in range(0, N, 20_000):
            part_of[s:s + 20_000] = cells.assign(np.asarray(X[s:s + 20_000], dtype=np.float64), 0, L)
    out_lv, out_cell, out_part, out_ids, out_h, out_ch = [0], [0], [0], [], [], []
    top = _top_hubs(h, k_max)
    out_ids.append(ids[top])
    out_h.append(h[top])
    out_ch.append(h[top])
    if L:  # each part's items, by id
        o = np.lexsort((ids, part_of))
        bounds = np.searchsorted(part_of[o], np.arange(L + 1))
        for p in range(L):
            got = ids[o[bounds[p]:bounds[p + 1]]]
            if got.size:
                out_lv.append(BOOK_LEVEL)
                out_cell.append(p)
                out_part.append(p)
                out_ids.append(got)
                out_h.append(np.zeros(got.size))
                out_ch.append(np.zeros(got.size))
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
        # a row's entries split by their item's part (by id within a part)
        o = np.lexsort((item, part_of[item], group))
        group, item, cnt, ch = group[o], item[o], cnt[o], ch[o]
        gp = group * (L + 1) + part_of[item]
        starts = np.flatnonzero(np.r_[True, gp[1:] != gp[:-1]]) if gp.size else np.zeros(0, np.int64)
        ends = np.r_[starts[1:], gp.size]
        for a, b in zip(starts.tolist(), ends.tolist()):
            out_lv.append(M)
            out_cell.append(int(group[a]))
            out_part.append(int(part_of[item[a]]))
            out_ids.append(ids[item[a:b]])
            out_h.append(cnt[a:b])
            out_ch.append(ch[a:b])
    return LocationsData(cells=cells, graph_degree=g, levels=np.asarray(out_lv, np.int32),
                         cell=np.asarray(out_cell, np.int32), part=np.asarray(out_part, np.int32), part_level=L,
                         item_ids=out_ids, hubs=out_h, chubs=out_ch)


def _copy(conn, table: sql.Composable, data: LocationsData) -> None:
    """COPY the rows of ``data`` into ``table``, created in the caller's transaction: written frozen,
    nothing committed (:func:`pm_vector.db._binary.copy_options`)."""
    n = data.levels.shape[0]
    for s in range(0, n, _BATCH):
        part = np.arange(s, min(n, s + _BATCH))
        stream = _binary.encode_with_tail(
            [("level", "int4", 0), ("cell", "int4", 0), ("part", "int4", 0)],
            {"level": data.levels[part], "cell": data.cell[part], "part": data.part[part]},
            [[_binary.binary_array(data.item_ids[i], "int8") for i in part],
             [_binary.binary_array(data.hubs[i], "float8") for i in part],
             [_binary.binary_array(data.chubs[i], "float8") for i in part]])
        _binary.copy_in(conn, sql.SQL("COPY {} (level, cell, part, item_ids, hubs, chubs) FROM STDIN {}").format(
            table, _binary.copy_options(True)), stream)


def write(conn, run_id: int, data: LocationsData) -> None:
    """Create the run's locations table on this node (the coordinator of a sharded run) and COPY the
    rows in; the cells' document goes to ``embedding_runs.public_locations``. Each step committed
    (nothing points at the run yet); the table is created and filled in one transaction, its rows
    frozen (:func:`pm_vector.db._binary.copy_options`)."""
    rid = int(run_id)
    conn.execute("UPDATE pm_vector.embedding_runs SET public_locations = %s WHERE id = %s",
                 [Json(data.cells.to_dict()), rid])
    conn.commit()
    conn.execute("SELECT pm_vector.pm_create_locations_table(%s)", [rid])
    t = run_table(rid, "locations")
    array_rows.store_uncompressed(conn, t)
    _copy(conn, t, data)
    conn.execute("SELECT pm_vector.pm_index_locations_table(%s)", [rid])  # (the B-trees built once, not row by row)
    conn.execute(sql.SQL("ANALYZE {}").format(t))
    conn.commit()


def parts_of(conn, t: sql.Composable, doc: Mapping[str, Any], ids) -> dict[int, int]:
    """The stored part of each of ``ids`` that the run holds (from the rows ``(-1, p, p)``; every id
    part 0 in a run of one part). Read through :func:`pm_vector.db.runs.array_rows.read`, so that
    inside a batch the rows it already changed are the ones seen."""
    ids = np.unique(np.asarray(ids, dtype=np.int64))
    if not int(doc.get("part_level") or 0):
        return {int(i): 0 for i in ids}
    if ids.size > _FEW:  # every part's list (about 1 MB at 100,000 items) costs less than ``&&`` with many ids
        rows = array_rows.read(conn, t, KEYS, sql.SQL("level = {}").format(sql.Literal(BOOK_LEVEL)),
                               match=lambda r: r.key[0] == BOOK_LEVEL)
    else:
        rows = array_rows.read(conn, t, KEYS, sql.SQL("level = {} AND item_ids && %s::bigint[]").format(
                                   sql.Literal(BOOK_LEVEL)), [ids.tolist()],
                               match=lambda r: r.key[0] == BOOK_LEVEL and bool(array_rows.member(r.item_ids, ids).any()))
    out: dict[int, int] = {}
    for r in rows:
        for i in r.item_ids[array_rows.member(r.item_ids, ids)].tolist():
            out[int(i)] = int(r.key[2])
    return out


def extend(conn, run_id: int, doc: Mapping[str, Any], all_ids, all_X, new_ids, new_X, *,
           near: np.ndarray | None = None) -> None:
    """Add new items to the run's location rows, inside the caller's transaction: each new item's
    ``graph_degree`` nearest other items (against every item of the run, new ones included) count
    in its cell's row at every level (and the item itself), and ``h`` grows by those edges in the
    top-hubs row and in every row touched. The neighbour lists of existing items are not recomputed.
    A new item's part is its cell at the part level; its neighbours' parts are the stored ones.
    ``near``: the new items' nearest positions in ``all_X`` when the caller searched them already."""
    rid = int(run_id)
    t = run_table(rid, "locations")
    cells = run_cells.get(conn, rid, {"locations": doc}, "locations")
    all_ids = np.asarray(all_ids, dtype=np.int64)
    ids = np.asarray(new_ids, dtype=np.int64)
    X = np.asarray(new_X, dtype=np.float64)
    g = min(int(doc.get("graph_degree") or 0), all_ids.shape[0] - 1)
    if ids.size == 0 or g < 1:
        return
    found = all_ids[(near if near is not None else knn_search(X, all_X, g + 1))[:, :g + 1]]
    nb = np.stack([found[r][found[r] != ids[r]][:g] for r in range(ids.size)])
    dh = dict(zip(*np.unique(nb.ravel(), return_counts=True)))
    L = int(doc.get("part_level") or 0)
    new_part = cells.assign(X, 0, L) if L else np.zeros(ids.size, np.int64)
    part = {int(i): int(p) for i, p in zip(ids.tolist(), new_part.tolist())}
    old = np.setdiff1d(nb.ravel(), ids)
    stored = parts_of(conn, t, doc, old)
    missing = np.setdiff1d(old, np.fromiter(stored, np.int64, len(stored)))
    if missing.size:  # a neighbour the rows do not place: the run's items and its rows disagree

        raise EmbeddingJobError(f"the location rows of run {rid} place no part for {missing.size} of its items; "
                                "run a full embedding job for the collection (pm-vector embed COLLECTION).", rid)
    part.update(stored)
    touched: dict[tuple[int, int, int], dict[int, float]] = {}
    for M in cells.levels_:
        cell = cells.assign(X, 0, int(M))
        for r in range(ids.size):
            for i in nb[r].tolist() + [int(ids[r])]:
                d = touched.setdefault((int(M), int(cell[r]), part[i]), {})
                d[i] = d.get(i, 0.0) + 1.0
    book = {}
    if L:
        for i, p in zip(ids.tolist(), new_part.tolist()):
            book.setdefault((BOOK_LEVEL, int(p), int(p)), []).append(int(i))
    _apply(conn, t, touched, dh, book)


def _apply(conn, t: sql.Composable, touched: dict, dh: dict, book: dict) -> None:
    """Rows ``(0, 0, 0)``, ``touched`` (``(level, cell, part) -> {item: added count}``) and ``book``
    (``(-1, p, p) -> new items of part p``) with the new edges: ``h`` (the rows' ``chubs``) grows by
    ``dh``; the top-hubs row takes the new ``h`` of those items and keeps its first
    :data:`~pm_vector.shortlist.MAX_LOCATION_CANDIDATES` by (``h`` desc, id); a cell's row adds its
    counts, by id; a part's list adds its new items. Read and written as arrays
    (:mod:`pm_vector.db.runs.array_rows`)."""
    keys = [(0, 0, 0)] + list(touched) + list(book)
    wanted = set(keys)
    rows = array_rows.read(conn, t, KEYS, "(level, cell, part) IN (SELECT * FROM unnest(%s::integer[], "
                           "%s::integer[], %s::integer[]))", [[k[j] for k in keys] for j in range(3)], lock=True,
                           match=lambda r: r.key in wanted)
    have = {r.key for r in rows}
    rows += [array_rows.ArrayRow(k, np.zeros(0, np.int64), np.zeros(0), np.zeros(0)) for k in keys if k not in have]
    cnt = [r for r in rows if r.key[0] != BOOK_LEVEL]
    # h as the rows know it (a later row's value wins), plus the new edges
    all_ids = np.concatenate([r.item_ids for r in cnt] + [np.zeros(0, np.int64)])[::-1]
    all_h = np.concatenate([r.chubs for r in cnt] + [np.zeros(0)])[::-1]
    h_ids, first = np.unique(all_ids, return_index=True)
    dk = np.array(sorted(dh), dtype=np.int64)
    dv = np.array([float(dh[int(i)]) for i in dk])
    h_ids, inv = np.unique(np.concatenate([h_ids, dk]), return_inverse=True)
    h_val = np.bincount(inv, weights=np.concatenate([all_h[first], dv]), minlength=h_ids.size)
    for r in rows:
        if r.key[0] == BOOK_LEVEL:
            u = np.union1d(r.item_ids, np.asarray(book.get(r.key, []), np.int64))
            r.item_ids, r.hubs, r.chubs = u, np.zeros(u.size), np.zeros(u.size)
        elif r.key[0] == 0:  # the new edges' items take their new h
            u, inv = np.unique(np.concatenate([r.item_ids, dk]), return_inverse=True)
            cur = np.zeros(u.size)
            cur[inv[:r.item_ids.size]] = r.hubs
            cur[inv[r.item_ids.size:]] = h_val[np.searchsorted(h_ids, dk)]
            o = np.lexsort((u, -cur))[:MAX_LOCATION_CANDIDATES]
            r.item_ids, r.hubs = u[o], cur[o]
            r.chubs = _h_of(r.item_ids, h_ids, h_val)
    _add_counts([r for r in rows if r.key[0] > 0], touched, h_ids, h_val)
    array_rows.write(conn, t, KEY_KINDS, rows)


def _h_of(ids: np.ndarray, h_ids: np.ndarray, h_val: np.ndarray) -> np.ndarray:
    """``h`` of ``ids`` from the sorted ``h_ids``/``h_val`` (0 for an id not there)."""
    if not h_ids.size:
        return np.zeros(ids.size)
    p = np.clip(np.searchsorted(h_ids, ids), 0, h_ids.size - 1)
    return np.where(h_ids[p] == ids, h_val[p], 0.0)


def _add_counts(rows: list, touched: dict, h_ids: np.ndarray, h_val: np.ndarray) -> None:
    """Each cell row of ``rows`` (in place) adds its counts of ``touched`` by id (entries by id) and
    takes ``h`` of its items: every row at once (a batch touches thousands of parts)."""
    if not rows:
        return
    pos = {r.key: k for k, r in enumerate(rows)}
    sizes = np.array([r.item_ids.size for r in rows], np.int64)
    a_row = np.repeat(np.arange(len(rows)), sizes)
    a_id = np.concatenate([r.item_ids for r in rows] + [np.zeros(0, np.int64)])
    a_h = np.concatenate([r.hubs for r in rows] + [np.zeros(0)])
    keys = [k for k in touched if k in pos]
    row = np.concatenate([a_row, np.repeat(np.array([pos[k] for k in keys], np.int64),
                                           [len(touched[k]) for k in keys]).astype(np.int64)])
    ids = np.concatenate([a_id, np.fromiter((i for k in keys for i in touched[k]), np.int64)])
    h = np.concatenate([a_h, np.fromiter((v for k in keys for v in touched[k].values()), np.float64)])
    o = np.lexsort((ids, row))
    row, ids, h = row[o], ids[o], h[o]
    first = np.flatnonzero(np.r_[True, (row[1:] != row[:-1]) | (ids[1:] != ids[:-1])]) if row.size else row
    row, ids, h = row[first], ids[first], np.add.reduceat(h, first) if first.size else h
    ch = _h_of(ids, h_ids, h_val)
    bounds = np.searchsorted(row, np.arange(len(rows) + 1))
    for k, r in enumerate(rows):
        a, e = bounds[k], bounds[k + 1]
        r.item_ids, r.hubs, r.chubs = ids[a:e], h[a:e], ch[a:e]
