"""Collections, bulk ingest, anchor sets, k-NN search and the request log: the Python client API.

Every function connects to :func:`pm_vector.db.server.database_url` (the embedded server by
default), validates its input *before* writing anything, and raises the exceptions of
:mod:`pm_vector.db.errors`. Metadata goes through the SQLAlchemy models; bulk data through
psycopg binary COPY.

Ingest writes in batches (``batch_size`` rows, each batch its own short transaction, so a
million rows never hold one transaction for minutes). All-or-nothing is kept without a long
transaction: every row carries its ingest's id, and an ingest that fails midway deletes the
rows it wrote before raising. An ingest process that is killed leaves an ``ingests`` row in
status ``running`` whose advisory lock is gone; :func:`cleanup` (also run by every embedding
job) deletes its rows and marks it ``failed``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .._validation import as_labels, as_matrix
from ..errors import InvalidInputError
from . import _binary
from ._common import (AnchorSet, _collection_row, _iso, _load_anchor_set, _worker,  # noqa: F401  (re-exported)
                      cleanup_stale_runs)
from .engine import connect, session_scope
from .errors import (
    CollectionExistsError,
    CollectionNotFoundError,
    DimensionMismatchError,
    DuplicateExternalIdError,
    RawFeaturesNotAllowedError,
    UnknownLabelError,
    translate_sql_error,
)

METRICS = ("l2", "cosine", "ip")
ROLES = ("anchor", "dummy")
HALFVEC_MAX = 65504.0
MAX_FEATURE_DIM = 16000
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$")
INGEST_LOCK_KIND = 2

ProgressFn = Callable[[int, int], None]


# ----------------------------------------------------------------------------- small helpers

def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInputError(
            f"invalid collection name {name!r}: use 1-128 characters from letters, digits and _ . : - "
            "(starting with a letter, digit or _).")
    return name


def _features(x, coll: Mapping[str, Any], what: str) -> np.ndarray:
    """Validated float32 matrix of the collection's dimension (NaN/inf refused, halfvec range checked).

    Converts to float32 once (no float64 copy of a large float32 input)."""
    if x is None:
        raise InvalidInputError(f"{what} is missing.")
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise InvalidInputError(f"{what} must be numeric; got dtype {a.dtype}.")
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        as_matrix(a, what)  # raises the shape error
    if a.shape[1] != coll["feature_dim"]:
        raise DimensionMismatchError(
            f"{what} has {a.shape[1]} features per row, but collection {coll['name']!r} has {coll['feature_dim']}.")
    if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
        bad = int(np.argwhere(~np.isfinite(a))[0][0])
        raise InvalidInputError(f"{what} contains NaN or infinite values (first at row {bad}); clean or drop those "
                                "rows.")
    a32 = np.ascontiguousarray(a, dtype=np.float32)
    if not np.all(np.isfinite(a32)):
        raise InvalidInputError(f"{what} has values too large for float32; rescale the features.")
    if coll["feature_type"] == "halfvec" and np.abs(a32).max() > HALFVEC_MAX:
        raise InvalidInputError(
            f"{what} has values beyond +-{HALFVEC_MAX:g}, which half precision (used above 2,000 dimensions) "
            "cannot hold; rescale the features (e.g. normalise rows).")
    return a32


def _labels(y, n: int, coll: Mapping[str, Any], what: str) -> np.ndarray:
    lab = as_labels(y, n, what)
    allowed = np.asarray(coll["labels"], dtype=np.int64)
    bad = np.flatnonzero(~np.isin(lab, allowed))
    if bad.size:
        raise UnknownLabelError(
            f"{what}[{int(bad[0])}] = {int(lab[bad[0]])} is not in the label set of collection {coll['name']!r} "
            f"({sorted(int(v) for v in allowed)}); {bad.size} row(s) affected.")
    return lab


def _json_safe(obj: Any, what: str) -> Any:
    try:
        json.dumps(obj, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} is not JSON-serialisable ({exc}); use dicts, lists, str, int, float, "
                                "bool, None.") from exc
    return obj


# ----------------------------------------------------------------------------- collections

def create_collection(name: str, dim: int, labels: Iterable[int], metric: str = "l2",
                      allow_raw_features: bool = False, *, description: str | None = None,
                      hnsw_m: int = 16, hnsw_ef_construction: int = 64, keep_previous_runs: int = 1,
                      settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Create a collection and return :func:`collection_info` of it.

    ``dim``: feature dimension (1-16,000; above 2,000 features are stored as ``halfvec``).
    ``labels``: the label set (integers). ``metric``: ``l2`` | ``cosine`` | ``ip`` for the
    embedding search. ``allow_raw_features``: whether raw item features may be returned to
    clients (:func:`fetch_items`). ``hnsw_m`` / ``hnsw_ef_construction``: HNSW build options of
    the runs' indexes. ``keep_previous_runs``: superseded successful runs kept (tables and all)
    after a switch, for rollback and for queries in flight. ``settings``: extra JSON settings.
    """
    _check_name(name)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 1 <= int(dim) <= MAX_FEATURE_DIM:
        raise InvalidInputError(f"dim must be an integer in 1..{MAX_FEATURE_DIM}, got {dim!r}.")
    dim = int(dim)
    lab = np.asarray(list(labels) if not isinstance(labels, np.ndarray) else labels)
    if lab.size == 0:
        raise InvalidInputError("labels must list at least one class label.")
    lab = as_labels(lab.ravel(), lab.size, "labels")
    if np.unique(lab).size != lab.size:
        raise InvalidInputError("labels must not repeat a label.")
    if metric not in METRICS:
        raise InvalidInputError(f"metric must be one of {METRICS}, got {metric!r}.")
    if not isinstance(allow_raw_features, bool):
        raise InvalidInputError("allow_raw_features must be True or False.")
    if not 2 <= int(hnsw_m) <= 100:
        raise InvalidInputError(f"hnsw_m must be in 2..100, got {hnsw_m}.")
    if not 4 <= int(hnsw_ef_construction) <= 1000 or int(hnsw_ef_construction) < 2 * int(hnsw_m):
        raise InvalidInputError(
            f"hnsw_ef_construction must be in 4..1000 and at least 2 * hnsw_m ({2 * int(hnsw_m)}), "
            f"got {hnsw_ef_construction}.")
    if int(keep_previous_runs) < 0:
        raise InvalidInputError("keep_previous_runs must be >= 0.")
    st: dict[str, Any] = dict(settings or {})
    st.update({"allow_raw_features": allow_raw_features, "hnsw_m": int(hnsw_m),
               "hnsw_ef_construction": int(hnsw_ef_construction), "keep_previous_runs": int(keep_previous_runs)})
    if description is not None:
        st["description"] = str(description)
    _json_safe(st, "settings")

    import sqlalchemy.exc

    from .models import Collection

    try:
        with session_scope() as s:
            s.add(Collection(name=name, feature_dim=dim, feature_type="vector" if dim <= 2000 else "halfvec",
                             metric=metric, labels=[int(v) for v in sorted(lab)], settings=st))
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
        row = s.execute(text("SELECT * FROM pm_vector.pm_collections WHERE name = :n"), {"n": name}).mappings().first()
    if row is None:
        raise CollectionNotFoundError(
            f"unknown collection {name!r}; list_collections() shows the existing ones.")
    return _info_dict(row)


