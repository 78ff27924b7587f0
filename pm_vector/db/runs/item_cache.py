"""A run's items as it was built -- ids, labels and the features each was placed with -- kept in the
process's memory between the transactions that change the run (an attached table's sync batches).

An erasure plans its refilled lists by exact search over the run's items, and new items are placed
against them (:mod:`pm_vector.db.runs.erase`, :func:`pm_vector.db.runs.new_items.embed_new_items`): reading
them again for every batch (100,000 rows of 128 floats from the user's table) cost about a second
a batch. A process that has read them keeps them here after its commit, keyed by the database, the
run, its creation time and its class rows' ``graph_version``, which every change of the run's items
increases in the changing transaction (an erasure, new items: :mod:`pm_vector.db.runs.erase`,
:func:`pm_vector.db.runs.class_rows.extend`); a change made by any other process therefore makes the
key miss and the items are read again. :func:`get` also checks that the run holds as many items as
the entry (a cheap guard against a change that did not increase the version); entries exist only
for runs whose class rows are ready (the only ones that have a ``graph_version``).

An item's features never change while it is in the run: a changed row of an attached table is a new
item (the old one is erased), so an entry moves from one version to the next by dropping the erased
ids and adding the placed ones (:func:`after`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np
from psycopg import sql

from ..run_tables import run_table

#: entries kept (least recently used out): 51 MB each at 100,000 items of 128 floats
MAX_ENTRIES = 4

_cache: "OrderedDict[tuple, dict]" = OrderedDict()
_lock = threading.Lock()


def _ready(doc: Mapping[str, Any] | None) -> bool:
    return bool(doc) and doc.get("status") == "ready"


def key(conn, run_id: int, doc: Mapping[str, Any] | None) -> tuple | None:
    """The entry's key for the run as the caller's transaction sees it (None: not cached)."""
    if not _ready(doc):
        return None
    created = conn.execute("SELECT created_at FROM pm_vector.embedding_runs WHERE id = %s", [int(run_id)]).fetchone()
    if created is None:
        return None
    info = conn.info
    return (info.host, info.port, info.dbname, int(run_id), str(created[0]), int(doc.get("graph_version", 0)))


def get(conn, run_id: int, doc: Mapping[str, Any] | None) -> dict[str, np.ndarray] | None:
    """The run's items (``id`` ascending, ``label``, ``features``) if this process holds them for the
    run's current version, else None."""
    k = key(conn, run_id, doc)
    if k is None:
        return None
    with _lock:
        items = _cache.get(k)
        if items is not None:
            _cache.move_to_end(k)
    if items is None:
        return None
    n = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(run_table(run_id, "items"))).fetchone()[0]
    if int(n) != items["id"].shape[0]:
        forget(run_id)
        return None
    return items


def put(k: tuple | None, items: Mapping[str, np.ndarray]) -> None:
    """Keep ``items`` under ``k`` (call it after the transaction that made that version committed)."""
    if k is None:
        return
    with _lock:
        for old in [o for o in _cache if o[:5] == k[:5]]:  # one version per run
            del _cache[old]
        _cache[k] = {"id": items["id"], "label": items["label"], "features": items["features"]}
        while len(_cache) > MAX_ENTRIES:
            _cache.popitem(last=False)


def forget(run_id: int | None = None) -> None:
    """Drop the entries of a run (all of them with None)."""
    with _lock:
        for k in [k for k in _cache if run_id is None or k[3] == int(run_id)]:
            del _cache[k]


def after(items: Mapping[str, np.ndarray], erased=(), added: Mapping[str, np.ndarray] | None = None
          ) -> dict[str, np.ndarray]:
    """``items`` without the ``erased`` ids and with the ``added`` ones (ids ascending)."""
    keep = ~np.isin(items["id"], np.asarray(erased, dtype=np.int64))
    # (nothing erased -- a batch's placements -- keeps the arrays: no copy of every item's features)
    out = {k: np.asarray(items[k]) if keep.all() else np.asarray(items[k])[keep] for k in ("id", "label", "features")}
    if added is not None and np.asarray(added["id"]).size:
        new_ids = np.asarray(added["id"], np.int64)
        fresh = ~np.isin(new_ids, out["id"])
        ids = np.concatenate([out["id"], new_ids[fresh]])
        feats = np.concatenate([out["features"], np.asarray(added["features"], out["features"].dtype)[fresh]])
        labs = np.concatenate([out["label"], np.asarray(added["label"], np.int64)[fresh]])
        if ids.size > 1 and not np.all(ids[1:] > ids[:-1]):  # (new ids follow the old ones: no copy)
            order = np.argsort(ids, kind="stable")
            ids, feats, labs = ids[order], feats[order], labs[order]
        out = {"id": ids, "features": feats, "label": labs}
    return out
