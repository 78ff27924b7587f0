"""The per-run data of the cell release (requests with ``release: "cells"``), built by the
embedding job beside the class rows (:mod:`pm_vector.db.class_rows`).

For a run, :func:`build` computes in memory, from the run's public anchor set and the graph the
class rows already hold:

* the run's :class:`~pm_vector.manifold.cells.PublicCells`, fit on the public anchor set ONLY
  (stored as JSON in ``embedding_runs.public_cells`` and published with the class frames in the
  public anchor document; its digest and usable levels in ``embedding_runs.class_rows -> 'cells'``);
* every item's cell at every published level K: the nearest centroid of its class at K (squared L2
  on the stored features; :meth:`PublicCells.assign`);
* the **per-cell hub counts** ``h_{c,K,r}(i)`` = number of items j of class c with
  ``cell_K(j) = r`` and ``i`` in ``N(j)`` (N(j): the run's graph, the ``graph_degree`` nearest other
  items of j by raw features, any class), with the class hub counts ``h_c(i)`` beside them.

:func:`write` stores them in ``run_<id>_cells(level, label, cell, item_ids, hubs, chubs)`` (one row
per level, class and cell; binary COPY, committed: nothing points at the run before the job's
switch, and ``pm_vector.pm_drop_run_tables`` drops the table with the run, so a failed or killed
job leaves the previous run serving with its own cells). On a sharded run each shard holds the
rows of its classes (the class is the shard key, as for the prior and the hubs).

``embed --new-items`` (:func:`extend`, in the transaction that adds the items to the class rows)
puts each new item j of class c in its cell at every level and adds its neighbour list to
``h_{c,K,cell(j)}``, and refreshes ``chubs`` from the updated class hub counts: the cells' counts
are those of the run's graph after the addition (the same approximation as the class rows: the
neighbour lists of existing items are not recomputed; a full job rebuilds everything exactly).
A run whose cells cannot be extended (no neighbour lists) has them marked ``stale``
(:func:`mark_stale`): cell requests are then refused with a message that says to run a full
embedding job, and the Gaussian class rows keep serving.

The statement that answers a request from these tables is ``pm_vector.pm_cell_shortlist_sql``
(``sql/0013_cells.sql``); it computes exactly
:meth:`pm_vector.shortlist.CellShortlist.shortlist` on the same graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import InvalidInputError
from . import _binary

#: the cells table's rows are few (classes x sum of levels): one COPY
_BATCH = 5_000


@dataclass
class CellsData:
    cells: Any  # PublicCells, fit on the public anchor set
    levels: np.ndarray  # (R,) int: the rows' level K
    labels: np.ndarray  # (R,) int64: the rows' class label
    cell: np.ndarray  # (R,) int: the rows' cell in [0, K)
    item_ids: list  # R arrays (int64, ascending): the items i with h_{c,K,r}(i) > 0
    hubs: list  # R arrays (float64): their h_{c,K,r}(i)
    chubs: list  # R arrays (float64): their class hub counts h_c(i)

    def doc(self) -> dict[str, Any]:
        """What ``embedding_runs.class_rows -> 'cells'`` records (public)."""
        return {"status": "ready", "digest": self.cells.digest(), "levels": [int(k) for k in self.cells.levels_]}


def unavailable(error: str) -> dict[str, Any]:
    return {"status": "unavailable", "error": str(error)[:2000]}


def build(anchor_X, anchor_y, item_X, item_y, item_ids, neighbors: np.ndarray, class_hubs: Mapping[int, np.ndarray],
          classes) -> CellsData:
    """The run's cells and per-cell hub counts (module doc). ``neighbors``: ``(N, g)`` positions of
    each item's neighbours (the run's graph, :attr:`PosteriorShortlist.neighbors_`);
    ``class_hubs[c]``: ``(N,)`` class hub counts ``h_c``; ``classes``: the class frames' classes
    (the cells must have the same). Raises InvalidInputError when the anchor set gives no cells."""
    from ..manifold.cells import PublicCells

    cells = PublicCells().fit(np.asarray(anchor_X, dtype=np.float64), np.asarray(anchor_y))  # public data only
    if [int(c) for c in cells.classes_] != [int(c) for c in classes]:  # pragma: no cover - both fit on the anchor
        raise InvalidInputError("the public cells' classes differ from the class frames' classes.")
    if len(cells.levels_) == 0:
        raise InvalidInputError("the public anchor set gives no cell level (its smallest class has fewer anchor rows "
                                "than the smallest level).")
    X = np.asarray(item_X)
    y = np.asarray(item_y, dtype=np.int64)
    ids = np.asarray(item_ids, dtype=np.int64)
    N, g = neighbors.shape
    cls = [int(c) for c in cells.classes_]
    pos_of = {c: k for k, c in enumerate(cls)}
    cidx = np.array([pos_of.get(int(v), -1) for v in y], dtype=np.int64)
    member = cidx >= 0
    src = np.flatnonzero(member)
    levels, labels, cell_col, out_ids, out_h, out_ch = [], [], [], [], [], []
    for K in cells.levels_:
        K = int(K)
        cell_of = np.full(N, -1, np.int64)
        for k in range(len(cls)):
            rows = np.flatnonzero(cidx == k)
            if rows.size:
                for s in range(0, rows.size, 20_000):  # the features as stored, float64 for the distances
                    part = rows[s:s + 20_000]
                    cell_of[part] = cells.assign(np.asarray(X[part], dtype=np.float64), k, K)
        # (class, cell, neighbour) of every edge j -> i of a class member j, counted
        key = (cidx[src] * K + cell_of[src])[:, None] * N + neighbors[src]
        u, cnt = np.unique(key.ravel(), return_counts=True) if g else (np.zeros(0, np.int64), np.zeros(0, np.int64))
        group, item = u // N, u % N
        bounds = np.searchsorted(group, np.arange(len(cls) * K + 1))
        for k, c in enumerate(cls):
            hub_c = np.asarray(class_hubs[c], dtype=np.float64)
            for r in range(K):
                a, b = bounds[k * K + r], bounds[k * K + r + 1]
                levels.append(K)
                labels.append(c)
                cell_col.append(r)
                out_ids.append(ids[item[a:b]])
                out_h.append(cnt[a:b].astype(np.float64))
                out_ch.append(hub_c[item[a:b]])
    return CellsData(cells=cells, levels=np.asarray(levels, np.int32), labels=np.asarray(labels, np.int64),
                     cell=np.asarray(cell_col, np.int32), item_ids=out_ids, hubs=out_h, chubs=out_ch)


def _array(values: np.ndarray, kind: str) -> bytes:
    """A 1-d ``bigint[]`` ("int8") or ``float8[]`` ("float8") value in binary COPY form."""
    oid, fmt = {"int8": (20, ">i8"), "float8": (701, ">f8")}[kind]
    n = int(values.size)
    if n == 0:
        return (0).to_bytes(4, "big") + (0).to_bytes(4, "big") + oid.to_bytes(4, "big")
    body = np.empty(n, dtype=[("l", ">i4"), ("v", fmt)])
    body["l"] = 8
    body["v"] = values
    return np.array([1, 0, oid, n, 1], dtype=">i4").tobytes() + body.tobytes()


def _copy(conn, table: str, data: CellsData, sel: np.ndarray, commit: bool = True) -> None:
    rows = np.flatnonzero(sel)
    for s in range(0, rows.size, _BATCH):
        part = rows[s:s + _BATCH]
        stream = _binary.encode_with_tail(
            [("level", "int4", 0), ("label", "int8", 0), ("cell", "int4", 0)],
            {"level": data.levels[part], "label": data.labels[part], "cell": data.cell[part]},
            [[_array(data.item_ids[i], "int8") for i in part], [_array(data.hubs[i], "float8") for i in part],
             [_array(data.chubs[i], "float8") for i in part]])
        _binary.copy_in(conn, f"COPY {table} (level, label, cell, item_ids, hubs, chubs) FROM STDIN (FORMAT BINARY)",
                        stream)
        if commit:
            conn.commit()


def write(conn, run_id: int, data: CellsData, placement: Mapping[str, list] | None = None) -> None:
    """Create the run's cells table (on its shards when ``placement`` is given: each shard the rows
    of its classes) and COPY the rows in; the PublicCells document goes to
    ``embedding_runs.public_cells``. Each step committed (nothing points at the run yet)."""
    from psycopg.types.json import Json

    rid = int(run_id)
    conn.execute("UPDATE pm_vector.embedding_runs SET public_cells = %s WHERE id = %s", [Json(data.cells.to_dict()), rid])
    conn.commit()
    if not placement:
        conn.execute("SELECT pm_vector.pm_create_cells_table(%s)", [rid])
        conn.commit()
        _copy(conn, f"pm_vector.run_{rid}_cells", data, np.ones(data.labels.shape[0], bool))
        conn.execute(f"ANALYZE pm_vector.run_{rid}_cells")
        conn.commit()
        return
    classes = [int(c) for c in data.cells.classes_]
    ddl = conn.execute("SELECT pm_vector.pm_cells_table_ddl(%s)", [rid]).fetchone()[0]
    for s, ks in placement.items():
        conn.execute("SELECT pm_vector.pm_shard_exec(%s, %s)", [s, f"DROP TABLE IF EXISTS pm_vector.run_{rid}_cells; {ddl}"])
        ft = f'pm_vector."run_{rid}_cells_at_{s}"'
        conn.execute(f"DROP FOREIGN TABLE IF EXISTS {ft}")
        conn.execute(f"CREATE FOREIGN TABLE {ft} (level integer, label bigint, cell integer, item_ids bigint[], "
                     f"hubs float8[], chubs float8[]) SERVER \"pm_shard_{s}\" "
                     f"OPTIONS (schema_name 'pm_vector', table_name 'run_{rid}_cells', batch_size '500')")
        conn.commit()
        _copy(conn, ft, data, np.isin(data.labels, [classes[int(k)] for k in ks]))
        conn.execute(f"DROP FOREIGN TABLE IF EXISTS {ft}")
        conn.execute("SELECT pm_vector.pm_shard_exec(%s, %s)", [s, f"ANALYZE pm_vector.run_{rid}_cells"])
        conn.commit()


def extend(conn, run_id: int, new_ids, new_X, new_y, nbr_ids: np.ndarray) -> None:
    """Add new items (of the cells' classes) to the run's per-cell hub counts, inside the caller's
    transaction, after the class hub counts were updated (their changes in the temp table
    ``pm_new_hubs``): ``nbr_ids`` ``(n, g)`` the new items' neighbour lists (item ids)."""
    from ..manifold.cells import PublicCells

    rid = int(run_id)
    doc = conn.execute("SELECT public_cells FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    cells = PublicCells.from_dict(doc)
    y = np.asarray(new_y, dtype=np.int64)
    X = np.asarray(new_X, dtype=np.float64)
    nb = np.asarray(nbr_ids, dtype=np.int64)
    ci = cells.class_index(y)
    g = nb.shape[1]
    lv, lab, cel, item = [], [], [], []
    for K in cells.levels_:
        cell = cells.assign(X, ci, int(K))
        lv.append(np.full(y.size * g, int(K), np.int64))
        lab.append(np.repeat(y, g))
        cel.append(np.repeat(cell, g))
        item.append(nb.ravel())
    conn.execute("CREATE TEMP TABLE pm_new_cells (level integer, label bigint, cell integer, item_id bigint) "
                 "ON COMMIT DROP")
    cat = np.concatenate
    _binary.copy_in(conn, "COPY pm_new_cells (level, label, cell, item_id) FROM STDIN (FORMAT BINARY)",
                    _binary.encode([("level", "int4", 0), ("label", "int8", 0), ("cell", "int4", 0),
                                    ("item_id", "int8", 0)],
                                   {"level": cat(lv), "label": cat(lab), "cell": cat(cel), "item_id": cat(item)}))
    t = f"pm_vector.run_{rid}_"
    # each touched cell row: its counts plus the new edges, items ascending (as the job writes them)
    conn.execute(
        f"UPDATE {t}cells AS c SET (item_ids, hubs) = (SELECT coalesce(array_agg(m.id ORDER BY m.id), '{{}}'), "
        "coalesce(array_agg(m.h ORDER BY m.id), '{}') FROM (SELECT u.id, sum(u.h) AS h FROM ("
        "  SELECT x.id, x.h FROM unnest(c.item_ids, c.hubs) AS x(id, h) "
        "  UNION ALL SELECT n.item_id, 1::float8 FROM pm_new_cells AS n "
        "  WHERE n.level = c.level AND n.label = c.label AND n.cell = c.cell) AS u GROUP BY u.id) AS m) "
        "WHERE (c.level, c.label, c.cell) IN (SELECT DISTINCT level, label, cell FROM pm_new_cells)")
    # every cell row of a class whose hub counts changed: chubs again from the class hub counts
    conn.execute(
        f"UPDATE {t}cells AS c SET chubs = ARRAY(SELECT coalesce(h.hub, 0) FROM unnest(c.item_ids) WITH ORDINALITY "
        f"AS u(id, k) LEFT JOIN {t}hubs AS h ON h.label = c.label AND h.item_id = u.id ORDER BY u.k) "
        "WHERE c.label IN (SELECT DISTINCT label FROM pm_new_hubs)")


def mark_stale(doc: Mapping[str, Any], n_new: int) -> dict[str, Any]:
    """The ``class_rows`` document after ``n_new`` items were added without recomputing the cells'
    counts: cell requests are refused until a full embedding job (the Gaussian class rows serve)."""
    out = dict(doc)
    cells = dict(out.get("cells") or {})
    if cells.get("status") == "ready" or cells.get("status") == "stale":
        cells["status"] = "stale"
        cells["error"] = (f"{int(n_new) + int(cells.get('n_new_items', 0))} item(s) were added (embed --new-items) "
                          "after the embedding job computed the cells' hub counts; run a full embedding job "
                          "(pm-vector embed COLLECTION) to serve the cell release again")
        cells["n_new_items"] = int(n_new) + int(cells.get("n_new_items", 0))
        out["cells"] = cells
    return out
