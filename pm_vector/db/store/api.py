"""Collections, bulk ingest, anchor sets, k-NN search and the request log: the Python client API.

Every function connects to :func:`pm_vector.db.postgres.database_url` (the embedded server by
default), validates its input *before* writing anything, and raises the exceptions of
:mod:`pm_vector.db.errors`. Metadata goes through the SQLAlchemy models; bulk data through
psycopg binary COPY.

:func:`ingest` (one transaction, all-or-nothing) lives in :mod:`pm_vector.db.store.bulk`, :func:`cleanup`
in :mod:`pm_vector.db.store.maintenance`, the input checks in :mod:`pm_vector.db.store._validate`; all are
re-exported here.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..._validation import as_matrix
from ...errors import InvalidInputError
from .. import _binary
from ._common import (  # noqa: F401  (re-exported)
    AnchorSet,
    _collection_row,
    _iso,
    _load_anchor_set,
    _worker,
    cleanup_stale_runs,
)
from ._validate import (  # noqa: F401  (re-exported)
    _NAME,
    HALFVEC_MAX,
    MAX_FEATURE_DIM,
    METRICS,
    ROLES,
    _check_name,
    _collection_spec,
    _features,
    _json_safe,
    _labels,
)
from .bulk import ProgressFn, ingest  # noqa: F401  (re-exported: pm_vector.db.ingest)
from ..postgres import connect, session_scope
from ..errors import (  # noqa: F401  (re-exported)
    CollectionExistsError,
    CollectionNotFoundError,
    DimensionMismatchError,
    DuplicateExternalIdError,
    RawFeaturesNotAllowedError,
    UnknownLabelError,
    translate_sql_error,
)
from .maintenance import cleanup  # noqa: F401  (re-exported: pm_vector.db.cleanup)
from . import partitioned

# ----------------------------------------------------------------------------- collections

def create_collection(name: str, dim: int, labels: Iterable[int] | None, metric: str = "l2",
                      allow_raw_features: bool = False, *, description: str | None = None,
                      hnsw_m: int = 16, hnsw_ef_construction: int = 64, keep_previous_runs: int = 1,
                      settings: Mapping[str, Any] | None = None, partitions: int | None = None,
                      max_payload_bytes: int | None = None) -> dict[str, Any]:
    """Create a collection and return :func:`collection_info` of it.

    ``dim``: feature dimension (1-16,000; above 2,000 features are stored as ``halfvec``).
    ``labels``: the label set (integers). ``metric``: ``l2`` | ``cosine`` | ``ip`` for the
    embedding search. ``allow_raw_features``: whether raw item features may be returned to
    clients (:func:`fetch_items`). ``hnsw_m`` / ``hnsw_ef_construction``: HNSW build options of
    the runs' indexes. ``keep_previous_runs``: superseded successful runs kept (tables and all)
    after a switch, for rollback and for queries in flight. ``settings``: extra JSON settings.
    ``max_payload_bytes``: the bound on each item's payload, in bytes of compact JSON (0..65,536;
    None: ``settings["max_payload_bytes"]`` if given, else 256); an admin changes it with
    :func:`~pm_vector.db.store.payloads.set_max_payload_bytes` (:mod:`pm_vector.db.store.payloads`).

    ``labels=None``: a collection **without labels** whose classes are ``partitions`` (default
    10) public partitions ``0..C-1`` (:mod:`pm_vector.db.store.partitioned`): its first anchor set
    registered without labels fits them (k-means of the public anchor's features), then anchor,
    dummy and item rows are labelled by their nearest partition (ingest them with labels=None).
    """
    spec = _collection_spec(name, dim, labels, metric, allow_raw_features, description=description, hnsw_m=hnsw_m,
                            hnsw_ef_construction=hnsw_ef_construction, keep_previous_runs=keep_previous_runs,
                            settings=settings, partitions=partitions, max_payload_bytes=max_payload_bytes)
    import sqlalchemy.exc

    from .models import Collection

    try:
        with session_scope() as s:
            s.add(Collection(**spec))
    except sqlalchemy.exc.IntegrityError as exc:
        if "uq_collections_name" in str(exc):
            raise CollectionExistsError(
                f"a collection named {name!r} already exists; pick another name or drop_collection({name!r}) "
                "first.") from None
        raise
    return collection_info(name)


def _info_dict(row: Mapping[str, Any]) -> dict[str, Any]:
    d = {k: _iso(v) for k, v in dict(row).items()}
    d["labels"] = [int(v) for v in d["labels"]]
    return d


def collection_info(name: str) -> dict[str, Any]:
    """One collection (a row of the ``pm_vector.pm_collections`` view) as a dict.

    Keys: id, name, feature_dim, feature_type, metric, labels, allow_raw_features, settings,
    n_items, active_run_id, active_embedding_dim, active_since, anchor_set_id, n_anchors,
    dummy_set_id, n_dummies, created_at, updated_at.
    """
    from sqlalchemy import text

    with session_scope() as s:
        row = s.execute(text("SELECT v.*, c.uuid::text AS uuid FROM pm_vector.pm_collections v "
                                 "JOIN pm_vector.collections c USING (id) WHERE v.name = :n"), {"n": name}).mappings().first()
    if row is None:
        raise CollectionNotFoundError(
            f"unknown collection {name!r}; list_collections() shows the existing ones.")
    return _info_dict(row)


def list_collections() -> list[dict[str, Any]]:
    """All collections (see :func:`collection_info`), by name."""
    from sqlalchemy import text

    with session_scope() as s:
        rows = s.execute(text("SELECT v.*, c.uuid::text AS uuid FROM pm_vector.pm_collections v "
                                  "JOIN pm_vector.collections c USING (id) ORDER BY v.name")).mappings().all()
    return [_info_dict(r) for r in rows]


def drop_collection(name: str, *, missing_ok: bool = False) -> dict[str, Any]:
    """Delete a collection with its items, anchor sets, runs (and their tables); one transaction.

    Returns ``{"name", "dropped", "n_items", "n_runs"}``. The request log keeps its rows
    (their ``collection_id`` becomes NULL).
    """
    with connect() as conn:
        try:
            coll = _collection_row(conn, name, lock="FOR UPDATE")
        except CollectionNotFoundError:
            if missing_ok:
                return {"name": name, "dropped": False, "n_items": 0, "n_runs": 0}
            raise
        cid = coll["id"]
        n_items = conn.execute("SELECT count(*) FROM pm_vector.items WHERE collection_id = %s", [cid]).fetchone()[0]
        runs = [r[0] for r in conn.execute("SELECT id FROM pm_vector.embedding_runs WHERE collection_id = %s",
                                           [cid]).fetchall()]
        conn.execute("UPDATE pm_vector.collections SET active_run_id = NULL WHERE id = %s", [cid])
        for rid in runs:
            conn.execute("SELECT pm_vector.pm_drop_run_tables(%s)", [rid])
        conn.execute("DELETE FROM pm_vector.collections WHERE id = %s", [cid])
        conn.commit()
    return {"name": name, "dropped": True, "n_items": int(n_items), "n_runs": len(runs)}


# ----------------------------------------------------------------------------- anchor sets

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
        coll = _collection_row(conn, collection)
        conn.rollback()
        checked = []
        for role, features, labels, description, provenance in sets:
            if role not in ROLES:
                raise InvalidInputError(f"role must be one of {ROLES}, got {role!r}.")
            X = _features(features, coll, f"{role} features")
            partitioned.refuse_labels(coll, labels, f"{role} labels")
            y = None if labels is None else _labels(labels, X.shape[0], coll, f"{role} labels")
            if provenance is not None:
                _json_safe(provenance, "provenance")
            checked.append((role, X, y, description, provenance))
        ftype = coll["feature_type"]
        col = "features" if ftype == "vector" else "features_half"
        out = []
        try:
            from psycopg.types.json import Jsonb

            part = partitioned.is_partitioned(coll)
            coll = _collection_row(conn, collection, lock="FOR UPDATE" if part else "FOR SHARE")
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
                _binary.copy_in(conn, f"COPY pm_vector.anchors (anchor_set_id, position, label, {col}) "
                                      "FROM STDIN (FORMAT BINARY)", stream)
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
    from psycopg.types.json import Jsonb

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
        coll = _collection_row(conn, collection)
        return _load_anchor_set(conn, coll, role, anchor_set_id)


# ----------------------------------------------------------------------------- items

def _load_items(conn, coll: Mapping[str, Any], where: str = "", params: Sequence[Any] = ()) -> dict[str, np.ndarray]:
    """ids, labels, features (float32) of a collection's items by binary COPY, ordered by id."""
    from psycopg import sql

    ftype = coll["feature_type"]
    col = "features" if ftype == "vector" else "features_half"
    q = sql.SQL("SELECT i.id, i.label, i.{} FROM pm_vector.items i WHERE i.collection_id = {} {} ORDER BY i.id").format(
        sql.Identifier(col), sql.Literal(int(coll["id"])), sql.SQL(where))
    query = q.as_string(conn)
    if params:
        query = sql.SQL(query).format(*[sql.Literal(p) for p in params]).as_string(conn)
    buf = _binary.copy_out(conn, query)
    d = _binary.decode([("id", "int8", 0), ("label", "int8", 0), ("features", ftype, coll["feature_dim"])], buf)
    return d


def fetch_items(collection: str, item_ids: Sequence[int], *, include_features: bool = False) -> dict[str, Any]:
    """Items by id, in the order given: ``{"item_ids", "external_ids", "labels", "payloads"}``
    (+ ``"features"`` if ``include_features``, which the collection's ``allow_raw_features``
    setting must permit). Unknown ids raise :class:`InvalidInputError`."""
    ids = np.asarray(item_ids, dtype=np.int64).ravel()
    with connect() as conn:
        coll = _collection_row(conn, collection)
        if include_features and not coll["settings"].get("allow_raw_features", False):
            raise RawFeaturesNotAllowedError(
                f"collection {collection!r} does not allow returning raw features to clients (its setting "
                "allow_raw_features is false); create it with allow_raw_features=True to permit it.")
        col = "features" if coll["feature_type"] == "vector" else "features_half"
        feat = f", i.{col}" if include_features else ""
        rows = conn.execute(
            f"SELECT i.id, i.external_id, i.label, i.payload{feat} FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(id, o) "
            "LEFT JOIN pm_vector.items i ON i.id = u.id AND i.collection_id = %s ORDER BY u.o",
            [ids.tolist(), coll["id"]]).fetchall()
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
    from pgvector import Vector

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
    from pgvector import Vector

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


# ----------------------------------------------------------------------------- request log

def log_request(collection: str, request: Any, *, run_id: int | None = None, row_count: int | None = None,
                received_at: dt.datetime | None = None, finished_at: dt.datetime | None = None,
                duration_ms: float | None = None, status: str = "ok", error: str | None = None,
                conn=None, request_json: str | None = None) -> int:
    """Record a resolved request: only what the client released (``request``, JSON), timing and
    the number of rows returned. Never pass raw client data here. Returns the log id.

    ``request_json``: the request as the JSON text the client sent, stored instead of
    serialising ``request`` again (the server's copy of exactly what was received; PostgreSQL
    checks it is JSON). ``conn``: an idle connection to use (committed here) instead of a new one.
    """
    from psycopg.types.json import Jsonb

    if status not in ("ok", "error"):
        raise InvalidInputError("status must be 'ok' or 'error'.")
    if request_json is not None:
        if not isinstance(request_json, str):
            raise InvalidInputError("request_json must be JSON text (str).")
        value = Jsonb(None, dumps=lambda _obj: request_json)
    else:
        _json_safe(request, "request")
        value = Jsonb(request)
    if duration_ms is None and received_at is not None and finished_at is not None:
        duration_ms = (finished_at - received_at).total_seconds() * 1000.0
    if duration_ms is not None and not math.isfinite(float(duration_ms)):
        raise InvalidInputError("duration_ms must be finite.")
    own = conn is None
    if own:
        conn = connect()
    try:
        log_id = conn.execute(
            "INSERT INTO pm_vector.request_log (collection_id, collection_name, run_id, request, status, error, "
            "row_count, received_at, finished_at, duration_ms) "
            "VALUES ((SELECT id FROM pm_vector.collections WHERE name = %s), %s, %s, %s, %s, %s, %s, "
            "coalesce(%s, now()), %s, %s) RETURNING id",
            [collection, collection, run_id, value, status, error, row_count, received_at,
             finished_at, duration_ms]).fetchone()[0]
        if not conn.autocommit:
            conn.commit()
    except BaseException:
        if not conn.autocommit:
            conn.rollback()
        raise
    finally:
        if own:
            conn.close()
    return int(log_id)


def list_requests(collection: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The newest logged requests (rows of ``pm_vector.pm_requests``), newest first."""
    from psycopg.rows import dict_row

    with connect() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            if collection is None:
                cur.execute("SELECT * FROM pm_vector.pm_requests ORDER BY id DESC LIMIT %s", [int(limit)])
            else:
                cur.execute("SELECT * FROM pm_vector.pm_requests WHERE collection = %s ORDER BY id DESC LIMIT %s",
                            [collection, int(limit)])
            return [{k: _iso(v) for k, v in r.items()} for r in cur.fetchall()]
