"""Helpers shared by :mod:`pm_vector.db.store.api`, :mod:`pm_vector.db.runs.jobs` and :mod:`pm_vector.db.resolve.frame`:
the collection row, anchor sets, worker identity, and the clean-up of runs whose worker died.

They live here so that ``api`` and ``jobs`` do not import each other (``jobs`` imports ``api``;
``api`` imports only this module); both modules re-export the names they used to define.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from psycopg.rows import dict_row

from ...errors import InvalidInputError
from .. import _binary
from ..postgres import connect
from ..errors import CollectionNotFoundError, NoAnchorSetError

#: advisory-lock kind of an embedding run (``pm_vector.pm_lock_key(1, run_id)``)
RUN_LOCK_KIND = 1


def worker_identity() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def collection_row(conn, name: str, *, lock: str = "") -> dict[str, Any]:
    """The collection's row as a dict, or CollectionNotFoundError. ``lock``: '' | 'FOR UPDATE' | 'FOR SHARE'."""
    if not isinstance(name, str):
        raise InvalidInputError(f"collection must be a name (str), got {type(name).__name__}.")

    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            "SELECT id, name, feature_dim, feature_type, metric, labels, settings, active_run_id, created_at "
            f"FROM pm_vector.collections WHERE name = %s {lock}", [name])
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
    buf = _binary.copy_out(conn, f"SELECT position, label, {col} FROM pm_vector.anchors "
                                 f"WHERE anchor_set_id = {int(set_id)} ORDER BY position")
    d = _binary.decode([("position", "int4", 0), ("label", "int8", 0), ("f", ftype, coll["feature_dim"])], buf)
    if d["position"].size != n_rows or np.any(d["position"] != np.arange(n_rows)):
        raise NoAnchorSetError(f"anchor set {set_id} of collection {coll['name']!r} is incomplete.")
    return AnchorSet(anchor_set_id=int(set_id), collection=coll["name"], role=role, features=d["f"],
                     labels=d["label"], description=description, created_at=created_at, provenance=provenance)



# ----------------------------------------------------------------------------- stale runs

def fail_run(conn, run_id: int, error: str) -> None:
    """Mark a run failed and drop its tables (one transaction on ``conn``); no-op if already final."""
    conn.execute("SET LOCAL lock_timeout = '30s'")
    row = conn.execute("SELECT status FROM pm_vector.embedding_runs WHERE id = %s FOR UPDATE", [run_id]).fetchone()
    if row is not None and row[0] in ("running", "pending"):
        conn.execute("UPDATE pm_vector.embedding_runs SET status = 'failed', error = %s, finished_at = now() "
                     "WHERE id = %s", [error[:4000], run_id])
    active = conn.execute("SELECT 1 FROM pm_vector.collections WHERE active_run_id = %s", [run_id]).fetchone()
    if active is None:
        conn.execute("SELECT pm_vector.pm_drop_run_tables(%s)", [run_id])
    conn.commit()


def cleanup_stale_runs(collection: str | None = None) -> list[int]:
    """Mark ``running`` runs whose worker is gone as ``failed`` and drop their tables.

    "Gone" means no session holds the run's advisory lock (the job takes it before its row is
    visible and keeps it until the run is final). Returns the ids of the runs cleaned up.
    """
    done: list[int] = []
    with connect() as conn:
        cid = None
        if collection is not None:
            cid = collection_row(conn, collection)["id"]
        rows = conn.execute(
            "SELECT id FROM pm_vector.embedding_runs WHERE status IN ('running', 'pending') "
            "AND (%s::bigint IS NULL OR collection_id = %s) "
            "AND NOT pm_vector.pm_lock_held(pm_vector.pm_lock_key(1, id)) ORDER BY id", [cid, cid]).fetchall()
        conn.rollback()
        for (rid,) in rows:
            # take the lock ourselves: if we get it, no worker can hold it (re-check under lock)
            got = conn.execute("SELECT pg_try_advisory_lock(pm_vector.pm_lock_key(1, %s))", [rid]).fetchone()[0]
            conn.commit()
            if not got:
                continue
            try:
                st = conn.execute("SELECT status FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()
                conn.rollback()
                if st is not None and st[0] in ("running", "pending"):
                    fail_run(conn, rid, "abandoned: the job's process ended (killed or lost its database "
                                         "connection) before the run finished; its tables were dropped")
                    done.append(int(rid))
            finally:
                conn.execute("SELECT pg_advisory_unlock(pm_vector.pm_lock_key(1, %s))", [rid])
                conn.commit()
    return done
