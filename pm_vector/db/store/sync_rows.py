"""What a sync batch (:mod:`pm_vector.db.store.sync`) reads of the attached table and decides per
key, and the keys it rejects.

:func:`source_rows` reads the changed keys' rows with SQL built from parts (``psycopg.sql``: every
table, column and payload name an identifier or a literal, never pasted), the label as text and
the payload columns as one JSON object. :func:`classify` decides per key: erase the item, insert a
new one, update the payload -- or **reject** the change, with its reason: a NULL vector or one of
another dimension, a label that is not an integer or not in the label set, a payload over the
bounds every ingest checks (:mod:`pm_vector.db.store.payloads`: depth, numbers, the collection's
``max_payload_bytes``). A vector the active run cannot place is rejected by the batch itself
(:func:`pm_vector.db.store.sync._place_new`). A rejected key has no item (its old one is erased:
the table is the truth), the rest of the batch is applied, and :func:`record` keeps it in
``pm_vector.attach_rejected`` (migration 0021) until the key's next change, which is applied as
any other.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping

from psycopg import sql

from ...errors import InvalidInputError
from .payloads import limit_of, payload_bytes, MAX_PAYLOAD_DEPTH

#: an integer label as text (a numeric column's integral ``3.00`` too); PostgreSQL's bigint input
_INTEGER = re.compile(r"\s*[+-]?[0-9]+(\.0*)?\s*")
_INT_MIN, _INT_MAX = -2 ** 63, 2 ** 63 - 1


def table_parts(conn, att: Mapping[str, Any]) -> dict[str, sql.Composable]:
    """The attached table and its key column's type as identifiers (from the catalog, by the
    table's name as the attach recorded it, read by PostgreSQL as a ``regclass`` value)."""
    row = conn.execute(
        "SELECT n.nspname, c.relname, tn.nspname, t.typname FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = %s AND NOT a.attisdropped "
        "JOIN pg_catalog.pg_type t ON t.oid = a.atttypid JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace "
        "WHERE c.oid = %s::regclass", [att["id_column"], att["table"]]).fetchone()
    if row is None:
        raise InvalidInputError(f"the attached table {att['table']} has no column {att['id_column']!r} any more; "
                                "attach the table again.")
    return {"table": sql.Identifier(row[0], row[1]), "id_type": sql.Identifier(row[2], row[3])}


def source_rows(conn, att: Mapping[str, Any], keys: list) -> dict:
    """The attached table's rows of the changed keys: key -> (vector is NULL, its dimensions, label
    as text, payload)."""
    parts = table_parts(conn, att)
    s = sql.Identifier("s")
    v = sql.SQL("{}.{}").format(s, sql.Identifier(att["vector_column"]))
    idc = sql.SQL("{}.{}").format(s, sql.Identifier(att["id_column"]))
    lab = (sql.SQL("{}.{}::text").format(s, sql.Identifier(att["label_column"])) if att.get("label_column")
           else sql.SQL("'0'"))
    pcols = list(att.get("payload_columns") or [])
    pay = (sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(
        sql.SQL("{}, {}.{}").format(sql.Literal(c), s, sql.Identifier(c)) for c in pcols))
        if pcols else sql.SQL("NULL::jsonb"))
    # the keys a literal too, and no parameters: psycopg reads a '%' of the text as a placeholder when
    # parameters are passed, and a name may hold one (a column named "a%sb")
    q = sql.SQL("SELECT pm_vector.pm_attach_key({idc}), {v} IS NULL, CASE WHEN {v} IS NULL THEN NULL ELSE vector_dims({v}) END, "
                "{lab}, {pay} FROM {table} AS {s} WHERE {idc} = ANY({keys}::text[]::{id_type}[])").format(
        idc=idc, v=v, lab=lab, pay=pay, table=parts["table"], s=s, keys=sql.Literal(list(keys)),
        id_type=parts["id_type"])
    return {r[0]: r[1:] for r in conn.execute(q).fetchall()}


