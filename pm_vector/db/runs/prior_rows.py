"""How the class rows' prior keeps up with the graph's changes cheaply (an erasure, new items: a sync
batch of an attached table changes the hub counts of thousands of items at 100,000 items, and each
prior row carries its neighbours' counts, ``nhub``):

* :func:`reverse_index`: the graph's pairs by neighbour, so that the rows whose list holds a changed
  item are found by index (:func:`listing`) instead of by reading every list;
* :data:`PRIOR_FILLFACTOR`: room on the prior's pages, so that updating ``nhub`` / ``nbrs`` is a HOT
  update (the row stays on its page, the frame coordinates' HNSW index is not touched).

Both are set by the embedding job (:mod:`pm_vector.db.runs.class_rows`); a run built before them
works the same, more slowly.

:func:`deferred` holds the prior rows' new ``nbrs``/``nhub`` that :func:`update_lists` is given in
memory and writes each changed row once, at its end: a sync batch erases items and places new ones,
and both change ``nhub`` of thousands of the same rows, so the batch writes them once instead of
twice (the reads inside it, :func:`read_listing`, see the held values). The erased rows leave at
once (a ``DELETE``, :func:`forget` drops what was held of them).
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np
from psycopg import sql

from .. import _binary
from ..run_tables import run_index, run_table
from .deferral import Deferral

#: a run's (or a shard's) table of a kind: ``tables("prior")`` (:func:`pm_vector.db.run_tables.run_table`)
Tables = Callable[[str], sql.Composable]


def reverse_index(run_id: int) -> sql.Composed:
    """The graph's pairs by neighbour: which lists hold an item (the rows whose ``nhub`` follows its hub
    counts), found without reading every list (1.6 million pairs at 100,000 items)."""
    return sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (neighbor_id)").format(
        run_index(run_id, "neighbors_by_neighbor"), run_table(run_id, "neighbors"))

#: the prior's pages are filled to this percentage: an erasure or new items change ``nhub`` (and a
#: refilled ``nbrs``) of the rows listing the items whose hub counts changed -- tens of thousands of
#: rows per sync batch at 100,000 items -- and with room on the page PostgreSQL updates a row in
#: place (a HOT update) instead of inserting it again into the frame coordinates' HNSW index. A
#: batch of 400 changes rewrites nearly every prior row at 100,000 items: at 70 the pages filled up
#: and the batch took 16.1 s, at 50 12.5 s (``attach_bench --batch-sizes``; docs/benchmarks.md), for
#: 1.4 times the prior's pages
PRIOR_FILLFACTOR = 50


def leave_room_for_updates(conn, run_id: int) -> None:
    """Set :data:`PRIOR_FILLFACTOR` on each class partition of the run's prior (just created, empty)."""
    for schema, name in conn.execute(
            "SELECT n.nspname, c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE i.inhparent = to_regclass(pm_vector.pm_run_table(%s, "
            "'prior'))", [int(run_id)]).fetchall():
        conn.execute(sql.SQL("ALTER TABLE {} SET (fillfactor = {})").format(
            sql.Identifier(schema, name), sql.Literal(int(PRIOR_FILLFACTOR))))


def listing(tables: Tables, pairs: sql.Composable) -> sql.Composed:
    """SQL of the prior rows ``(label, item_id)`` of class c whose list holds an item i of a row ``(label c,
    item_id i)`` of the table ``pairs``; ``tables``: the run's (or a shard's foreign) table of a kind."""
    return sql.SQL("SELECT DISTINCT q.label, q.item_id FROM {} AS n JOIN {} AS e ON e.neighbor_id = n.item_id "
                   "JOIN {} AS q ON q.item_id = e.item_id AND q.label = n.label").format(
        pairs, tables("neighbors"), tables("prior"))


