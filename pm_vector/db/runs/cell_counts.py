"""A change of the cell release's hub counts applied to ``run_<id>_cells`` (:mod:`pm_vector.db.runs.cell_data`):
what an erasure (:mod:`pm_vector.db.runs.erase`) and ``embed --new-items`` (:func:`pm_vector.db.runs.cell_data.extend`)
both do to the rows, in the caller's transaction.

:func:`apply` takes the counts' changes ``(level, label, cell, item id) -> change`` (level 0: the class
count ``h_c``, which also changes the class's whole counts at level -1 when it keeps them) and the
items that leave; it reads only the rows that change (those the changes name, those listing an
erased item or an item whose class count changed, and every class's level -1 and 0 rows) as numpy
arrays (:mod:`pm_vector.db.runs.array_rows`) and writes only those back:

* each named row's counts change by the given amounts; an item whose count reaches 0, and every
  erased item, leaves every row;
* a class's level-0 row is cut again from its whole counts (level -1, by ``h_c`` descending then
  id, the first ``max_k``: :data:`~pm_vector.protocol.bounds.MAX_K_PRIME`) when the class keeps them;
* ``chubs`` of every row written follow the class's counts (level -1, else level 0); a row of level
  0 or -1 is ordered by (count descending, id), a cell's row by id.

A change naming a row that does not exist (a cell that held no entry) is left out, as before.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
from psycopg import sql

from . import array_rows

KEYS = (("level", "int4"), ("label", "int8"), ("cell", "int4"))


def _by_row(delta: Mapping[tuple, float]) -> tuple[dict, dict]:
    """The changes grouped by row ``(level, label, cell) -> (item ids, changes)`` (level-0 changes also
    at level -1), and per class the items whose class count changed."""
    rows: dict[tuple, tuple[list, list]] = {}
    moved: dict[int, set] = {}
    for (level, label, cell, item), dv in delta.items():
        keys = [(int(level), int(label), int(cell))]
        if int(level) == 0:
            keys.append((-1, int(label), 0))
            moved.setdefault(int(label), set()).add(int(item))
        for key in keys:
            ids, vals = rows.setdefault(key, ([], []))
            ids.append(int(item))
            vals.append(float(dv))
    return ({k: (np.asarray(i, np.int64), np.asarray(v, np.float64)) for k, (i, v) in rows.items()},
            {c: np.asarray(sorted(s), np.int64) for c, s in moved.items()})


#: :func:`_read` testing more ids than this with ``&&`` reads every row instead: ``&&`` compares each
#: entry with every id (at 100,000 items, the rows listing one of 200 ids took 0.69 s, every row 0.44 s;
#: 45 ids cost about what every row does). Extra rows read are not written: :func:`apply` writes the
#: rows it changes.
_FEW = 40


def _read(conn, table: sql.Composable, by_row: dict, moved: dict, erased: np.ndarray) -> dict[tuple, array_rows.ArrayRow]:
    if erased.size + sum(v.size for v in moved.values()) > _FEW:  # every row (held ones included)
        return {r.key: r for r in array_rows.read(conn, table, tuple(k for k, _ in KEYS), "true",
                                                  match=lambda r: True)}
    where = ["level <= 0", "item_ids && %s::bigint[]"]
    params: list = [erased.tolist()]
    if by_row:
        k = np.array(sorted(by_row), dtype=np.int64).reshape(-1, 3)
        where.append("(level, label, cell) IN (SELECT * FROM unnest(%s::int[], %s::bigint[], %s::int[]))")
        params += [k[:, 0].tolist(), k[:, 1].tolist(), k[:, 2].tolist()]
    for c, items in sorted(moved.items()):
        where.append("(label = %s AND item_ids && %s::bigint[])")
        params += [int(c), items.tolist()]

    def match(r: array_rows.ArrayRow) -> bool:  # the same condition, on a row held in memory
        c = r.key[1]
        return (r.key[0] <= 0 or r.key in by_row or bool(array_rows.member(r.item_ids, erased).any())
                or (c in moved and bool(array_rows.member(r.item_ids, moved[c]).any())))

    return {r.key: r for r in array_rows.read(conn, table, tuple(k for k, _ in KEYS), " OR ".join(where), params,
                                              match=match)}


def _order(level: int, ids: np.ndarray, hubs: np.ndarray) -> np.ndarray:
    return np.lexsort((ids, -hubs)) if level <= 0 else np.argsort(ids, kind="stable")


def apply(conn, table: sql.Composable, delta: Mapping[tuple, float], erased, max_k: int) -> None:
    """Apply the counts' changes ``delta`` and the erasure of ``erased`` to the cells table ``table``
    (module doc); ``max_k``: the entries a level-0 row keeps when its class keeps level -1."""
    erased = np.unique(np.asarray(list(erased), dtype=np.int64))
    by_row, moved = _by_row(delta)
    if not by_row and not erased.size:
        return
    rows = _read(conn, table, by_row, moved, erased)
    touched: set = set()
    for key, (ids, vals) in by_row.items():
        r = rows.get(key)
        if r is None:
            continue
        u, inv = np.unique(np.concatenate([r.item_ids, ids]), return_inverse=True)
        r.item_ids, r.hubs = u, np.bincount(inv, weights=np.concatenate([r.hubs, vals]), minlength=u.size)
        r.chubs = np.zeros(u.size)
        touched.add(key)
    for key, r in rows.items():
        keep = (r.hubs > 0) & ~array_rows.member(r.item_ids, erased)
        if not keep.all():
            r.item_ids, r.hubs, r.chubs = r.item_ids[keep], r.hubs[keep], r.chubs[keep]
            touched.add(key)
    for c in {k[1] for k in touched}:  # level 0: the first max_k of the whole counts when the class keeps them
        whole = rows.get((-1, c, 0))
        if whole is not None:
            o = _order(0, whole.item_ids, whole.hubs)[:max_k]
            rows[(0, c, 0)] = array_rows.ArrayRow((0, c, 0), whole.item_ids[o], whole.hubs[o], whole.hubs[o])
            touched.add((0, c, 0))
    for key, r in rows.items():  # a row listing an item whose class count changed: its chubs follow
        if key not in touched and key[1] in moved and array_rows.member(r.item_ids, moved[key[1]]).any():
            touched.add(key)
    out = []
    counts: dict[int, tuple] = {}
    for key in sorted(touched):
        r = rows[key]
        if key[1] not in counts:
            counts[key[1]] = _class_counts(rows, key[1])
        o = _order(key[0], r.item_ids, r.hubs)
        r.item_ids, r.hubs = r.item_ids[o], r.hubs[o]
        r.chubs = _lookup(counts[key[1]], r.item_ids)
        out.append(r)
    array_rows.write(conn, table, KEYS, out)


def _class_counts(rows: dict, c: int) -> tuple[np.ndarray, np.ndarray]:
    """Class ``c``'s counts (its level -1 row, else level 0) as (ids ascending, counts)."""
    cc = rows.get((-1, c, 0))
    if cc is None or not cc.item_ids.size:
        cc = rows.get((0, c, 0))
    if cc is None:
        return np.zeros(0, np.int64), np.zeros(0)
    o = np.argsort(cc.item_ids, kind="stable")
    return cc.item_ids[o], cc.hubs[o]


def _lookup(counts: tuple[np.ndarray, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """The class counts of ``ids`` (0 for an item the class row does not list)."""
    s, h = counts
    if not s.size:
        return np.zeros(ids.size)
    p = np.clip(np.searchsorted(s, ids), 0, s.size - 1)
    return np.where(s[p] == ids, h[p], 0.0)
