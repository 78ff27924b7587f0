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
