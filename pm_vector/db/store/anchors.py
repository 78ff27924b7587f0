"""Public anchor sets and dummy pools of a collection: register (one transaction) and read back.

Row order is kept (anchor ``i`` is row ``i``); a new registration for a role becomes the current
set and older sets stay, since every run refers to the set it was built with.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from psycopg import sql
from psycopg.types.json import Jsonb

from ...errors import InvalidInputError
from .. import _binary
from ..errors import translate_sql_error
from ..postgres import connect
from . import partitioned
from ..core.collection import AnchorSet, collection_row, load_anchor_set
from ._validate import ROLES, checked_features, json_safe, checked_labels


def register_anchor_set(collection: str, features, labels, role: str = "anchor", *,
                        description: str | None = None) -> dict[str, Any]:
    """Store a public anchor set (``role='anchor'``) or public dummy pool (``role='dummy'``).

    Row order is kept: anchor ``i`` is row ``i``. ``labels=None`` for a collection without labels
    (:mod:`pm_vector.db.store.partitioned`): its first anchor set fits the public partitions, and every
    row is labelled by its nearest partition. A new registration for the same role becomes
    the current set; older sets stay (runs refer to the set they were built with). One
    transaction. Returns ``{"anchor_set_id", "collection", "role", "n_rows"}``.
    """
    return register_anchor_sets(collection, [(role, features, labels, description, None)])[0]


def register_anchor_sets(collection: str, sets: Sequence[tuple]) -> list[dict[str, Any]]:
    """Several sets in **one** transaction (all or none): ``sets`` items are
    ``(role, features, labels, description, provenance)`` with ``provenance`` a JSON object
    (how the set was made) or None. Returns one :func:`register_anchor_set` dict per set."""
    if not sets:
        raise InvalidInputError("no anchor set given.")
    with connect() as conn:
        coll = collection_row(conn, collection)
        conn.rollback()
        checked = []
        for role, features, labels, description, provenance in sets:
            if role not in ROLES:
                raise InvalidInputError(f"role must be one of {ROLES}, got {role!r}.")
            X = checked_features(features, coll, f"{role} features")
            partitioned.refuse_labels(coll, labels, f"{role} labels")
            y = None if labels is None else checked_labels(labels, X.shape[0], coll, f"{role} labels")
            if provenance is not None:
                json_safe(provenance, "provenance")
            checked.append((role, X, y, description, provenance))
        ftype = coll["feature_type"]
        col = "features" if ftype == "vector" else "features_half"
        out = []
        try:
            part = partitioned.is_partitioned(coll)
            coll = collection_row(conn, collection, lock="FOR UPDATE" if part else "FOR SHARE")
            if part:
                checked = _partition_labels(conn, coll, checked)
            for role, X, y, description, provenance in checked:
                set_id = conn.execute(
                    "INSERT INTO pm_vector.anchor_sets (collection_id, role, n_rows, description, provenance) "
                    "VALUES (%s, %s, %s, %s, %s) RETURNING id",
                    [coll["id"], role, X.shape[0], description,
                     None if provenance is None else Jsonb(provenance)]).fetchone()[0]
                stream = _binary.encode(
                    [("anchor_set_id", "int8", 0), ("position", "int4", 0), ("label", "int8", 0),
                     (col, ftype, X.shape[1])],
                    {"anchor_set_id": np.full(X.shape[0], set_id, dtype=np.int64),
                     "position": np.arange(X.shape[0], dtype=np.int32), "label": y, col: X})
                _binary.copy_in(conn, sql.SQL("COPY pm_vector.anchors (anchor_set_id, position, label, {}) "
                                              "FROM STDIN (FORMAT BINARY)").format(sql.Identifier(col)), stream)
                out.append({"anchor_set_id": int(set_id), "collection": collection, "role": role,
                            "n_rows": int(X.shape[0])})
            conn.commit()
        except BaseException as exc:
            conn.rollback()
            err = translate_sql_error(exc)
            if err is exc:
                raise
            raise err from exc
    return out


def _partition_labels(conn, coll: Mapping[str, Any], checked: list) -> list:
    """The sets of a partitioned collection (row locked) labelled by nearest partition: the stored
    partitions, or (first anchor registration) those fit on this call's first anchor set's features,
    stored in the collection's settings in the same transaction."""
    parts = partitioned.stored(coll)
    if parts is None:
        first = next((X for role, X, *_ in checked if role == "anchor"), None)
        if first is None:
            raise InvalidInputError(
                f"collection {coll['name']!r} has no labels and no public partitions yet: register its public "
                "anchor (role='anchor') first; its partitions are fit on the anchor.")
        parts = partitioned.fit(coll, first)
        conn.execute("UPDATE pm_vector.collections SET settings = jsonb_set(settings, %s, %s) WHERE id = %s",
                     [[partitioned.SETTINGS_KEY, "public"], Jsonb(parts.to_dict()), coll["id"]])
    return [(role, X, partitioned.assign(parts, X), description, provenance)
            for role, X, _, description, provenance in checked]


def get_anchor_set(collection: str, role: str = "anchor", *, anchor_set_id: int | None = None) -> AnchorSet:
    """The current (newest) anchor or dummy set of a collection, or the one with ``anchor_set_id``."""
    if role not in ROLES:
        raise InvalidInputError(f"role must be one of {ROLES}, got {role!r}.")
    with connect() as conn:
        coll = collection_row(conn, collection)
        return load_anchor_set(conn, coll, role, anchor_set_id)
