"""Collections without labels: public partitions take the place of classes.

A collection created with ``labels=None`` (``partitions=C``) has the label set ``0..C-1`` and
``settings["partitions"] = {"n_partitions": C, "public": None}``. Its first public anchor
registered without labels fits :class:`~pm_vector.manifold.partitions.PublicPartitions` (k-means,
fixed ``random_state``) on the anchor's **features only** (public data) and stores the centroids
in ``settings["partitions"]["public"]``; from then on every anchor row, dummy row and item is
labelled by its nearest partition of its unit-norm features, and later anchor sets keep the
stored partitions. A partition is a public function of the features, so a client computes its
query's row itself from the published centroids (:mod:`pm_vector.client.http`): every release
keeps its guarantee (the class it protects is now the partition). Everything downstream
(frames, cells, class rows, resolution) sees ordinary classes.
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping

import numpy as np

from ..._validation import normalize_rows
from ...errors import InvalidInputError
from ...manifold.partitions import DEFAULT_PARTITIONS, PublicPartitions
from ..postgres import connect

SETTINGS_KEY = "partitions"
#: the k-means seed of every collection's partitions (public, fixed: the fit is reproducible)
RANDOM_STATE = 0


def creation(labels, partitions: int | None) -> tuple[Any, dict[str, Any] | None]:
    """``(labels, settings entry)`` of a new collection: given labels and no ``partitions`` are
    kept as they are; ``labels=None`` gives ``0..C-1`` (``C = partitions``, default 10)."""
    if labels is not None:
        if partitions is not None:
            raise InvalidInputError("give labels= (a labelled collection) or partitions= (a collection without "
                                    "labels), not both.")
        return labels, None
    c = DEFAULT_PARTITIONS if partitions is None else partitions
    if isinstance(c, bool) or not isinstance(c, numbers.Integral) or not 2 <= int(c) <= 100_000:
        raise InvalidInputError(f"partitions must be an integer in 2..100000, got {c!r}.")
    return list(range(int(c))), {"n_partitions": int(c), "public": None}


def public_partitions(collection: str) -> dict[str, Any] | None:
    """The stored public partitions of a collection without labels (``PublicPartitions.to_dict()``:
    the centroids fit on its public anchor), or None (a labelled collection, or none fit yet)."""
    with connect() as conn:
        row = conn.execute("SELECT settings -> %s -> 'public' FROM pm_vector.collections WHERE name = %s",
                           [SETTINGS_KEY, collection]).fetchone()
    return None if row is None else row[0]


def is_partitioned(coll: Mapping[str, Any]) -> bool:
    return SETTINGS_KEY in (coll.get("settings") or {})


def stored(coll: Mapping[str, Any]) -> PublicPartitions | None:
    """The collection's fitted partitions, or None (not partitioned, or no anchor registered yet)."""
    doc = (coll.get("settings") or {}).get(SETTINGS_KEY) or {}
    return None if not doc.get("public") else PublicPartitions.from_dict(doc["public"])


def fit(coll: Mapping[str, Any], X_anchor: np.ndarray) -> PublicPartitions:
    """:class:`PublicPartitions` of the collection's ``n_partitions`` fit on the unit-norm anchor features."""
    n = int(coll["settings"][SETTINGS_KEY]["n_partitions"])
    return PublicPartitions(n, random_state=RANDOM_STATE).fit(normalize_rows(X_anchor))


def assign(parts: PublicPartitions, X: np.ndarray) -> np.ndarray:
    """The partition (int64) of every row: nearest centroid of its unit-norm features (what a client
    computes for its query)."""
    return parts.predict(normalize_rows(X))


def refuse_labels(coll: Mapping[str, Any], labels, what: str) -> None:
    """Clear errors for labels that do not fit the collection: labels given to a partitioned
    collection, none given to a labelled one."""
    if is_partitioned(coll) and labels is not None:
        raise InvalidInputError(
            f"collection {coll['name']!r} has no labels (its classes are public partitions, computed from the "
            f"features); give {what}=None.")
    if not is_partitioned(coll) and labels is None:
        raise InvalidInputError(
            f"collection {coll['name']!r} is labelled: give {what}, or create a collection without labels "
            "(create_collection(name, dim, labels=None, partitions=C)).")


def item_labels(coll: Mapping[str, Any], X: np.ndarray) -> np.ndarray:
    """The labels of items ingested into a partitioned collection; a clear error before its anchor."""
    parts = stored(coll)
    if parts is None:
        raise InvalidInputError(
            f"collection {coll['name']!r} has no labels and no public partitions yet: register its public anchor "
            "first (register_anchor_set(name, X_anchor, None), or pm-vector ingest --role anchor); its partitions "
            "are fit on the anchor.")
    return assign(parts, X)
