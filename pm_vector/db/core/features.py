"""Where a collection's raw features are read from: ``pm_vector.items`` (``features`` /
``features_half``), or -- for a collection attached to a user's table (migration 0015,
:mod:`pm_vector.db.store.attach`) -- that table's vector column, by the item's key. One home for the
SQL expression every reader of raw features uses (the job's loads, ``fetch_items``, the delta,
resolve)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from psycopg import sql

from ..postgres.privileges import FEATURES_FUNCTIONS

#: a part of a relation's name as PostgreSQL prints a ``regclass`` (quoted where needed, ``""`` for ``"``)
_NAME_PART = re.compile(r'"((?:[^"]|"")*)"|([^".]+)')
#: the types a collection stores its raw features in
_FEATURE_TYPES = ("vector", "halfvec")


def attached_table(att: Mapping[str, Any]) -> sql.Identifier:
    """The attached table as an identifier, from its name as the attach recorded it (``regclass::text``:
    PostgreSQL's own quoting, ``schema.name`` when the schema is not on the path)."""
    text, parts, pos = str(att["table"]), [], 0
    while True:
        m = _NAME_PART.match(text, pos)
        if m is None:
            raise ValueError(f"not a table name as PostgreSQL prints one: {text!r}")
        parts.append(m.group(1).replace('""', '"') if m.group(1) is not None else m.group(2))
        pos = m.end()
        if pos == len(text):
            return sql.Identifier(*parts)
        if text[pos] != "." or len(parts) == 3:
            raise ValueError(f"not a table name as PostgreSQL prints one: {text!r}")
        pos += 1


def feature_sql(coll: Mapping[str, Any], alias: str = "i", *, answer: bool = False) -> sql.Composed:
    """The SQL expression of item ``alias``'s raw features, typed as the collection stores them.
    ``answer``: for a private answer, which may run as the query role: a collection's own rows
    through ``pm_vector.pm_item_features`` (:data:`~pm_vector.db.postgres.privileges.FEATURES_FUNCTIONS`:
    NULL unless the collection allows raw features; that role may not read the columns).

    Built from parts: an attached table's columns as identifiers, the table from its recorded name
    (:func:`attached_table`), the key's type as PostgreSQL's ``format_type`` printed it at the attach
    (``sql/0020_capture.sql``). A statement holding it passes its values as literals, not parameters
    (psycopg reads a ``%`` in a name as a placeholder when parameters are passed)."""
    ft = coll["feature_type"]
    if ft not in _FEATURE_TYPES:
        raise ValueError(f"not a feature type: {ft!r}")
    a = sql.Identifier(alias)
    att = (coll.get("settings") or {}).get("attached")
    if not att:
        if answer:
            return sql.SQL("{}({}.id)").format(sql.SQL(FEATURES_FUNCTIONS[ft]), a)
        return sql.SQL("{}.{}").format(a, sql.Identifier("features" if ft == "vector" else "features_half"))
    return sql.SQL("(SELECT s.{v}::{ft} FROM {t} AS s WHERE s.{k} = {a}.external_id::{kt})").format(
        v=sql.Identifier(att["vector_column"]), ft=sql.SQL(ft), t=attached_table(att),
        k=sql.Identifier(att["id_column"]), a=a, kt=sql.SQL(att["id_type"]))


def feature_filter(coll: Mapping[str, Any], alias: str = "i") -> sql.Composed:
    """`` AND ...`` keeping the items whose features can be read now (nothing for a collection's own rows):
    an attached table's row may have lost its vector (NULL, another dimension) before ``sync`` saw it."""
    if not (coll.get("settings") or {}).get("attached"):
        return sql.Composed([])
    return sql.SQL(" AND vector_dims({}) = {}").format(feature_sql(coll, alias), sql.Literal(int(coll["feature_dim"])))
