"""Binary COPY of a class-rows run's tables: the prior, the neighbour pairs, the hub counts.

A leaf below :mod:`pm_vector.db.runs.class_rows` (a single node's run) and
:mod:`pm_vector.db.runs.sharding` (the same rows written to each shard through foreign tables): both
write the same row layouts, so the writers live here once. Each function streams ``batch`` rows
per ``COPY ... FROM STDIN (FORMAT BINARY)`` (:mod:`pm_vector.db._binary`), committing after each
batch when ``commit`` is true; with ``frozen`` the rows are written frozen and nothing is committed
(:func:`pm_vector.db._binary.copy_options`: a table the caller's transaction created).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from psycopg import sql

from .. import _binary
from ..run_tables import run_table


def _arrays(a: np.ndarray, kind: str) -> list[bytes]:
    """Binary COPY values of the rows of ``a`` (n, g) as 1-d ``bigint[]`` (kind "int8") or
    ``float8[]`` ("float8"); numpy-built, empty arrays when g = 0."""
    n, g = a.shape
    oid, fmt = {"int8": (20, ">i8"), "float8": (701, ">f8")}[kind]
    if g == 0:
        return [(0).to_bytes(4, "big") + (0).to_bytes(4, "big") + oid.to_bytes(4, "big")] * n
    dt = np.dtype([("hdr", ">i4", (5,)), ("e", [("l", ">i4"), ("v", fmt)], (g,))])
    rows = np.empty(n, dt)
    rows["hdr"] = (1, 0, oid, g, 1)  # ndim, no NULLs, element type, length, lower bound
    rows["e"]["l"] = 8
    rows["e"]["v"] = a
    buf = rows.tobytes()
    w = dt.itemsize
    return [buf[i * w:(i + 1) * w] for i in range(n)]


def copy_prior(conn, run_id: int, ids, labels, coords, batch: int, commit: bool,
                progress: Callable[[int, int], None] | None = None, nbrs: np.ndarray | None = None,
                nhub: np.ndarray | None = None, table: sql.Composable | None = None, frozen: bool = False) -> None:
    """COPY prior rows; ``nbrs``/``nhub`` (n, g): their neighbour lists and those neighbours' hub
    counts in the row's class, for runs whose prior has the columns (migration 0009: the shortlist
    reads them with the prior row instead of joining the graph and the hubs). ``table``: another
    target with the prior's columns (a shard's, through a foreign table)."""
    d = coords.shape[1]
    table = table or run_table(run_id, "prior")
    n = ids.shape[0]
    cols = "item_id, label, coords, coords8" + (", nbrs, nhub" if nbrs is not None else "")
    for s in range(0, n, batch):
        e = min(n, s + batch)
        fixed = [("item_id", "int8", 0), ("label", "int8", 0), ("coords", "vector", d), ("coords8", "float8[]", d)]
        data = {"item_id": ids[s:e], "label": labels[s:e], "coords": coords[s:e], "coords8": coords[s:e]}
        stream = (_binary.encode(fixed, data) if nbrs is None else
                  _binary.encode_with_tail(fixed, data, [_arrays(np.asarray(nbrs[s:e], dtype=np.int64), "int8"),
                                                         _arrays(np.asarray(nhub[s:e], dtype=np.float64), "float8")]))
        _binary.copy_in(conn, sql.SQL("COPY {} ({}) FROM STDIN {}").format(table, sql.SQL(cols),
                                                                          _binary.copy_options(frozen)), stream)
        if commit and not frozen:
            conn.commit()
        if progress is not None:
            progress(e, n)


def copy_pairs(conn, table: sql.Composable, cols: tuple[str, str], a, b, batch: int, commit: bool,
               frozen: bool = False) -> None:
    """COPY ``(a[i], b[i])`` into the two ``bigint`` columns ``cols`` of ``table`` (a run's
    neighbour pairs), ``batch`` rows a statement, committing after each when ``commit``."""
    n = a.shape[0]
    for s in range(0, n, batch):
        e = min(n, s + batch)
        stream = _binary.encode([(cols[0], "int8", 0), (cols[1], "int8", 0)], {cols[0]: a[s:e], cols[1]: b[s:e]})
        _binary.copy_in(conn, sql.SQL("COPY {} ({}, {}) FROM STDIN {}").format(
            table, sql.Identifier(cols[0]), sql.Identifier(cols[1]), _binary.copy_options(frozen)), stream)
        if commit and not frozen:
            conn.commit()


def copy_hubs(conn, table: sql.Composable, labels, ids, counts, batch: int, commit: bool, frozen: bool = False) -> None:
    """COPY ``(label, item_id, hub)`` rows (a run's hub counts per class) into ``table``,
    ``batch`` rows a statement, committing after each when ``commit``."""
    n = labels.shape[0]
    for s in range(0, n, batch):
        e = min(n, s + batch)
        stream = _binary.encode([("label", "int8", 0), ("item_id", "int8", 0), ("hub", "float8", 0)],
                                {"label": labels[s:e], "item_id": ids[s:e], "hub": counts[s:e]})
        _binary.copy_in(conn, sql.SQL("COPY {} (label, item_id, hub) FROM STDIN {}").format(
            table, _binary.copy_options(frozen)), stream)
        if commit and not frozen:
            conn.commit()