def parse_label(text: str | None) -> int:
    """A label read as text, as an integer; InvalidInputError (the reason) otherwise."""
    if text is None:
        raise InvalidInputError("label is NULL")
    if not _INTEGER.fullmatch(text):
        raise InvalidInputError(f"label {text[:40]!r} is not an integer")
    try:
        v = int(Decimal(text.strip()))
    except (InvalidOperation, ValueError):  # (the pattern keeps these out)
        raise InvalidInputError(f"label {text[:40]!r} is not an integer") from None
    if not _INT_MIN <= v <= _INT_MAX:
        raise InvalidInputError(f"label {text[:40]!r} is beyond 64 bits")
    return v


def payload_reason(payload: Any, limit: int) -> str | None:
    """Why a payload cannot be stored (the bounds every ingest checks), or None."""
    try:
        size = payload_bytes(payload, "its payload")
    except InvalidInputError as exc:
        return str(exc).replace(" Nothing was written.", "")
    if size > limit:
        return (f"its payload is {size:,} bytes of compact JSON, over the collection's max_payload_bytes of "
                f"{limit:,}")
    return None


def classify(coll: Mapping[str, Any], keys: list, ops: dict, src: dict, items: dict) -> tuple:
    """Per changed key, what the batch does (module doc): the items to erase, the rows to insert
    ``(key, label, payload)``, the payloads to update ``(payload, item id)``, the changes rejected
    ``(key, reason)``. Returns (erase, insert, payloads, rejected)."""
    allowed = set(int(x) for x in coll["labels"])
    limit = limit_of(coll)
    erase, insert, payloads, rejected = [], [], [], []
    for key in keys:
        s = src.get(key)
        reason = label = None
        if s is not None:
            isnull, dims, label_text, payload = s
            if isnull:
                reason = "vector is NULL"
            elif dims != coll["feature_dim"]:
                reason = f"vector has {dims} dimensions, the collection {coll['feature_dim']}"
            else:
                try:
                    label = parse_label(label_text)
                except InvalidInputError as exc:
                    reason = str(exc)
                else:
                    if label not in allowed:
                        reason = f"label {label} is not in the collection's label set"
                    else:
                        reason = payload_reason(payload, limit)
        if reason is not None:
            rejected.append((key, reason))
        valid = s is not None and reason is None
        item = items.get(key)
        replace = any(op in ("I", "U", "D") for op, _ in ops[key])
        if item is not None and (not valid or replace):
            erase.append(item[0])
        if valid and (item is None or replace):
            insert.append((key, label, s[3]))
        elif valid and item is not None:
            payloads.append((s[3], item[0]))
    return erase, insert, payloads, rejected


def record(conn, cid: int, keys: list, rejected: list) -> None:
    """The batch's keys leave the rejected table; those it rejected come back with their reason."""
    conn.execute("DELETE FROM pm_vector.attach_rejected WHERE collection_id = %s AND key = ANY(%s)", [cid, keys])
    if rejected:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO pm_vector.attach_rejected (collection_id, key, reason) VALUES (%s, %s, %s)",
                            [(cid, k, r) for k, r in rejected])


def reject_stored_payloads(conn, coll: Mapping[str, Any]) -> list:
    """At attach, in its transaction: the items whose payload is over the bounds (module doc) are
    removed and recorded as rejected. Returns ``[(key, reason)]``. Only rows whose stored text could
    be over a bound are read: jsonb's text is never shorter than the compact JSON, an integer beyond
    64 bits has 19 digits or more, and a nesting deeper than 16 has more than 16 brackets."""
    limit = limit_of(coll)
    rows = conn.execute(
        "SELECT id, external_id, payload FROM pm_vector.items WHERE collection_id = %s AND payload IS NOT NULL "
        "AND (octet_length(payload::text) > %s OR payload::text ~ '[0-9]{19}' OR "
        "length(payload::text) - length(translate(payload::text, '[{', '')) > %s)",
        [coll["id"], limit, MAX_PAYLOAD_DEPTH]).fetchall()
    out, gone = [], []
    for item_id, key, payload in rows:
        why = payload_reason(payload, limit)
        if why is not None:
            out.append((key, why))
            gone.append(item_id)
    if gone:
        conn.execute("DELETE FROM pm_vector.items WHERE id = ANY(%s)", [gone])
        record(conn, int(coll["id"]), [k for k, _ in out], out)
    return out
