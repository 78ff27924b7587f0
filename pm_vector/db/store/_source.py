"""Where a collection's raw features are read from: ``pm_vector.items`` (``features`` /
``features_half``), or -- for a collection attached to a user's table (migration 0015,
:mod:`pm_vector.db.store.attach`) -- that table's vector column, by the item's key. One home for the
SQL expression every reader of raw features uses (the job's loads, ``fetch_items``, resolve)."""

from __future__ import annotations

from typing import Any, Mapping

from ..postgres.privileges import FEATURES_FUNCTIONS


def quote_ident(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def feature_sql(coll: Mapping[str, Any], alias: str = "i", *, answer: bool = False) -> str:
    """The SQL expression of item ``alias``'s raw features, typed as the collection stores them.
    ``answer``: for a private answer, which may run as the query role: a collection's own rows
    through ``pm_vector.pm_item_features`` (:data:`~pm_vector.db.postgres.privileges.FEATURES_FUNCTIONS`:
    NULL unless the collection allows raw features; that role may not read the columns)."""
    col = "features" if coll["feature_type"] == "vector" else "features_half"
    att = (coll.get("settings") or {}).get("attached")
    if not att:
        if answer:
            return f"{FEATURES_FUNCTIONS[coll['feature_type']]}({alias}.id)"
        return f"{alias}.{col}"
    # the table name is stored as regclass::text (quoted where needed); the key as the id column's type
    return (f"(SELECT s.{quote_ident(att['vector_column'])}::{coll['feature_type']} FROM {att['table']} AS s "
            f"WHERE s.{quote_ident(att['id_column'])} = {alias}.external_id::{att['id_type']})")


def feature_filter(coll: Mapping[str, Any], alias: str = "i") -> str:
    """`` AND ...`` keeping the items whose features can be read now ("" for a collection's own rows):
    an attached table's row may have lost its vector (NULL, another dimension) before ``sync`` saw it."""
    if not (coll.get("settings") or {}).get("attached"):
        return ""
    return f" AND vector_dims({feature_sql(coll, alias)}) = {int(coll['feature_dim'])}"
