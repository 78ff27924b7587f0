"""A collection as every room reads it: its row (:func:`collection_row`), its public anchor and
dummy sets (:class:`AnchorSet`, :func:`load_anchor_set`), its items with their raw features by
binary COPY (:func:`load_items`: the embedding job, new items, a sync batch, an erasure, KAHM;
the features read where :mod:`pm_vector.db.core.features` says), and two small shared helpers
(:func:`iso_datetime`, :func:`worker_identity`: who wrote a run, an ingest, a model).

Below :mod:`pm_vector.db.runs`, :mod:`pm_vector.db.store`, :mod:`pm_vector.db.kahm` and
:mod:`pm_vector.db.resolve` (:mod:`pm_vector.db.core` says why).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from psycopg import sql
from psycopg.rows import dict_row

from ...errors import InvalidInputError
from .. import _binary
from ..errors import CollectionNotFoundError, NoAnchorSetError
from ..run_tables import run_table
from .features import feature_filter, feature_sql


def worker_identity() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


#: the row locks :func:`collection_row` takes
ROW_LOCKS = ("", "FOR UPDATE", "FOR NO KEY UPDATE", "FOR SHARE", "FOR KEY SHARE")


def collection_row(conn, name: str, *, lock: str = "") -> dict[str, Any]:
    """The collection's row as a dict, or CollectionNotFoundError. ``lock``: one of :data:`ROW_LOCKS`."""
    if lock not in ROW_LOCKS:
        raise ValueError(f"lock must be one of {ROW_LOCKS}, not {lock!r}")
    if not isinstance(name, str):
        raise InvalidInputError(f"collection must be a name (str), got {type(name).__name__}.")

    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql.SQL(
            "SELECT id, name, feature_dim, feature_type, metric, labels, settings, active_run_id, created_at "
            "FROM pm_vector.collections WHERE name = %s {}").format(sql.SQL(lock)), [name])
        row = cur.fetchone()
    if row is None:
        raise CollectionNotFoundError(
            f"unknown collection {name!r}; list_collections() shows the existing ones, create_collection() makes one.")
    return row


def iso_datetime(v: Any) -> Any:
    return v.isoformat() if isinstance(v, (dt.datetime, dt.date)) else v



@dataclass(frozen=True)
class AnchorSet:
    """A registered public anchor (or dummy) set. Anchor ``i`` is row ``i`` (its stable id is
    ``(anchor_set_id, i)``); features are float32 as stored."""

    anchor_set_id: int
    collection: str
    role: str
    features: np.ndarray
    labels: np.ndarray
    description: str | None
    created_at: dt.datetime
    provenance: dict | None = None  # how the set was made (None: registered by the user)

    @property
    def positions(self) -> np.ndarray:
        return np.arange(self.labels.shape[0], dtype=np.int64)

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def load_anchor_set(conn, coll: Mapping[str, Any], role: str, anchor_set_id: int | None) -> AnchorSet:
    if anchor_set_id is None:
        row = conn.execute(
            "SELECT id, description, created_at, n_rows, provenance FROM pm_vector.anchor_sets "
            "WHERE collection_id = %s AND role = %s ORDER BY id DESC LIMIT 1", [coll["id"], role]).fetchone()
    else:
        row = conn.execute(
            "SELECT id, description, created_at, n_rows, provenance FROM pm_vector.anchor_sets "
            "WHERE collection_id = %s AND role = %s AND id = %s", [coll["id"], role, anchor_set_id]).fetchone()
    if row is None:
        which = f"anchor set {anchor_set_id}" if anchor_set_id is not None else f"{role} set"
        raise NoAnchorSetError(
            f"collection {coll['name']!r} has no {which}; register one with "
            f"register_anchor_set({coll['name']!r}, features, labels, role={role!r}).")
    set_id, description, created_at, n_rows, provenance = row
    ftype = coll["feature_type"]
    col = "features" if ftype == "vector" else "features_half"
    buf = _binary.copy_out(conn, sql.SQL("SELECT position, label, {} FROM pm_vector.anchors WHERE anchor_set_id = {} "
                                         "ORDER BY position").format(sql.Identifier(col), sql.Literal(int(set_id))))
    d = _binary.decode([("position", "int4", 0), ("label", "int8", 0), ("f", ftype, coll["feature_dim"])], buf)
    if d["position"].size != n_rows or np.any(d["position"] != np.arange(n_rows)):
        raise NoAnchorSetError(f"anchor set {set_id} of collection {coll['name']!r} is incomplete.")
    return AnchorSet(anchor_set_id=int(set_id), collection=coll["name"], role=role, features=d["f"],
                     labels=d["label"], description=description, created_at=created_at, provenance=provenance)


def load_items(conn, coll: Mapping[str, Any], where: str | sql.Composable = "", *, missing_from_run: int | None = None,
               in_run: int | None = None, ids=None) -> dict[str, np.ndarray]:
    """ids, labels, features (float32) of a collection's items by binary COPY, ordered by id and
    streamed into arrays sized once: those ``where`` keeps (`` AND ...``, SQL on the items row ``i``;
    given by the code, never by a user), and with ``missing_from_run`` only the items that have no
    embedding in that run, with ``in_run`` only those that have one. The run's (anti-)join comes
    first, then the features: an attached table's are read row by row, so only for the rows kept
    (an anti-join over 100,000 items read every row's vector twice, 0.36 s of each sync batch).
    ``ids``: only these items (a sync batch's new ones: no anti-join of the whole collection)."""
    # no parameters, literals: an attached table's names may hold a '%' (feature_sql)
    rows = [sql.SQL("SELECT i.* FROM pm_vector.items i WHERE i.collection_id = {}").format(sql.Literal(int(coll["id"])))]
    if missing_from_run is not None:
        rows.append(sql.SQL("AND NOT EXISTS (SELECT 1 FROM {} e WHERE e.item_id = i.id)").format(
            run_table(missing_from_run, "items")))
    if in_run is not None:
        rows.append(sql.SQL("AND EXISTS (SELECT 1 FROM {} e WHERE e.item_id = i.id)").format(run_table(in_run, "items")))
    if ids is not None:
        rows.append(sql.SQL("AND i.id = ANY({}::bigint[])").format(
            sql.Literal([int(i) for i in np.asarray(ids, dtype=np.int64).tolist()])))
    if where:
        rows.append(where if isinstance(where, sql.Composable) else sql.SQL(where))
    rows = sql.SQL(" ").join(rows)
    n_hint = conn.execute(sql.SQL("SELECT count(*) FROM ({}) AS q").format(rows)).fetchone()[0]  # an upper bound of the stream's
    q = sql.SQL("SELECT i.id, i.label, {} FROM ({} OFFSET 0) AS i WHERE true{} ORDER BY i.id").format(
        feature_sql(coll), rows, feature_filter(coll))
    return _binary.copy_out_columns(conn, q, [("id", "int8", 0), ("label", "int8", 0),
                                              ("features", coll["feature_type"], coll["feature_dim"])], int(n_hint))
