"""``pm-vector bench writes --reuse``: the prepared collection (and plain pgvector's table) kept
between runs whose flags match, so that a run at 100,000 items does not pay the embedding job again.

The data is a function of ``--items``, ``--dim`` and ``--seed`` alone (the items, then
:data:`NEW_ROWS` rows the streams' new vectors come from, in turn), and the kept objects are
named by those flags, ``--anchors`` and ``--path`` (:func:`tag`). A run that finds them reads
their state instead of building them (:func:`state`): the keys there now, the next new key, and
the initial items whose vector is still the one set up (only those are the victims of a stream's
checked changes: a check knows their old vector), and every key (its other updates and deletes hit
any of them). Every run ends with the merge of its delta
(:meth:`~pm_vector.bench.writes_targets.PmVectorTarget.engine_figures`), so the next one starts on
an empty delta; plain pgvector's kept table is brought to the attached table's rows before its
streams (:func:`align_pgvector`). Only the attached path keeps a collection (its rows are the
user's table, which both systems then start from).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psycopg import sql

from ..db import _binary

#: the data rows after the items that the streams' new vectors are taken from (in turn)
NEW_ROWS = 50_000


def tag(cfg) -> str:
    """The name part of the kept collection and tables of a configuration (the flags that make them)."""
    return f"reuse_{cfg.path}_{int(cfg.items)}x{int(cfg.dim)}_a{int(cfg.anchors)}_s{int(cfg.seed)}"


def prepared(conn, name: str) -> bool:
    """Whether collection ``name`` exists with an active run (a set-up that finished)."""
    row = conn.execute("SELECT active_run_id FROM pm_vector.collections WHERE name = %s", [name]).fetchone()
    return row is not None and row[0] is not None


def state(conn, table: sql.Composable, X: np.ndarray, items: int) -> dict[str, Any]:
    """The attached ``table``'s state: ``{"keys" (how many rows), "next_key" (after the largest),
    "untouched" (the initial keys below ``items`` whose vector is still ``X[key - 1]``, ascending),
    "live" (every key there but the warm-up's, ascending: what an unchecked update or delete may hit)}``.
    The rows by binary COPY (a text read of 100,000 vectors of 128 took 18 s on the loaded machine)."""
    n = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()[0]
    got = _binary.copy_out_columns(conn, sql.SQL("SELECT id, embedding FROM {} ORDER BY id").format(table),
                                   [("id", "int8", 0), ("embedding", "vector", X.shape[1])], int(n))
    conn.rollback()
    ids = np.asarray(got.get("id", np.zeros(0)), np.int64)
    keep = (ids >= 1) & (ids < items)  # (key ``items`` is the warm-up's: never a victim)
    if keep.any():
        same = np.abs(got["embedding"][keep] - X[ids[keep] - 1]).max(1) < 1e-5
        untouched = ids[keep][same]
    else:
        untouched = np.zeros(0, np.int64)
    return {"keys": int(ids.size), "next_key": int(max(int(ids.max(initial=0)), items) + 1),
            "untouched": untouched.tolist(), "live": ids[ids != items].tolist()}


def fresh(items: int) -> dict[str, Any]:
    """The state of a table just built from the first ``items`` rows (:func:`state`, without reading it)."""
    return {"keys": int(items), "next_key": int(items) + 1, "untouched": list(range(1, int(items))),
            "live": list(range(1, int(items)))}


def align_pgvector(conn, pgv: sql.Composable, att: sql.Composable) -> dict[str, int]:
    """Plain pgvector's kept table ``pgv`` given the rows of the attached table ``att`` (keys gone
    deleted, new keys inserted, changed vectors updated; its HNSW index follows). Returns the counts."""
    gone = conn.execute(sql.SQL("DELETE FROM {p} AS p WHERE NOT EXISTS (SELECT 1 FROM {a} AS a WHERE a.id = p.id)")
                        .format(p=pgv, a=att)).rowcount
    put = conn.execute(sql.SQL("INSERT INTO {p} AS p (id, v) SELECT a.id, a.embedding FROM {a} AS a "
                               "ON CONFLICT (id) DO UPDATE SET v = excluded.v WHERE p.v <> excluded.v")
                       .format(p=pgv, a=att)).rowcount
    return {"deleted": int(gone), "written": int(put)}
