"""How the class rows' prior keeps up with the graph's changes cheaply (an erasure, new items: a sync
batch of an attached table changes the hub counts of thousands of items at 100,000 items, and each
prior row carries its neighbours' counts, ``nhub``):

* :data:`REVERSE_INDEX`: the graph's pairs by neighbour, so that the rows whose list holds a changed
  item are found by index (:func:`listing`) instead of by reading every list;
* :data:`PRIOR_FILLFACTOR`: room on the prior's pages, so that updating ``nhub`` / ``nbrs`` is a HOT
  update (the row stays on its page, the frame coordinates' HNSW index is not touched).

Both are set by the embedding job (:mod:`pm_vector.db.runs.class_rows`); a run built before them
works the same, more slowly.
"""

from __future__ import annotations

import numpy as np

from .. import _binary

#: the graph's pairs by neighbour: which lists hold an item (the rows whose ``nhub`` follows its hub
#: counts), found without reading every list (1.6 million pairs at 100,000 items)
REVERSE_INDEX = ("CREATE INDEX IF NOT EXISTS run_{rid}_neighbors_by_neighbor ON pm_vector.run_{rid}_neighbors "
                 "(neighbor_id)")

#: the prior's pages are filled to this percentage: an erasure or new items change ``nhub`` (and a
#: refilled ``nbrs``) of the rows listing the items whose hub counts changed -- tens of thousands of
#: rows per sync batch at 100,000 items -- and with room on the page PostgreSQL updates a row in
#: place (a HOT update) instead of inserting it again into the frame coordinates' HNSW index
PRIOR_FILLFACTOR = 70


def leave_room_for_updates(conn, run_id: int) -> None:
    """Set :data:`PRIOR_FILLFACTOR` on each class partition of the run's prior (just created, empty)."""
    for (part,) in conn.execute("SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = "
                                "to_regclass(%s)", [f"pm_vector.run_{int(run_id)}_prior"]).fetchall():
        conn.execute(f"ALTER TABLE {part} SET (fillfactor = {PRIOR_FILLFACTOR})")


def listing(t: str, pairs: str) -> str:
    """SQL of the prior rows ``(label, item_id)`` of class c whose list holds an item i of a row ``(label c,
    item_id i)`` of the table ``pairs``; ``t``: the run's table prefix (``pm_vector.run_<id>_``, or a
    shard's foreign tables' with ``{kind}`` for the table kind)."""
    nb, pr = (t.format(kind="neighbors"), t.format(kind="prior")) if "{kind}" in t else (f"{t}neighbors", f"{t}prior")
    return (f"SELECT DISTINCT q.label, q.item_id FROM {pairs} AS n JOIN {nb} AS e ON e.neighbor_id = n.item_id "
            f"JOIN {pr} AS q ON q.item_id = e.item_id AND q.label = n.label")


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


def update_lists(conn, table: str, ids: np.ndarray, labels: np.ndarray, nbrs: np.ndarray, nhub: np.ndarray) -> None:
    """Set ``nbrs`` and ``nhub`` of these prior rows of ``table`` (an ``UPDATE`` of those columns from a
    temp table: a HOT update where the page has room)."""
    if not ids.size:
        return
    g = nbrs.shape[1]
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS pm_prior_lists (item_id bigint, label bigint, nbrs bigint[], "
                 "nhub float8[]) ON COMMIT DROP")
    conn.execute("TRUNCATE pm_prior_lists")
    _binary.copy_in(conn, "COPY pm_prior_lists (item_id, label, nbrs, nhub) FROM STDIN (FORMAT BINARY)", _binary.encode(
        [("item_id", "int8", 0), ("label", "int8", 0), ("nbrs", "int8[]", g), ("nhub", "float8[]", g)],
        {"item_id": ids, "label": labels, "nbrs": nbrs, "nhub": nhub}))
    conn.execute("ANALYZE pm_prior_lists")
    conn.execute(f"UPDATE {table} AS p SET nbrs = n.nbrs, nhub = n.nhub FROM pm_prior_lists AS n "
                 "WHERE p.label = n.label AND p.item_id = n.item_id")


def read_listing(conn, t: str, pairs: str, g: int, extra: str = "", n_hint: int = 0) -> dict[str, np.ndarray]:
    """``item_id, label, nbrs, nhub`` of the prior rows :func:`listing` finds (and of the rows ``extra``,
    an SQL query of ``(label, item_id)``, gives); ``t`` as for :func:`listing`."""
    pr = t.format(kind="prior") if "{kind}" in t else f"{t}prior"
    return _binary.copy_out_columns(
        conn, f"SELECT p.item_id, p.label, p.nbrs, p.nhub FROM {pr} AS p WHERE (p.label, p.item_id) IN ("
        + (f"{extra} UNION " if extra else "") + f"{listing(t, pairs)})",
        [("item_id", "int8", 0), ("label", "int8", 0), ("nbrs", "int8[]", g), ("nhub", "float8[]", g)],
        max(int(n_hint), 1))


def refresh_nhub(conn, run_id: int, g: int, new_labels: np.ndarray, new_ids: np.ndarray) -> None:
    """After new items' hub counts were added (the temp table ``pm_new_hubs``: the changes, by label and
    item) to ``run_<id>_hubs``: the prior rows listing a changed item gain the change in ``nhub``, the
    new rows (``new_labels``/``new_ids``) read theirs from the hub counts."""
    t = f"pm_vector.run_{int(run_id)}_"
    conn.execute("ANALYZE pm_new_hubs")  # its size, for the join's plan (unknown, a merge join ran 23 s at 100,000 items)
    a = read_listing(conn, t, "pm_new_hubs", g, n_hint=20_000)
    ids, labels = a["item_id"], a["label"]
    nbrs, nhub = a["nbrs"].reshape(-1, g).copy(), a["nhub"].reshape(-1, g).copy()
    d = conn.execute("SELECT label, item_id, hub FROM pm_new_hubs").fetchall()
    dk = np.array([(r[0], r[1]) for r in d], dtype=np.int64).reshape(-1, 2)
    fresh = np.isin(ids, new_ids)
    changed = add_hub_changes(labels, nbrs, nhub, dk, np.array([r[2] for r in d], np.float64), fresh)
    update_lists(conn, f"{t}prior", ids[changed], labels[changed], nbrs[changed], nhub[changed])
    if new_ids.size:
        conn.execute(f"UPDATE {t}prior AS p SET nhub = ARRAY(SELECT coalesce(h.hub, 0) FROM unnest(p.nbrs) "
                     f"WITH ORDINALITY AS u(id, k) LEFT JOIN {t}hubs AS h ON h.label = p.label AND h.item_id = u.id "
                     "ORDER BY u.k) WHERE (p.label, p.item_id) IN (SELECT * FROM unnest(%s::bigint[], %s::bigint[]))",
                     [np.asarray(new_labels, np.int64).tolist(), np.asarray(new_ids, np.int64).tolist()])