def add_hub_changes(labels: np.ndarray, nbrs: np.ndarray, nhub: np.ndarray, dk: np.ndarray, dv: np.ndarray,
                    skip: np.ndarray) -> np.ndarray:
    """``nhub`` (rows ``labels``/``nbrs``, in place) plus the changes ``dv`` of the class counts ``dk``
    ((label, item) rows): each entry of a row of class c gains the change of its item's class-c count.
    Rows ``skip`` (bool) are left. Returns which rows changed."""
    g = nbrs.shape[1]
    if not dk.size:
        return np.zeros(labels.shape[0], bool)
    cs = np.unique(np.concatenate([labels, dk[:, 0]]))  # labels by position (few): ids below 2^44
    key = lambda c, i: np.searchsorted(cs, c).astype(np.int64) * np.int64(1 << 44) + i  # noqa: E731
    order = np.argsort(key(dk[:, 0], dk[:, 1]))
    sk, sv = key(dk[:, 0], dk[:, 1])[order], np.asarray(dv, np.float64)[order]
    q = key(np.repeat(labels, g).reshape(-1, g), nbrs)
    pos = np.clip(np.searchsorted(sk, q), 0, max(sk.size - 1, 0))
    hit = (sk.size > 0) & (sk[pos] == q)
    rows = ~skip & hit.any(axis=1)
    nhub[rows] += np.where(hit, sv[pos], 0.0)[rows]
    return rows


def deferred(conn):
    """Inside: :func:`update_lists` holds the rows' new lists in memory (a later :func:`read_listing`
    sees them); at the end (no exception) each table's changed rows are written once. Nested uses
    join the outer one. Held per connection: prior table -> {(label, item_id): (nbrs, nhub)}."""
    return _held.hold(conn)


def flush(conn, table: sql.Composable | None = None) -> None:
    """Write the changed rows held for ``conn`` (of ``table``, or of every table)."""
    for t, held in (_held.held(conn) or {}).items():
        if (table is None or t == table) and held:
            keys = sorted(held)
            k = np.array(keys, dtype=np.int64).reshape(-1, 2)
            _update(conn, t, k[:, 1], k[:, 0], np.stack([held[x][0] for x in keys]),
                    np.stack([held[x][1] for x in keys]))
            held.clear()


def forget(conn, table: sql.Composable, labels, ids) -> None:
    """These rows of ``table`` were deleted: what :func:`deferred` holds of them goes."""
    held = (_held.held(conn) or {}).get(table)
    if held:
        for x in zip(np.asarray(labels).tolist(), np.asarray(ids).tolist()):
            held.pop(x, None)


def update_lists(conn, table: sql.Composable, ids: np.ndarray, labels: np.ndarray, nbrs: np.ndarray, nhub: np.ndarray) -> None:
    """Set ``nbrs`` and ``nhub`` of these prior rows of ``table`` (an ``UPDATE`` of those columns from a
    temp table: a HOT update where the page has room; inside :func:`deferred`, at its end)."""
    if not ids.size:
        return
    sess = _held.held(conn)
    if sess is not None:
        held = sess.setdefault(table, {})
        for r, x in enumerate(zip(labels.tolist(), ids.tolist())):
            held[x] = (nbrs[r].copy(), nhub[r].copy())
        return
    _update(conn, table, ids, labels, nbrs, nhub)


def _update(conn, table: sql.Composable, ids: np.ndarray, labels: np.ndarray, nbrs: np.ndarray, nhub: np.ndarray) -> None:
    g = nbrs.shape[1]
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS pm_prior_lists (item_id bigint, label bigint, nbrs bigint[], "
                 "nhub float8[]) ON COMMIT DROP")
    conn.execute("TRUNCATE pm_prior_lists")
    _binary.copy_in(conn, "COPY pm_prior_lists (item_id, label, nbrs, nhub) FROM STDIN (FORMAT BINARY)", _binary.encode(
        [("item_id", "int8", 0), ("label", "int8", 0), ("nbrs", "int8[]", g), ("nhub", "float8[]", g)],
        {"item_id": ids, "label": labels, "nbrs": nbrs, "nhub": nhub}))
    conn.execute("ANALYZE pm_prior_lists")
    conn.execute(sql.SQL("UPDATE {} AS p SET nbrs = n.nbrs, nhub = n.nhub FROM pm_prior_lists AS n "
                         "WHERE p.label = n.label AND p.item_id = n.item_id").format(table))


#: the planner's random page cost for :func:`read_listing`'s statement (its default, 4, is for disks;
#: the run's tables are in memory): with it the pairs of the changed items are found through the
#: graph's reverse index (:func:`reverse_index`) instead of a hash join over all 1.6 million pairs
#: at 100,000 items (0.15 s against 0.45 s)
LISTING_PAGE_COST = 1.1


