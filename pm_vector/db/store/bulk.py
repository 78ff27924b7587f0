"""Bulk ingest of items: binary COPY in batches inside ONE transaction (all-or-nothing).

No reader, embedding job or ``embed_new_items`` sees a row before the whole ingest commits; a
failure or a killed process (the server rolls the transaction back when the connection drops,
within ``client_connection_check_interval`` even mid-statement) leaves the collection exactly as
it was. The transaction takes only row-insert locks (KEY SHARE on the collection row through the
foreign key): queries, other ingests and embedding jobs (whose switch takes NO KEY UPDATE) go on
meanwhile. With ``create=`` the collection row is inserted in the same transaction, so a failed
first ingest leaves no empty collection behind.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ..._validation import as_labels, as_matrix
from ...errors import InvalidInputError
from .. import _binary
from . import partitioned, payloads as _payload_bound
from ..core.collection import collection_row, worker_identity
from ._validate import collection_spec, checked_features, checked_labels
from ..postgres import connect
from ..errors import CollectionExistsError, DuplicateExternalIdError, translate_sql_error
from ..runs.new_items import embed_new_items

ProgressFn = Callable[[int, int], None]


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


def ingest(collection: str, features, labels, external_ids: Sequence[Any] | None = None,
           payloads: Sequence[Any] | None = None, *, batch_size: int = 10_000,
           progress: ProgressFn | None = None, create: Mapping[str, Any] | None = None,
           embed_fn_extend=None) -> dict[str, Any]:
    """Add items to a collection by binary COPY, in batches, in ONE transaction: all-or-nothing.

    ``embed_fn_extend``: when given and the collection has an active run, the new items are placed
    in that run right after the commit (:func:`pm_vector.db.runs.new_items.embed_new_items`: the
    run's delta, :mod:`pm_vector.db.runs.delta`), so the location release answers them at once
    (``"placed"``: how many).

    ``features``: (n, dim) real numbers (stored as float32, or float16 above 2,000 dims); NaN/inf
    refused. ``labels``: n integers from the collection's label set; None for a collection without
    labels (each item gets its nearest public partition, :mod:`pm_vector.db.store.partitioned`).
    ``external_ids``: optional n strings (or ints, stored as text; None entries allowed), unique
    within the collection. ``payloads``: optional n JSON values (None entries allowed), each at most
    the collection's ``max_payload_bytes`` of compact JSON (:mod:`pm_vector.db.store.payloads`; an
    oversized one is refused naming its row and the bound, nothing written). ``progress(done,
    total)`` is called after each batch is written (visible to others only when the whole ingest
    commits).
    ``create``: create the collection in the same transaction, with these
    :func:`create_collection` keyword arguments (``dim`` is taken from ``features``;
    ``labels`` defaults to the distinct labels given): an ingest that fails or is killed leaves
    no collection behind.

    Returns ``{"ingest_id", "n_rows", "item_ids"}`` (``item_ids``: int64 array, input order).
    Bad input raises before anything is written. Until the final commit no reader (queries,
    ``n_items``, embedding jobs, :func:`~pm_vector.db.runs.new_items.embed_new_items`) sees any row: a
    failure or a killed process (SIGKILL included: the server rolls back when the connection
    drops) leaves the collection exactly as it was.
    """
    if isinstance(batch_size, bool) or int(batch_size) < 1:
        raise InvalidInputError("batch_size must be a positive integer.")
    batch_size = int(batch_size)
    spec = None
    if create is not None:
        if not isinstance(create, Mapping):
            raise InvalidInputError("create must be a dict of create_collection() keyword arguments, or None.")
        a = np.asarray(features) if features is not None else None
        if a is None or a.ndim != 2:
            as_matrix(a, "features")
        kw = dict(create)
        if labels is not None and "partitions" not in kw:
            kw.setdefault("labels", np.unique(as_labels(labels, np.asarray(labels).size, "labels")))
        kw.setdefault("labels", None)
        spec = collection_spec(collection, a.shape[1], **kw)
    conn = connect(watch_client=True)
    try:
        if spec is None:
            coll = collection_row(conn, collection)
            conn.rollback()
        else:
            coll = {**spec, "id": None}
        X = checked_features(features, coll, "features")
        n = X.shape[0]
        partitioned.refuse_labels(coll, labels, "labels")
        y = partitioned.item_labels(coll, X) if labels is None else checked_labels(labels, n, coll, "labels")
        ext = _external_ids(external_ids, n)
        pay, biggest = _payload_bound.check_payloads(payloads, n, _payload_bound.limit_of(coll), collection)
        if ext is not None and spec is None:
            dup = _existing_external_ids(conn, coll["id"], ext)
            if dup:
                raise DuplicateExternalIdError(
                    f"external id(s) {dup} already exist in collection {collection!r}; nothing was written.")
        out = _ingest_rows(conn, coll, spec, X, y, ext, pay, batch_size, progress, biggest)
    finally:
        conn.close()
    if embed_fn_extend is not None and spec is None and coll.get("active_run_id") is not None:
        out["placed"] = int(embed_new_items(collection, embed_fn_extend)["n_new"])
    return out


def _insert_collection(conn, spec: Mapping[str, Any]) -> int:
    """Insert a new collection row on ``conn`` (no commit); CollectionExistsError if the name is taken."""
    try:
        return conn.execute(
            "INSERT INTO pm_vector.collections (name, feature_dim, feature_type, metric, labels, settings) "
            "VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
            [spec["name"], spec["feature_dim"], spec["feature_type"], spec["metric"], spec["labels"],
             Jsonb(spec["settings"])]).fetchone()[0]
    except psycopg.errors.UniqueViolation as exc:
        if getattr(exc.diag, "constraint_name", None) == "uq_collections_name":
            raise CollectionExistsError(
                f"a collection named {spec['name']!r} already exists; ingest without --create/create=, or pick "
                "another name.") from None
        raise


def _ingest_rows(conn, coll, spec, X, y, ext, pay, batch_size, progress, biggest: int = 0) -> dict[str, Any]:
    """Write validated rows in one transaction: fixed-width columns encoded by numpy, external id
    and payload (``jsonb`` binary: version byte 1 + JSON text) appended per row. With ``spec``
    the collection row is inserted first, in the same transaction. ``biggest``: the largest
    payload's size, checked against the collection's bound again just before the commit."""
    n = X.shape[0]
    ftype = coll["feature_type"]
    col = "features" if ftype == "vector" else "features_half"
    item_ids = np.empty(n, dtype=np.int64)
    cid = coll["id"]
    try:
        if spec is not None:
            cid = _insert_collection(conn, spec)
        ingest_id = conn.execute(
            "INSERT INTO pm_vector.ingests (collection_id, status, n_rows, worker) VALUES (%s, 'running', %s, %s) "
            "RETURNING id", [cid, n, Jsonb(worker_identity())]).fetchone()[0]
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
            _binary.copy_in(conn, sql.SQL("COPY pm_vector.items (id, collection_id, label, ingest_id, {}, external_id, "
                                          "payload) FROM STDIN (FORMAT BINARY)").format(sql.Identifier(col)), stream)
            done = stop
            if progress is not None:
                progress(done, n)
        # the high-water mark raised in this transaction (before the share lock of the check below: a
        # raise takes the row's lock first, so two ingests never wait on each other's share lock)
        _payload_bound.raise_high(conn, cid, biggest)
        if pay is not None and spec is None:  # the bound as it is at the commit (an admin may have lowered it)
            _payload_bound.recheck_locked(conn, cid, coll["name"], biggest)
        conn.execute("UPDATE pm_vector.ingests SET status = 'succeeded', n_written = %s, finished_at = now() "
                     "WHERE id = %s", [n, ingest_id])
        conn.commit()
    except BaseException as exc:
        _record_failed_ingest(conn, cid if spec is None else None, n, exc)
        err = translate_sql_error(exc)
        if err is exc:
            raise
        raise err from exc
    return {"ingest_id": int(ingest_id), "n_rows": int(n), "item_ids": item_ids}


def _record_failed_ingest(conn, cid: int | None, n: int, exc: BaseException) -> None:
    """Roll the ingest back and, for an existing collection, log a ``failed`` ingest row.

    The error kept is the exception's class only: its message may quote input values."""
    try:
        if conn.closed:
            return
        conn.rollback()
        if cid is not None:
            conn.execute("INSERT INTO pm_vector.ingests (collection_id, status, n_rows, worker, error, finished_at) "
                         "VALUES (%s, 'failed', %s, %s, %s, now())",
                         [cid, n, Jsonb(worker_identity()), f"rolled back ({exc.__class__.__name__}); no row was kept"])
            conn.commit()
    except Exception:  # noqa: BLE001 - the rollback is what matters; the log row is best effort
        pass
