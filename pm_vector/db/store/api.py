"""Items and the plain k-NN search: items by id and the
k nearest items of the active run (``pm_vector.pm_knn`` / ``pm_knn_batch``), without privacy.

Every function connects to :func:`pm_vector.db.postgres.database_url` (the embedded server by
default), validates its input *before* reading, and raises the exceptions of
:mod:`pm_vector.db.errors`. Collections, anchor sets and the request log have their own modules
(:mod:`~pm_vector.db.store.collections`, :mod:`~pm_vector.db.store.anchors`,
:mod:`~pm_vector.db.store.request_log`); :mod:`pm_vector.db.store` is the face of all of them.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from pgvector import Vector
from psycopg import sql

from ..._validation import as_matrix
from ...errors import InvalidInputError
from ..errors import RawFeaturesNotAllowedError, translate_sql_error
from ..postgres import connect
from ..core.collection import collection_row
from ..core.features import feature_sql

# ----------------------------------------------------------------------------- items

def fetch_items(collection: str, item_ids: Sequence[int], *, include_features: bool = False) -> dict[str, Any]:
    """Items by id, in the order given: ``{"item_ids", "external_ids", "labels", "payloads"}``
    (+ ``"features"`` if ``include_features``, which the collection's ``allow_raw_features``
    setting must permit). Unknown ids raise :class:`InvalidInputError`."""
    ids = np.asarray(item_ids, dtype=np.int64).ravel()
    with connect() as conn:
        coll = collection_row(conn, collection)
        if include_features and not coll["settings"].get("allow_raw_features", False):
            raise RawFeaturesNotAllowedError(
                f"collection {collection!r} does not allow returning raw features to clients (its setting "
                "allow_raw_features is false); create it with allow_raw_features=True to permit it.")

        feat = sql.SQL(", {}").format(feature_sql(coll)) if include_features else sql.SQL("")
        # the ids literals, no parameters: an attached table's names may hold a '%' (feature_sql)
        rows = conn.execute(sql.SQL(
            "SELECT i.id, i.external_id, i.label, i.payload{} FROM unnest({}::bigint[]) WITH ORDINALITY AS u(id, o) "
            "LEFT JOIN pm_vector.items i ON i.id = u.id AND i.collection_id = {} ORDER BY u.o").format(
                feat, sql.Literal(ids.tolist()), sql.Literal(int(coll["id"])))).fetchall()
    missing = [int(ids[k]) for k, r in enumerate(rows) if r[0] is None]
    if missing:
        raise InvalidInputError(f"item id(s) {missing[:5]} are not in collection {collection!r}.")
    out: dict[str, Any] = {"item_ids": ids, "external_ids": [r[1] for r in rows],
                           "labels": np.array([r[2] for r in rows], dtype=np.int64),
                           "payloads": [r[3] for r in rows]}
    if include_features:
        out["features"] = (np.stack([np.asarray(r[4].to_numpy() if hasattr(r[4], "to_numpy") else r[4],
                                                dtype=np.float32) for r in rows])
                           if rows else np.zeros((0, coll["feature_dim"]), np.float32))
    return out


# ----------------------------------------------------------------------------- k-NN search

def _query_matrix(q, name: str) -> np.ndarray:
    a = as_matrix(q, name)
    return a.astype(np.float32)


def knn(collection: str, query, k: int, *, ef_search: int | None = None) -> dict[str, Any]:
    """The k items of the active run nearest to ``query`` (a point of the embedding space),
    via ``pm_vector.pm_knn``. Returns ``{"item_ids", "external_ids", "labels", "distances"}``."""
    qv = _query_matrix(np.asarray(query).reshape(1, -1), "query")[0]
    with connect() as conn:
        try:
            rows = conn.execute("SELECT rank, item_id, external_id, label, distance "
                                "FROM pm_vector.pm_knn(%s, %s, %s, %s)",
                                [collection, Vector(qv), int(k), ef_search]).fetchall()
        except Exception as exc:
            err = translate_sql_error(exc)
            if err is exc:
                raise
            raise err from None
    return {"item_ids": np.array([r[1] for r in rows], dtype=np.int64),
            "external_ids": [r[2] for r in rows],
            "labels": np.array([r[3] for r in rows], dtype=np.int64),
            "distances": np.array([r[4] for r in rows], dtype=np.float64)}


def knn_batch(collection: str, queries, k: int, *, ef_search: int | None = None) -> dict[str, Any]:
    """k-NN of many queries in one statement (``pm_vector.pm_knn_batch``).

    Returns arrays of shape (n_queries, k): ``item_ids`` and ``labels`` (-1 where a query got
    fewer than k rows), ``distances`` (NaN there), ``external_ids`` (list of lists) and
    ``counts`` (rows per query)."""
    Q = _query_matrix(queries, "queries")
    k = int(k)
    with connect() as conn:
        try:
            rows = conn.execute("SELECT query_index, rank, item_id, external_id, label, distance "
                                "FROM pm_vector.pm_knn_batch(%s, %s::vector[], %s, %s)",
                                [collection, [Vector(r) for r in Q], k, ef_search]).fetchall()
        except Exception as exc:
            err = translate_sql_error(exc)
            if err is exc:
                raise
            raise err from None
    nq = Q.shape[0]
    ids = np.full((nq, k), -1, dtype=np.int64)
    labels = np.full((nq, k), -1, dtype=np.int64)
    dist = np.full((nq, k), np.nan)
    ext: list[list[Any]] = [[None] * k for _ in range(nq)]
    counts = np.zeros(nq, dtype=np.int64)
    for qi, rank, iid, eid, lab, d in rows:
        i, j = qi - 1, rank - 1
        ids[i, j], labels[i, j], dist[i, j], ext[i][j] = iid, lab, d, eid
        counts[i] += 1
    return {"item_ids": ids, "external_ids": ext, "labels": labels, "distances": dist, "counts": counts}