def read_listing(conn, tables: Tables, pairs: sql.Composable, g: int, extra: sql.Composable | None = None,
                 n_hint: int = 0) -> dict[str, np.ndarray]:
    """``item_id, label, nbrs, nhub`` of the prior rows :func:`listing` finds (and of the rows ``extra``,
    an SQL query of ``(label, item_id)``, gives); ``tables`` as for :func:`listing`. Inside
    :func:`deferred`, the rows changed earlier have their held lists."""
    pr = tables("prior")
    # listing()'s rows: the semi-join with the prior itself keeps the pairs of a prior row (the same rows)
    listed = sql.SQL("SELECT n.label, e.item_id FROM {} AS n JOIN {} AS e ON e.neighbor_id = n.item_id").format(
        pairs, tables("neighbors"))
    was = conn.execute("SELECT current_setting('random_page_cost')").fetchone()[0]
    conn.execute("SELECT set_config('random_page_cost', %s, true)", [str(LISTING_PAGE_COST)])
    try:
        a = _binary.copy_out_columns(
            conn, sql.SQL("SELECT p.item_id, p.label, p.nbrs, p.nhub FROM {} AS p WHERE (p.label, p.item_id) IN "
                          "({}{})").format(pr, sql.SQL("{} UNION ").format(extra) if extra is not None else sql.SQL(""),
                                           listed),
            [("item_id", "int8", 0), ("label", "int8", 0), ("nbrs", "int8[]", g), ("nhub", "float8[]", g)],
            max(int(n_hint), 1))
    finally:
        conn.execute("SELECT set_config('random_page_cost', %s, true)", [was])
    held = (_held.held(conn) or {}).get(pr)
    if held:  # changed earlier in the batch, not written yet: the held lists
        nbrs, nhub = a["nbrs"].reshape(-1, g), a["nhub"].reshape(-1, g)
        for r, x in enumerate(zip(a["label"].tolist(), a["item_id"].tolist())):
            h = held.get(x)
            if h is not None:
                nbrs[r], nhub[r] = h
        a["nbrs"], a["nhub"] = nbrs, nhub
    return a


def refresh_nhub(conn, run_id: int, g: int, labels: np.ndarray, ids: np.ndarray, hubs: np.ndarray) -> None:
    """After new items' hub counts were added to ``run_<id>_hubs`` (the changes ``hubs`` of the class
    counts ``(labels, ids)``, also the temp table ``pm_new_hubs``): the prior rows listing a changed
    item gain the change in ``nhub``. The new items' own rows are written after it, with
    :func:`hub_counts`."""
    tables = partial(run_table, int(run_id))
    conn.execute("ANALYZE pm_new_hubs")  # its size, for the join's plan (unknown, a merge join ran 23 s at 100,000 items)
    a = read_listing(conn, tables, sql.Identifier("pm_new_hubs"), g, n_hint=20_000)
    nbrs, nhub = a["nbrs"].reshape(-1, g).copy(), a["nhub"].reshape(-1, g).copy()
    dk = np.stack([np.asarray(labels, np.int64), np.asarray(ids, np.int64)], axis=1).reshape(-1, 2)
    changed = add_hub_changes(a["label"], nbrs, nhub, dk, np.asarray(hubs, np.float64), np.zeros(nbrs.shape[0], bool))
    update_lists(conn, tables("prior"), a["item_id"][changed], a["label"][changed], nbrs[changed], nhub[changed])


def hub_counts(conn, run_id: int, labels: np.ndarray, nbrs: np.ndarray) -> np.ndarray:
    """``nhub`` of rows of class ``labels`` listing ``nbrs`` (n, g): each listed item's stored hub
    count in the row's class (0 where it has none)."""
    g = nbrs.shape[1]
    lab, ids = np.repeat(np.asarray(labels, np.int64), g), np.asarray(nbrs, np.int64).ravel()
    if not ids.size:
        return np.zeros(nbrs.shape)
    pairs = np.unique(np.stack([lab, ids], axis=1), axis=0)
    rows = conn.execute(sql.SQL("SELECT h.label, h.item_id, h.hub FROM {} AS h JOIN unnest(%s::bigint[], %s::bigint[]) "
                                "AS s(label, id) ON h.label = s.label AND h.item_id = s.id").format(
                                    run_table(run_id, "hubs")),
                        [pairs[:, 0].tolist(), pairs[:, 1].tolist()]).fetchall()
    hub = {(int(c), int(i)): float(v) for c, i, v in rows}
    return np.array([hub.get(k, 0.0) for k in zip(lab.tolist(), ids.tolist())], np.float64).reshape(nbrs.shape)


_held = Deferral(flush)
