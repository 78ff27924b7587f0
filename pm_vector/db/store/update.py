"""Updating items: ``update_items(collection, item_ids=... | external_ids=..., features=, labels=, payloads=)``.

ONE transaction (the collection row held ``FOR NO KEY UPDATE``, as :mod:`pm_vector.db.store.deletes`):

* a **payload-only** change rewrites ``items.payload`` and touches no run data (the payload is
  joined to answers by item id; the run tables never hold it);
* a **feature or label** change is a delete and an insert under the same external id: the old
  item is tombstoned (:func:`pm_vector.db.store.deletes.erase_or_tombstone`), a new item
  (a new item id) takes its external id, payload (or the new one) and the new features / label,
  and is placed in the active run as ``embed --new-items`` places new items
  (:func:`pm_vector.db.runs.new_items.embed_new_items` in this transaction; ``embed_fn_extend``, the
  AnchorFrame extension by default): into the run's delta, a sharded run's as a single node's
  (:mod:`pm_vector.db.runs.delta`). A sharded active run of a collection without the delta
  (``settings={"delta": False}``) cannot take new items incrementally: the new item then waits for
  the next full job (``placed`` false).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from psycopg import sql
from psycopg.types.json import Jsonb

from ...errors import InvalidInputError
from ..postgres import connect
from ..core.collection import collection_row
from ..runs.jobs import anchor_frame_extend_fn
from ..runs.delta import waits_for_job
from ..runs.new_items import embed_new_items
from ._validate import checked_features, checked_labels
from .deletes import erase_kahm, erase_or_tombstone, ids_to_erase, check_not_attached, resolve_item_ids, runs_with_tables
from .payloads import bump_answers_version, check_payloads, limit_of, raise_high

UNSET = object()


def update_items(collection: str, *, item_ids=None, external_ids=None, features=None, labels=None,
                 payloads: Any = UNSET, embed_fn_extend=None) -> dict[str, Any]:
    """Change the features, labels and/or payloads of items given by ``item_ids`` or ``external_ids``
    (one row of ``features`` / ``labels`` / ``payloads`` per id, in the order given), in one
    transaction (module doc). Unknown ids raise :class:`~pm_vector.db.store.deletes.ItemNotFoundError`
    and change nothing. Returns ``{"collection", "updated", "item_ids" (old -> new), "placed",
    "seconds"}``."""
    kind, vals = ids_to_erase(item_ids, external_ids)
    given = list(item_ids if item_ids is not None else external_ids)
    if len(vals) != len(given):
        raise InvalidInputError("each item may be updated once per call (the ids repeat).")
    if features is None and labels is None and payloads is UNSET:
        raise InvalidInputError("nothing to update: give features, labels and/or payloads.")
    t = time.perf_counter()
    n = len(given)
    with connect(watch_client=True) as conn:
        coll = collection_row(conn, collection, lock="FOR NO KEY UPDATE")
        check_not_attached(coll, "update")
        X = None if features is None else checked_features(features, coll, "features")
        if X is not None and X.shape[0] != n:
            raise InvalidInputError(f"features has {X.shape[0]} rows for {n} ids.")
        y = None if labels is None else checked_labels(labels, n, coll, "labels")
        P = None
        if payloads is not UNSET:
            P, biggest = check_payloads(payloads, n, limit_of(coll), collection)
            raise_high(conn, coll["id"], biggest)  # the high-water mark, in this transaction (payloads.py)
        ids_sorted = resolve_item_ids(conn, coll, kind, vals, False)
        # the ids in the caller's order
        rows = conn.execute(sql.SQL("SELECT {}, id, external_id, label, payload FROM pm_vector.items "
                                    "WHERE collection_id = %s AND id = ANY(%s)").format(sql.Identifier(kind)),
                            [coll["id"], ids_sorted.tolist()]).fetchall()
        by = {r[0]: r[1:] for r in rows}
        old = [by[v] for v in given]
        out = {"collection": collection, "updated": n, "item_ids": {}, "placed": None}
        if X is None and y is None:  # payload only: no run data changes

            with conn.cursor() as cur:
                cur.executemany("UPDATE pm_vector.items SET payload = %s WHERE id = %s",
                                [(None if p is None else Jsonb(p), o[0]) for p, o in zip(P, old)])
            bump_answers_version(conn, coll["id"])  # (the cached answers carry payloads)
            conn.commit()
            out["item_ids"] = {int(o[0]): int(o[0]) for o in old}
            out["seconds"] = round(time.perf_counter() - t, 3)
            return out
        # a feature / label change: the old items leave every run table, new ones take their place
        old_ids = np.array(sorted(int(o[0]) for o in old), dtype=np.int64)
        if X is None:
            col = "features" if coll["feature_type"] == "vector" else "features_half"
            f = dict(conn.execute(sql.SQL("SELECT id, {}::real[] FROM pm_vector.items WHERE id = ANY(%s)").format(
                sql.Identifier(col)), [old_ids.tolist()]).fetchall())
            X = np.array([f[int(o[0])] for o in old], dtype=np.float32)
        erase_or_tombstone(conn, coll, old_ids, runs_with_tables(conn, coll["id"]))
        erase_kahm(conn, coll, old_ids)
        conn.execute("DELETE FROM pm_vector.items WHERE id = ANY(%s)", [old_ids.tolist()])
        new_ids = _insert(conn, coll, old, X, y, P)
        out["item_ids"] = {int(o[0]): int(nid) for o, nid in zip(old, new_ids)}
        if coll["active_run_id"] is not None:
            doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s",
                               [coll["active_run_id"]]).fetchone()[0] or {}
            if waits_for_job(doc, coll):
                out["placed"] = False  # a sharded run without the delta takes new items with the next full job
            else:
                embed_new_items(collection, embed_fn_extend or anchor_frame_extend_fn, conn=conn)
                out["placed"] = True
        conn.commit()
    out["seconds"] = round(time.perf_counter() - t, 3)
    return out


def _insert(conn, coll, old, X: np.ndarray, y, P) -> list[int]:
    """The new items (one per ``old`` row: its external id, its label unless ``y``, its payload unless ``P``)."""
    col = "features" if coll["feature_type"] == "vector" else "features_half"
    cast = "vector" if col == "features" else "halfvec"
    out = []
    for k, o in enumerate(old):
        _, ext, label, payload = o
        lab = int(label) if y is None else int(y[k])
        pay = payload if P is None else P[k]
        vec = "[" + ",".join(repr(float(v)) for v in X[k]) + "]"
        out.append(conn.execute(sql.SQL(
            "INSERT INTO pm_vector.items (collection_id, external_id, label, {}, payload) "
            "VALUES (%s, %s, %s, %s::{}, %s) RETURNING id").format(sql.Identifier(col), sql.SQL(cast)),
            [coll["id"], ext, lab, vec, None if pay is None else Jsonb(pay)]).fetchone()[0])
    return out
