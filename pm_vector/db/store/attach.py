"""A user's own table as a collection: ``attach_table``, ``sync_status`` and ``sync_rejected`` (the sync itself:
:mod:`pm_vector.db.store.sync`, whose ``sync`` and ``sync_pending`` this module also names).

``attach_table(name, table="public.documents", id_column="id", vector_column="embedding",
label_column=None, payload_columns=())`` (also ``pm-vector attach`` and, in SQL,
``SELECT pm_vector.pm_attach_table('docs', 'public.documents', 'id', 'embedding')``) makes
collection ``name`` from the table: its items rows keep the key (``external_id``), the label and
the payload columns (JSON), and NO features -- every reader of raw features reads the table's
vector column by key (:mod:`pm_vector.db.core.features`). The run tables (embeddings, codes, lists)
stay in pm_vector's schema. Rows whose vector is NULL or of another dimension are skipped and
counted (pgvector refuses NaN and infinite values on input, so a stored vector is finite).

Changes: statement-level triggers on the table queue every insert, update and delete in
``pm_vector.attach_changes`` (in the writer's transaction: a change is queued exactly when it
commits); :func:`~pm_vector.db.store.sync.sync` applies them, and rejects a change it cannot apply
(:mod:`pm_vector.db.store.sync_rows`). How far behind the sync is: :func:`sync_status`
(``pm-vector sync-status``, ``GET /collections/{name}/sync``, the view ``pm_vector.attach_status``):
the changes queued, how long the oldest has waited, and the keys rejected (:func:`sync_rejected`
lists them). The payload columns are held to ingest's bounds from the attach on: a row over them
is not stored (rejected).

Privileges: the role pm_vector connects as needs ``SELECT`` and ``TRIGGER`` on the table (or owns
it); the table's writers need nothing on pm_vector's schema (the capture function is ``SECURITY
DEFINER``).

SQLAlchemy: ``attach_table("docs", column=Document.embedding, label=Document.category,
payload=[Document.title])`` reads the table and columns from the mapped attributes.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from psycopg import sql
from psycopg.rows import dict_row

from ...errors import InvalidInputError
from ..errors import CollectionNotFoundError, translate_sql_error
from ..postgres import connect
from ..core.collection import collection_row, iso_datetime
from ._names import check_name
from .payloads import HIGH_KEY, SETTINGS_KEY, check_limit, stored_high
from .sync_rows import reject_stored_payloads
from .sync import SYNC_BATCH, not_attached, sync, sync_pending  # noqa: F401  (the sync's names, here too)


def _column_of(attr) -> tuple[str, str]:
    """``(qualified table, column)`` of a SQLAlchemy mapped attribute or Column."""
    col = getattr(attr, "expression", attr)
    table = getattr(col, "table", None)
    if table is None or not getattr(col, "name", None):
        raise InvalidInputError(f"{attr!r} is not a mapped column (e.g. Document.embedding).")

    schema = getattr(table, "schema", None)
    name = sql.Identifier(schema, table.name) if schema else sql.Identifier(table.name)
    return name.as_string(None), col.name


def attach_table(name: str, table: str | None = None, id_column: str | None = None,
                 vector_column: str | None = None, label_column: str | None = None,
                 payload_columns: Sequence[str] = (), *, labels: Sequence[int] | None = None, dim: int | None = None,
                 column=None, label=None, payload=(), id=None, max_payload_bytes: int | None = None) -> dict[str, Any]:
    """Make collection ``name`` from a table of the database (module doc). Either the names
    (``table``, ``id_column``, ``vector_column``, ``label_column``, ``payload_columns``) or SQLAlchemy
    attributes (``column``, ``label``, ``payload``, ``id``: default the table's primary key).
    ``labels``: the label set (default: the distinct labels of the table; one label 0 without a
    label column). ``dim``: needed when the column is a ``vector`` without dimension (rows of another
    dimension are then skipped). Returns ``{"collection", "items", "skipped", "rejected", "dim", "labels",
    "seconds"}``: ``rejected``, the rows whose payload is over ingest's bounds (``[(key, reason)]``, not
    stored, kept in ``pm_vector.attach_rejected``; ``skipped`` counts them too).

    ``max_payload_bytes``: the collection's payload bound (default 256; see
    :mod:`pm_vector.db.store.payloads`), set before the rows are checked against it.

    ``name`` is held to the one collection-name rule (:func:`pm_vector.db.store._names.check_name`;
    in SQL, the constraint ``ck_collections_name_chars``)."""
    check_name(name)
    limit = None if max_payload_bytes is None else check_limit(max_payload_bytes)
    if column is not None:
        table, vector_column = _column_of(column)
        if label is not None:
            label_column = _column_of(label)[1]
        payload_columns = [_column_of(p)[1] for p in payload]
        if id is not None:
            id_column = _column_of(id)[1]
        else:
            pk = list(getattr(getattr(column, "expression", column).table, "primary_key", []))
            if len(pk) != 1:
                raise InvalidInputError("the table needs a one-column primary key, or pass id=Document.id.")
            id_column = pk[0].name
    if not (isinstance(table, str) and isinstance(id_column, str) and isinstance(vector_column, str)):
        raise InvalidInputError("give table, id_column and vector_column (or column=Document.embedding).")
    payload_columns = [str(c) for c in payload_columns]
    t = time.perf_counter()
    with connect() as conn:
        try:
            out = conn.execute("SELECT pm_vector.pm_attach_table(%s, %s::regclass, %s, %s, %s, %s::text[], %s::bigint[], %s)",
                               [name, table, id_column, vector_column, label_column, payload_columns,
                                None if labels is None else [int(v) for v in labels],
                                None if dim is None else int(dim)]).fetchone()[0]
            if limit is not None:
                conn.execute("UPDATE pm_vector.collections SET settings = jsonb_set(settings, %s, %s::jsonb) "
                             "WHERE name = %s", [[SETTINGS_KEY], str(limit), name])
            coll = collection_row(conn, name)
            rejected = reject_stored_payloads(conn, coll)
            # the high-water mark: the largest payload the attach kept (payloads.py), in its transaction
            conn.execute("UPDATE pm_vector.collections SET settings = jsonb_set(settings, %s, to_jsonb(%s::bigint)) "
                         "WHERE id = %s", [[HIGH_KEY], stored_high(conn, coll["id"]), coll["id"]])
            conn.commit()
        except Exception as exc:  # noqa: BLE001 - SQL errors become pm_vector's
            conn.rollback()
            err = translate_sql_error(exc)
            if err is exc:
                raise
            raise err from exc
    out["items"] -= len(rejected)
    out["skipped"] += len(rejected)
    out["rejected"] = rejected
    out["seconds"] = round(time.perf_counter() - t, 3)
    return out


def sync_status(collection: str | None = None, *, url: str | None = None) -> dict[str, Any] | list[dict[str, Any]]:
    """How far behind the sync is (the view ``pm_vector.attach_status``, ``sql/0019_attach_status.sql``).

    With a name, that collection's ``{"collection", "source_table", "queued", "oldest_queued_at",
    "lag_s", "rejected", "broken", "broken_at", "pending_purge", "purge_age_s"}``: the changes queued and not yet applied, when the
    oldest of them was queued (ISO string) and how many seconds it has waited (float), both None when
    nothing is queued; the keys whose last change was rejected (``pm_vector.attach_rejected``;
    :func:`sync_rejected` lists them); ``broken`` and ``broken_at``: why and since when the
    collection is refused (:mod:`pm_vector.db.store.capture`), None when it is not; ``pending_purge``
    and ``purge_age_s``: the deleted items whose rows the derived tables still hold (never answered)
    until the next merge, and the age of the oldest (None when none: :mod:`pm_vector.db.runs.merge`).
    CollectionNotFoundError for an unknown collection, InvalidInputError for one that is not
    attached. Without a name, the list of every attached collection's, by name."""
    with connect(url) as conn:
        if collection is not None:
            coll = collection_row(conn, collection)
            if not (coll["settings"] or {}).get("attached"):
                raise not_attached(collection)
        with conn.cursor(row_factory=dict_row) as cur:
            if collection is None:
                rows = cur.execute("SELECT * FROM pm_vector.attach_status ORDER BY collection").fetchall()
            else:
                rows = cur.execute("SELECT * FROM pm_vector.attach_status WHERE collection = %s",
                                   [collection]).fetchall()
        rejected = dict(conn.execute(
            "SELECT c.name, count(*) FROM pm_vector.attach_rejected r JOIN pm_vector.collections c "
            "ON c.id = r.collection_id WHERE %s::text IS NULL OR c.name = %s GROUP BY c.name",
            [collection, collection]).fetchall())
    out = [{"collection": r["collection"], "source_table": r["source_table"], "queued": int(r["queued"]),
            "oldest_queued_at": iso_datetime(r["oldest_queued_at"]),
            "lag_s": None if r["lag_s"] is None else float(r["lag_s"]),
            "rejected": int(rejected.get(r["collection"], 0)),
            "broken": r["broken"], "broken_at": iso_datetime(r["broken_at"]),
            # the purge pending: tombstones not merged yet (sql/0023_delta.sql, pm_vector.db.runs.merge)
            "pending_purge": int(r["pending_purge"]),
            "purge_age_s": None if r["purge_age_s"] is None else float(r["purge_age_s"])} for r in rows]
    if collection is None:
        return out
    if not out:  # (dropped since the check above)
        raise CollectionNotFoundError(f"unknown collection {collection!r}; list_collections() shows the existing ones.")
    return out[0]


def sync_rejected(collection: str, *, limit: int = 1000, url: str | None = None) -> list[dict[str, Any]]:
    """The keys of an attached collection whose last change the sync rejected, oldest first:
    ``[{"key", "reason", "rejected_at"}]`` (at most ``limit``). A key leaves the list with its next
    change, applied as any other (:mod:`pm_vector.db.store.sync_rows`). CollectionNotFoundError for
    an unknown collection, InvalidInputError for one that is not attached."""
    with connect(url) as conn:
        coll = collection_row(conn, collection)
        if not (coll["settings"] or {}).get("attached"):
            raise not_attached(collection)
        rows = conn.execute("SELECT key, reason, rejected_at FROM pm_vector.attach_rejected WHERE collection_id = %s "
                            "ORDER BY rejected_at, key LIMIT %s", [coll["id"], int(limit)]).fetchall()
    return [{"key": k, "reason": r, "rejected_at": iso_datetime(at)} for k, r, at in rows]