def list_collections() -> list[dict[str, Any]]:
    """All collections (see :func:`collection_info`), by name."""
    from sqlalchemy import text

    with session_scope() as s:
        rows = s.execute(text("SELECT * FROM pm_vector.pm_collections ORDER BY name")).mappings().all()
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


# ----------------------------------------------------------------------------- ingest

def _external_ids(external_ids, n: int) -> list[str | None] | None:
    if external_ids is None:
        return None
    ids = list(external_ids)
    if len(ids) != n:
        raise InvalidInputError(f"external_ids has {len(ids)} entries for {n} rows; give one per row (or None).")
    out: list[str | None] = []
    for i, v in enumerate(ids):
        if v is None:
            out.append(None)
        elif isinstance(v, (str, int, np.integer)) and not isinstance(v, bool):
            s = str(v)
            if not s or len(s) > 1000 or "\x00" in s:
                raise InvalidInputError(f"external_ids[{i}] must be a non-empty string of at most 1,000 characters "
                                        "without NUL.")
            out.append(s)
        else:
            raise InvalidInputError(f"external_ids[{i}] must be a str or int, got {type(v).__name__}.")
    seen: dict[str, int] = {}
    for i, s in enumerate(out):
        if s is None:
            continue
        if s in seen:
            raise DuplicateExternalIdError(
                f"external id {s!r} occurs twice in the input (rows {seen[s]} and {i}); nothing was written.")
        seen[s] = i
    return out


def _payloads(payloads, n: int) -> list[Any] | None:
    if payloads is None:
        return None
    p = list(payloads)
    if len(p) != n:
        raise InvalidInputError(f"payloads has {len(p)} entries for {n} rows; give one per row (or None).")
    for i, v in enumerate(p):
        if v is not None:
            _json_safe(v, f"payloads[{i}]")
    return p


