"""The run's items as built, for a sync batch of an attached table (:mod:`pm_vector.db.store.sync`):
the erasure and the placement search the run's items by the features they were built from, which
are the table's vectors now -- or, for a row changed or gone since (its changes still queued), the
first vector queued for it (``attach_changes.old_vector``). :class:`RunItems` takes them from the
syncing process's cache (:mod:`pm_vector.db.runs.item_cache`) when it holds the run's current
version, follows them through the batch, and caches them under the runs' new versions after the
commit."""

from __future__ import annotations

import numpy as np
from psycopg import sql

from ..runs import item_cache
from .api import load_items


def items_as_built(conn, coll, rid: int) -> dict[str, np.ndarray]:
    """The run's items read from the user's table, each with the vector it was built from: the
    table's now, or -- for a row changed or gone since (changes still queued) -- the first vector
    queued for it (``old_vector``)."""
    have = load_items(conn, coll, in_run=rid)
    feats = np.asarray(have["features"], np.float32).copy()
    pos = {int(i): k for k, i in enumerate(have["id"])}
    queued = dict(conn.execute(sql.SQL(
        "SELECT DISTINCT ON (it.id) it.id, c.old_vector FROM pm_vector.items it JOIN pm_vector.attach_changes c "
        "ON c.collection_id = it.collection_id AND c.key = it.external_id WHERE it.collection_id = %s "
        "AND c.old_vector IS NOT NULL AND EXISTS (SELECT 1 FROM {} e "
        "WHERE e.item_id = it.id) ORDER BY it.id, c.seq").format(sql.Identifier("pm_vector", f"run_{int(rid)}_items")),
        [coll["id"]]).fetchall())
    miss = []
    for i, v in queued.items():
        vec = np.asarray(v.strip("[]").split(","), dtype=np.float32)
        if vec.shape[0] != int(coll["feature_dim"]):
            continue
        if int(i) in pos:
            feats[pos[int(i)]] = vec
        else:  # the row is gone (or no longer valid): only its queued vector is left
            miss.append((int(i), vec))
    if not miss:
        return {"id": have["id"], "label": have["label"], "features": feats}
    labs = dict(conn.execute("SELECT id, label FROM pm_vector.items WHERE id = ANY(%s)",
                             [[i for i, _ in miss]]).fetchall())
    ids = np.concatenate([have["id"], np.array([i for i, _ in miss], np.int64)])
    order = np.argsort(ids, kind="stable")
    return {"id": ids[order],
            "label": np.concatenate([have["label"], np.array([labs[i] for i, _ in miss], np.int64)])[order],
            "features": np.concatenate([feats.reshape(-1, coll["feature_dim"]), np.stack([v for _, v in miss])])[order]}


class RunItems:
    """The items of each run a batch changes, as built: from this process's cache
    (:mod:`pm_vector.db.runs.item_cache`) when it holds the run's current version, else read
    (:func:`items_as_built`); followed through the batch's erasure and placements, and cached
    under the runs' new versions once the batch has committed."""

    def __init__(self, conn, coll, runs):
        self.conn, self.coll = conn, coll
        self.docs = {int(r[0]): r[1] for r in runs}
        self.items: dict[int, dict] = {}

    def load(self, rid: int) -> dict[str, np.ndarray]:
        rid = int(rid)
        if rid not in self.items:
            got = item_cache.get(self.conn, rid, self.docs.get(rid))
            self.items[rid] = got if got is not None else items_as_built(self.conn, self.coll, rid)
        return self.items[rid]

    def erased(self, gone) -> None:
        for rid, items in self.items.items():
            self.items[rid] = item_cache.after(items, gone)

    def placed(self, rid: int, added: dict) -> None:
        self.items[int(rid)] = item_cache.after(self.load(rid), (), added)

    def keys(self) -> dict:
        """Before the commit: each run's cache key under its new version (the kept cell rows,
        :mod:`pm_vector.db.runs.row_cache`, are kept under it too)."""
        out = {}
        for rid in self.docs:
            doc = self.conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()
            out[rid] = item_cache.key(self.conn, rid, doc[0] if doc else None)
        return out

    def keep(self, keys: dict) -> None:
        """After the commit."""
        for rid, items in self.items.items():
            item_cache.put(keys.get(rid), items)

