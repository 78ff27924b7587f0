"""The per-run data of the cell release (requests with ``release: "cells"``), built by the
embedding job beside the class rows (:mod:`pm_vector.db.runs.class_rows`).

For a run, :func:`build` computes in memory, from the run's public anchor set and the graph the
class rows already hold:

* the run's :class:`~pm_vector.manifold.public_cells.PublicCells`, fit on the public anchor set ONLY
  (stored as JSON in ``embedding_runs.public_cells`` and published with the class frames in the
  public anchor document; its digest and usable levels in ``embedding_runs.class_rows -> 'cells'``);
* every item's cell at every published level K: the nearest centroid of its class at K (squared L2
  on the stored features; :meth:`PublicCells.assign`);
* the cell release's graph: ``N(j)`` the ``graph_degree`` nearest other items of every item j by
  raw features, any class (:data:`pm_vector.shortlist.CELL_GRAPH_DEGREE`, 32: the job computes ONE
  graph and the class rows read its first 16 columns), and on it the class hub counts ``h_c(i)`` (row ``level 0`` of each
  class, items by ``h_c`` descending then id: the class's top hubs first);
* the **per-cell hub counts** ``h_{c,K,r}(i)`` = number of items j of class c with
  ``cell_K(j) = r`` and ``i`` in ``N(j)``, with ``h_c(i)`` beside them.

Sized for a million items: a row holds only the entries an answer with ``k' <=``
:data:`~pm_vector.protocol.bounds.MAX_K_PRIME` (1000, the largest a request may ask) can use
(:func:`useful_entries`: an item that 1000 others outrank for every weight is dropped; the
statement's answers are unchanged), and a class's level-0 row only its first 1000 hubs (all the
statement reads) when it has more, the whole counts then kept in a row ``(level -1, class, 0)``
that no request reads (for ``embed --new-items``). Rows of at most 1000 entries are whole, so the
tables of small collections are as before.

:func:`write` stores them in ``run_<id>_cells(level, label, cell, item_ids, hubs, chubs)`` (one row
per level, class and cell; binary COPY, committed: nothing points at the run before the job's
switch, and ``pm_vector.pm_drop_run_tables`` drops the table with the run, so a failed or killed
job leaves the previous run serving with its own cells). On a sharded run each shard holds the
rows of its classes (the class is the shard key, as for the prior and the hubs).

``embed --new-items`` (:func:`extend`, in the transaction that adds the items to the class rows)
gives each new item j of class c its neighbour list, puts it in its cell at every level, adds the
list to ``h_c`` and ``h_{c,K,cell(j)}``, and refreshes ``chubs``: the same approximation as the
class rows (the neighbour lists of existing items are not recomputed; a full job rebuilds
everything exactly). An item a row dropped (outranked by 1000 others) that a new item lists comes
back with the new count only: a second approximation of the same kind, on rows of over 1000 entries. A run without ready cells (built before them, or an anchor set that gives
none) refuses cell requests with a message that says to run a full embedding job; the Gaussian
class rows keep serving.

The statement that answers a request from these tables is ``pm_vector.pm_cell_shortlist_sql``
(``sql/0014_cell_statement.sql``, each row ranked on its own with a top-k' sort); it computes exactly
:meth:`pm_vector.shortlist.CellShortlist.shortlist` on the same graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from psycopg import sql
from psycopg.types.json import Json

from ...errors import InvalidInputError
from .. import _binary
from ..run_tables import create_foreign_table, drop_foreign_table, on_shard, run_table
from ...protocol.bounds import MAX_K_PRIME
from . import array_rows, cell_counts, run_cells
from .kinds import shard_columns
from ...manifold.public_cells import PublicCells
from ...neighbors import knn_search, neighbor_graph
from ...shortlist import CELL_GRAPH_DEGREE

#: the cells table's rows are few (classes x sum of levels): one COPY
_BATCH = 5_000


@dataclass
class CellsData:
    cells: Any  # PublicCells, fit on the public anchor set
    graph_degree: int  # neighbours per item of the cell release's graph
    levels: np.ndarray  # (R,) int: the rows' level K (0: the class's hub counts)
    labels: np.ndarray  # (R,) int64: the rows' class label
    cell: np.ndarray  # (R,) int: the rows' cell in [0, K) (0 on level 0)
    item_ids: list  # R arrays (int64): the items i with h_{c,K,r}(i) > 0, ascending (level 0: by h_c desc, id)
    hubs: list  # R arrays (float64): their h_{c,K,r}(i) (level 0: h_c(i))
    chubs: list  # R arrays (float64): their class hub counts h_c(i)

    def doc(self) -> dict[str, Any]:
        """What ``embedding_runs.class_rows -> 'cells'`` records (public)."""
        return {"status": "ready", "digest": self.cells.digest(), "levels": [int(k) for k in self.cells.levels_],
                "graph_degree": int(self.graph_degree)}


def unavailable(error: str) -> dict[str, Any]:
    return {"status": "unavailable", "error": str(error)[:2000]}


def build(anchor_X, anchor_y, item_X, item_y, item_ids, classes, *, neighbors: np.ndarray | None = None,
          graph_degree: int | None = None, cells: PublicCells | None = None) -> CellsData:
    """The run's cells and per-cell hub counts (module doc) on the cell release's graph: the
    ``graph_degree`` (:data:`pm_vector.shortlist.CELL_GRAPH_DEGREE`) nearest other items of every
    item by raw features (``neighbors``: that graph when the caller has it, positions). ``classes``:
    the class frames' classes (the cells have the same). Raises InvalidInputError when the anchor
    set gives no cells. ``cells``: the cells to publish again (:mod:`pm_vector.db.runs.published`)
    instead of fitting them."""
    if cells is None:
        cells = PublicCells().fit(np.asarray(anchor_X, dtype=np.float64), np.asarray(anchor_y))  # public data only
    if [int(c) for c in cells.classes_] != [int(c) for c in classes]:  # pragma: no cover - both fit on the anchor
        raise InvalidInputError("the public cells' classes differ from the class frames' classes.")
    X = np.asarray(item_X)
    y = np.asarray(item_y, dtype=np.int64)
    ids = np.asarray(item_ids, dtype=np.int64)
    N = ids.shape[0]
    g = min(int(graph_degree or CELL_GRAPH_DEGREE), N - 1)
    if neighbors is not None and neighbors.shape[1] >= g:  # the caller's graph: its first g columns
        nb = np.asarray(neighbors)[:, :g]
    else:
        nb = neighbor_graph(X, g)
    g = nb.shape[1]
    cls = [int(c) for c in cells.classes_]
    pos_of = {c: k for k, c in enumerate(cls)}
    cidx = np.array([pos_of.get(int(v), -1) for v in y], dtype=np.int64)
    src = np.flatnonzero(cidx >= 0)
    hub = [np.bincount(nb[cidx == k].ravel(), minlength=N).astype(np.float64) for k in range(len(cls))]
    levels, labels, cell_col, out_ids, out_h, out_ch = [], [], [], [], [], []

    def row(K, c, r, items, h, ch):
        levels.append(K)
        labels.append(c)
        cell_col.append(r)
        out_ids.append(ids[items])
        out_h.append(np.asarray(h, np.float64))
        out_ch.append(np.asarray(ch, np.float64))

    for k, c in enumerate(cls):  # level 0: the class hub counts, by (h_c desc, id): its top hubs come first
        nz = np.flatnonzero(hub[k])
        nz = nz[np.lexsort((nz, -hub[k][nz]))]
        if nz.size > MAX_K_PRIME:  # the statement reads the first k' only; the whole counts (for new items) at -1
            row(-1, c, 0, nz, hub[k][nz], hub[k][nz])
            nz = nz[:MAX_K_PRIME]
        row(0, c, 0, nz, hub[k][nz], hub[k][nz])
    for K in cells.levels_:
        K = int(K)
        cell_of = np.full(N, -1, np.int64)
        for s in range(0, src.size, 20_000):  # the features as stored, float64 for the distances
            part = src[s:s + 20_000]
            cell_of[part] = cells.assign(np.asarray(X[part], dtype=np.float64), cidx[part], K)
        # (class, cell, neighbour) of every edge j -> i of a class member j, counted
        key = (cidx[src] * K + cell_of[src])[:, None] * N + nb[src]
        u, cnt = np.unique(key.ravel(), return_counts=True)
        group, item = u // N, u % N
        bounds = np.searchsorted(group, np.arange(len(cls) * K + 1))
        ch = np.empty(item.size, np.float64)
        for k in range(len(cls)):
            a, b = bounds[k * K], bounds[(k + 1) * K]
            ch[a:b] = hub[k][item[a:b]]
        keep = useful_entries(group, item, cnt.astype(np.float64), ch, MAX_K_PRIME)
        kb = np.concatenate([[0], np.cumsum(keep)])[bounds]  # the kept entries' group bounds
        group, item, cnt, ch = group[keep], item[keep], cnt[keep], ch[keep]
        for k, c in enumerate(cls):
            for r in range(K):
                a, b = kb[k * K + r], kb[k * K + r + 1]
                row(K, c, r, item[a:b], cnt[a:b], ch[a:b])
    return CellsData(cells=cells, graph_degree=g, levels=np.asarray(levels, np.int32),
                     labels=np.asarray(labels, np.int64), cell=np.asarray(cell_col, np.int32), item_ids=out_ids,
                     hubs=out_h, chubs=out_ch)


def useful_entries(group: np.ndarray, item: np.ndarray, h: np.ndarray, hc: np.ndarray, k_max: int) -> np.ndarray:
    """Which entries of the cell rows an answer with ``k' <= k_max`` can use (bool mask; a superset).

    Entries ``(group, item, h = h_{c,K,r}(i), hc = h_c(i))``, sorted by group (a row) then item.
    Item ``j`` *dominates* ``i`` in a row when ``h_j >= h_i``, ``hc_j >= hc_i`` and (``hc_j > hc_i``
    or ``id_j < id_i``): for every weight ``w`` in (0, 2^20], ``hc_j + w h_j`` ranks before
    ``hc_i + w h_i`` by (score desc, id) in float64 (rounding is monotone, and a difference of 1 in
    the integer ``hc`` outweighs it at these magnitudes). An item with ``k_max`` dominators is
    never among a row's top ``k' <= k_max``, for any weight; it is dropped, and the answer of the
    statement is unchanged: a dropped item can only come back as a top hub or a fill item with
    ``h = 0``, below its true score, which already ranks after ``k'`` kept items.

    Per row, by (hc desc, id) an entry's dominators are the entries before it with ``h >= h_i``;
    it is kept when ``h_i`` exceeds the ``k_max``-th largest ``h`` of the entries before the
    block of ``k_max`` entries it lies in (a lower bound of its own threshold: a superset of the
    entries with fewer than ``k_max`` dominators). Rows of at most ``k_max`` entries are kept whole."""
    n = group.shape[0]
    keep = np.ones(n, bool)
    if n == 0:
        return keep
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    ends = np.r_[starts[1:], n]
    for a, b in zip(starts, ends):
        if b - a <= k_max:
            continue
        order = a + np.lexsort((item[a:b], -hc[a:b]))  # hc desc, then id
        hs = h[order]
        top = hs[:k_max].copy()  # the k_max largest h of the entries seen so far
        for s in range(k_max, b - a, k_max):
            blk = hs[s:s + k_max]
            keep[order[s:s + k_max]] = blk > top.min()
            top = np.partition(np.concatenate([top, blk]), blk.size)[blk.size:]
    return keep


def copy_cell_rows(conn, table: sql.Composable, data: CellsData, sel: np.ndarray, commit: bool = True,
                   frozen: bool = False) -> None:
    """COPY the rows ``sel`` of ``data`` into ``table``, each batch committed when ``commit``
    (``frozen``: :func:`pm_vector.db._binary.copy_options`, nothing committed)."""
    rows = np.flatnonzero(sel)
    for s in range(0, rows.size, _BATCH):
        part = rows[s:s + _BATCH]
        stream = _binary.encode_with_tail(
            [("level", "int4", 0), ("label", "int8", 0), ("cell", "int4", 0)],
            {"level": data.levels[part], "label": data.labels[part], "cell": data.cell[part]},
            [[_binary.binary_array(data.item_ids[i], "int8") for i in part],
             [_binary.binary_array(data.hubs[i], "float8") for i in part],
             [_binary.binary_array(data.chubs[i], "float8") for i in part]])
        _binary.copy_in(conn, sql.SQL("COPY {} (level, label, cell, item_ids, hubs, chubs) FROM STDIN {}").format(
            table, _binary.copy_options(frozen)), stream)
        if commit and not frozen:
            conn.commit()


def write(conn, run_id: int, data: CellsData, placement: Mapping[str, list] | None = None) -> None:
    """Create the run's cells table (on its shards when ``placement`` is given: each shard the rows
    of its classes) and COPY the rows in; the PublicCells document goes to
    ``embedding_runs.public_cells``. Each step committed (nothing points at the run yet); on one node
    the table is created and filled in one transaction, its rows frozen
    (:func:`pm_vector.db._binary.copy_options`)."""
    rid = int(run_id)
    conn.execute("UPDATE pm_vector.embedding_runs SET public_cells = %s WHERE id = %s",
                 [Json(data.cells.to_dict()), rid])
    conn.commit()
    if not placement:
        conn.execute("SELECT pm_vector.pm_create_cells_table(%s)", [rid])
        t = run_table(rid, "cells")
        array_rows.store_uncompressed(conn, t)
        copy_cell_rows(conn, t, data, np.ones(data.labels.shape[0], bool), False, frozen=True)
        conn.execute(sql.SQL("ANALYZE {}").format(t))
        conn.commit()
        return
    classes = [int(c) for c in data.cells.classes_]
    ddl = conn.execute("SELECT pm_vector.pm_cells_table_ddl(%s)", [rid]).fetchone()[0]
    for s, ks in placement.items():
        conn.execute("SELECT pm_vector.pm_shard_exec(%s, %s)",  # (the DDL: pm_cells_table_ddl's, from parts)
                     [s, on_shard(conn, [sql.SQL("DROP TABLE IF EXISTS {}").format(run_table(rid, "cells")), sql.SQL(ddl)])])
        ft = create_foreign_table(conn, rid, "cells", s, shard_columns("cells"), 500)
        conn.commit()
        copy_cell_rows(conn, ft, data, np.isin(data.labels, [classes[int(k)] for k in ks]))
        drop_foreign_table(conn, rid, "cells", s)
        conn.execute("SELECT pm_vector.pm_shard_exec(%s, %s)",
                     [s, on_shard(conn, [sql.SQL("ANALYZE {}").format(run_table(rid, "cells"))])])
        conn.commit()


def extend(conn, run_id: int, doc: Mapping[str, Any], all_ids, all_X, new_ids, new_X, new_y, *,
           near: np.ndarray | None = None) -> None:
    """Add new items (of the cells' classes) to the run's cell release, inside the caller's
    transaction: each new item's ``graph_degree`` nearest other items (against every item of the
    run, new ones included: ``all_ids``/``all_X``, ascending ids) are added to its class's hub
    counts (level 0) and to its cell's at every level, and ``chubs`` follows the class hub counts.
    The neighbour lists of existing items are not recomputed (as for the class rows). ``near``: the
    new items' nearest positions in ``all_X`` (nearest first, at least ``graph_degree`` + 1 columns)
    when the caller searched them already."""
    rid = int(run_id)
    cells = run_cells.get(conn, rid, {"cells": doc}, "cells")
    keep = np.isin(np.asarray(new_y), cells.classes_)
    all_ids = np.asarray(all_ids, dtype=np.int64)
    y = np.asarray(new_y, dtype=np.int64)[keep]
    ids = np.asarray(new_ids, dtype=np.int64)[keep]
    X = np.asarray(new_X, dtype=np.float64)[keep]
    g = min(int(doc.get("graph_degree") or 0), all_ids.shape[0] - 1)
    if ids.size == 0 or g < 1:
        return
    found = all_ids[(near[keep] if near is not None else knn_search(X, all_X, g + 1))[:, :g + 1]]
    nb = np.empty((ids.size, g), np.int64)
    for r in range(ids.size):  # drop the item itself, keep g others
        nb[r] = found[r][found[r] != ids[r]][:g]
    # each new edge j -> i adds 1 to h_c(i) (level 0, and the whole counts at -1 where the class keeps
    # them) and to h_{c,K,cell_K(j)}(i) at every level; only the rows that change are rewritten
    ci = cells.class_index(y)
    delta: dict[tuple, float] = {}
    cell_at = {int(K): cells.assign(X, ci, int(K)) for K in cells.levels_}
    for r in range(ids.size):
        c = int(y[r])
        for i in nb[r].tolist():
            delta[(0, c, 0, i)] = delta.get((0, c, 0, i), 0.0) + 1.0
            for K, cell in cell_at.items():
                key = (K, c, int(cell[r]), i)
                delta[key] = delta.get(key, 0.0) + 1.0
    cell_counts.apply(conn, run_table(rid, "cells"), delta, (), MAX_K_PRIME)