def _existing_external_ids(conn, cid: int, ids: list[str | None], chunk: int = 20000) -> list[str]:
    present = [s for s in ids if s is not None]
    found: list[str] = []
    for i in range(0, len(present), chunk):
        rows = conn.execute(
            "SELECT external_id FROM pm_vector.items WHERE collection_id = %s AND external_id = ANY(%s) LIMIT 5",
            [cid, present[i:i + chunk]]).fetchall()
        found += [r[0] for r in rows]
        if found:
            break
    conn.rollback()
    return found


def _lock_key(conn, kind: int, ident: int) -> int:
    return conn.execute("SELECT pm_vector.pm_lock_key(%s, %s)", [kind, ident]).fetchone()[0]


def ingest(collection: str, features, labels, external_ids: Sequence[Any] | None = None,
           payloads: Sequence[Any] | None = None, *, batch_size: int = 10_000,
           progress: ProgressFn | None = None) -> dict[str, Any]:
    """Add items to a collection by binary COPY, in batches; all-or-nothing.

    ``features``: (n, dim) numbers (stored as float32, or float16 above 2,000 dims); NaN/inf
    refused. ``labels``: n integers from the collection's label set. ``external_ids``: optional
    n strings (or ints, stored as text; None entries allowed), unique within the collection.
    ``payloads``: optional n JSON-serialisable values. ``progress(done, total)`` is called
    after each committed batch.

    Returns ``{"ingest_id", "n_rows", "item_ids"}`` (``item_ids``: int64 array, input order).
    Bad input raises before anything is written; a failure midway (e.g. a concurrent insert
    of the same external id) deletes the rows already written, then raises.
    """
    if isinstance(batch_size, bool) or int(batch_size) < 1:
        raise InvalidInputError("batch_size must be a positive integer.")
    batch_size = int(batch_size)
    conn = connect()
    try:
        coll = _collection_row(conn, collection)
        conn.rollback()
        X = _features(features, coll, "features")
        n = X.shape[0]
        y = _labels(labels, n, coll, "labels")
        ext = _external_ids(external_ids, n)
        pay = _payloads(payloads, n)
        if ext is not None:
            dup = _existing_external_ids(conn, coll["id"], ext)
            if dup:
                raise DuplicateExternalIdError(
                    f"external id(s) {dup} already exist in collection {collection!r}; nothing was written.")
        return _ingest_rows(conn, coll, X, y, ext, pay, batch_size, progress)
    finally:
        conn.close()


def _ingest_rows(conn, coll, X, y, ext, pay, batch_size, progress) -> dict[str, Any]:
    """Write validated rows: fixed-width columns encoded by numpy, external id and payload
    (``jsonb`` binary: version byte 1 + JSON text) appended per row."""
    from psycopg.types.json import Jsonb

    n = X.shape[0]
    cid = coll["id"]
    ftype = coll["feature_type"]
    col = "features" if ftype == "vector" else "features_half"
    ingest_id = conn.execute(
        "INSERT INTO pm_vector.ingests (collection_id, status, n_rows, worker) VALUES (%s, 'running', %s, %s) "
        "RETURNING id", [cid, n, Jsonb(_worker())]).fetchone()[0]
    key = _lock_key(conn, INGEST_LOCK_KIND, ingest_id)
    conn.execute("SELECT pg_advisory_lock(%s)", [key])
    conn.commit()
    item_ids = np.empty(n, dtype=np.int64)
    try:
        seq = conn.execute("SELECT pg_get_serial_sequence('pm_vector.items', 'id')").fetchone()[0]
        done = 0
        while done < n:
            stop = min(n, done + batch_size)
            ids = np.fromiter((r[0] for r in conn.execute(
                "SELECT nextval(%s::regclass) FROM generate_series(1, %s)", [seq, stop - done])),
                dtype=np.int64, count=stop - done)
            item_ids[done:stop] = ids
            m = stop - done
            tails = [[None if ext is None or ext[j] is None else ext[j].encode("utf-8") for j in range(done, stop)],
                     [None if pay is None or pay[j] is None
                      else b"\x01" + json.dumps(pay[j], allow_nan=False).encode("utf-8") for j in range(done, stop)]]
            stream = _binary.encode_with_tail(
                [("id", "int8", 0), ("collection_id", "int8", 0), ("label", "int8", 0), ("ingest_id", "int8", 0),
                 (col, ftype, X.shape[1])],
                {"id": ids, "collection_id": np.full(m, cid, dtype=np.int64), "label": y[done:stop],
                 "ingest_id": np.full(m, ingest_id, dtype=np.int64), col: X[done:stop]},
                tails)
            _binary.copy_in(conn, f"COPY pm_vector.items (id, collection_id, label, ingest_id, {col}, external_id, "
                                  "payload) FROM STDIN (FORMAT BINARY)", stream)
            conn.execute("UPDATE pm_vector.ingests SET n_written = %s WHERE id = %s", [stop, ingest_id])
            conn.commit()
            done = stop
            if progress is not None:
                progress(done, n)
        conn.execute("UPDATE pm_vector.ingests SET status = 'succeeded', finished_at = now() WHERE id = %s",
                     [ingest_id])
        conn.commit()
    except BaseException as exc:
        _undo_ingest(conn, cid, ingest_id, f"{exc.__class__.__name__}: {exc}")
        err = translate_sql_error(exc)
        if err is exc:
            raise
        raise err from exc
    finally:
        try:
            if not conn.closed:
                conn.execute("SELECT pg_advisory_unlock(%s)", [key])
                conn.commit()
        except Exception:  # noqa: BLE001 - closing the connection releases it anyway
            pass
    return {"ingest_id": int(ingest_id), "n_rows": int(n), "item_ids": item_ids}


def _undo_ingest(conn, cid: int, ingest_id: int, error: str) -> None:
    """Delete an ingest's rows and mark it failed (on ``conn`` if usable, else a new connection)."""
    import psycopg

    def work(c):
        c.execute("DELETE FROM pm_vector.items WHERE collection_id = %s AND ingest_id = %s", [cid, ingest_id])
        c.execute("UPDATE pm_vector.ingests SET status = 'failed', error = %s, finished_at = now() WHERE id = %s",
                  [error[:2000], ingest_id])
        c.commit()

    try:
        if conn.closed:
            raise psycopg.OperationalError("connection closed")
        conn.rollback()
        work(conn)
    except psycopg.Error:
        with connect() as c2:
            work(c2)


# ----------------------------------------------------------------------------- anchor sets

def register_anchor_set(collection: str, features, labels, role: str = "anchor", *,
                        description: str | None = None) -> dict[str, Any]:
    """Store a public anchor set (``role='anchor'``) or public dummy pool (``role='dummy'``).

    Row order is kept: anchor ``i`` is row ``i``. A new registration for the same role becomes
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
            y = _labels(labels, X.shape[0], coll, f"{role} labels")
            if provenance is not None:
                _json_safe(provenance, "provenance")
            checked.append((role, X, y, description, provenance))
        ftype = coll["feature_type"]
        col = "features" if ftype == "vector" else "features_half"
        out = []
        try:
            from psycopg.types.json import Jsonb

            coll = _collection_row(conn, collection, lock="FOR SHARE")
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


# ----------------------------------------------------------------------------- cleanup

def cleanup(collection: str | None = None) -> dict[str, list[int]]:
    """Find work whose process died and undo it; returns ``{"runs": [...], "ingests": [...]}``.

    A ``running`` embedding run or ingest whose advisory lock no session holds has lost its
    worker (process killed, connection gone). Such runs are marked ``failed`` and their tables
    dropped (they were never active); such ingests have their rows deleted and are marked
    ``failed``. Safe to run any time, from any process.
    """
    runs = cleanup_stale_runs(collection)
    ingests: list[int] = []
    with connect() as conn:
        cid = None
        if collection is not None:
            cid = _collection_row(conn, collection)["id"]
        rows = conn.execute(
            "SELECT id, collection_id FROM pm_vector.ingests WHERE status = 'running' "
            "AND (%s::bigint IS NULL OR collection_id = %s) "
            "AND NOT pm_vector.pm_lock_held(pm_vector.pm_lock_key(2, id))", [cid, cid]).fetchall()
        conn.rollback()
        for iid, c in rows:
            row = conn.execute(
                "SELECT status FROM pm_vector.ingests WHERE id = %s FOR UPDATE", [iid]).fetchone()
            held = conn.execute("SELECT pm_vector.pm_lock_held(pm_vector.pm_lock_key(2, %s))", [iid]).fetchone()[0]
            if row is None or row[0] != "running" or held:
                conn.rollback()
                continue
            conn.execute("DELETE FROM pm_vector.items WHERE collection_id = %s AND ingest_id = %s", [c, iid])
            conn.execute("UPDATE pm_vector.ingests SET status = 'failed', finished_at = now(), "
                         "error = 'abandoned: its process ended before the ingest finished; its rows were deleted' "
                         "WHERE id = %s", [iid])
            conn.commit()
            ingests.append(int(iid))
    return {"runs": runs, "ingests": ingests}
