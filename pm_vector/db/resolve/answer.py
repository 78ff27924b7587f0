"""What both resolves of a class-level request share once they have their ranked candidates: the
item joins of the answer statement and the request log written on the primary (the connection's
adapters are :func:`pm_vector.db.postgres.adapt.configure`'s).

A leaf below :mod:`pm_vector.db.resolve.resolution` (class-rows requests) and
:mod:`pm_vector.db.resolve.cell_resolution` (cell requests): the first dispatches cell requests
to the second, so what both use lives here and neither imports the other back.
"""

from __future__ import annotations

from typing import Any, Mapping

from psycopg import sql

from ..run_tables import run_table
from .requests import finish
from ..core.features import feature_sql
from ..postgres import connect
from ..runs.delta import live_sql


def item_joins(coll: Mapping[str, Any], include_features: bool, codes_run_id: int | None,
               kahm_model_id: int | None, code_bytes: int | None = None,
               code_offset: int = 0) -> tuple[sql.Composable, sql.Composable]:
    """``(extra columns, joins)`` that bring each candidate ``s.item_id``'s item (``i.external_id,
    i.label, i.payload``, and the extra columns: features, its ``code_bytes``-byte code (from
    byte ``code_offset`` of the stored code; the whole stored code when None), its stored KAHM
    class scores, each when asked): LATERAL by primary key, OFFSET 0, one index lookup per
    candidate. A candidate the collection's active run holds a tombstone of
    (:mod:`pm_vector.db.runs.delta`: deleted, its rows not merged yet) is left out: an inner LATERAL
    join on the tombstones' primary key."""
    col = sql.Identifier("features" if coll["feature_type"] == "vector" else "features_half")
    none = sql.SQL("")
    cols = sql.Composed([sql.SQL(", i.{}").format(col) if include_features else none,
                         sql.SQL(", cd.code") if codes_run_id is not None else none,
                         sql.SQL(", sc.predicted, sc.scores") if kahm_model_id is not None else none])
    live = (sql.SQL(" JOIN LATERAL (SELECT 1 AS pm_live WHERE {} OFFSET 0) AS pm_lv ON true").format(
        live_sql(int(coll["active_run_id"]), sql.SQL("s.item_id"))) if coll.get("active_run_id") is not None else none)
    item = sql.SQL(" LEFT JOIN LATERAL (SELECT it.external_id, it.label, it.payload{} FROM pm_vector.items AS it "
                   "WHERE it.id = s.item_id OFFSET 0) AS i ON true").format(
        sql.SQL(", {} AS {}").format(feature_sql(coll, "it", answer=True), col) if include_features else none)
    code = (sql.SQL(" LEFT JOIN LATERAL (SELECT {} FROM {} AS c WHERE c.item_id = s.item_id OFFSET 0) AS cd ON true").format(
        sql.SQL("c.code") if code_bytes is None else sql.SQL("substr(c.code, {}, {}) AS code").format(
            sql.Literal(int(code_offset) + 1), sql.Literal(int(code_bytes))), run_table(codes_run_id, "codes"))
        if codes_run_id is not None else none)
    scores = (sql.SQL(" LEFT JOIN LATERAL (SELECT k.predicted, k.scores FROM pm_vector.kahm_item_scores AS k"
                      " WHERE k.model_id = {} AND k.item_id = s.item_id OFFSET 0) AS sc ON true").format(
        sql.Literal(int(kahm_model_id))) if kahm_model_id is not None else none)
    return cols, sql.Composed([live, item, code, scores])


def explain(statement: sql.Composable) -> sql.Composed:
    """``EXPLAIN`` of a statement (the explain functions show the plan of the statement resolve runs)."""
    return sql.SQL("EXPLAIN {}").format(statement)


def compact_columns(code_bytes: int, order: str) -> sql.Composed:
    """The select list of a compact answer's group (one row of candidates ``s`` joined by
    :func:`item_joins` with codes): the candidates' ids as one ``bytea`` of big-endian int64
    (``int8send``), their code prefixes (``code_bytes`` each; zeros for an item without a code, as
    in a full answer) as one ``bytea``, and their payloads as one ``jsonb`` array (null where an item
    has none), each in ``order``. Three values per row instead of three per candidate: the client
    library parses 1,300 candidates' payloads as ten JSON texts, and their ids and codes as two
    buffers each (:func:`pm_vector.db.resolve.requests.compact_groups`)."""
    return sql.SQL("string_agg(int8send(s.item_id), ''::bytea ORDER BY {o}), "
                   "string_agg(coalesce(cd.code, {zero}), ''::bytea ORDER BY {o}), "
                   "jsonb_agg(i.payload ORDER BY {o})").format(o=sql.SQL(order), zero=sql.Literal(bytes(int(code_bytes))))


def log_on_primary(conn, collection: str, req, raw, **kw) -> int | None:
    """The request log of an answer read on a replica, written on the primary (``conn``; a new
    connection when None) in its own transaction: the answer is returned only once it is logged."""
    own = conn is None
    if own:
        conn = connect()
    try:
        try:
            return finish(conn, collection, req, raw, **kw)
        except BaseException:
            conn.rollback()
            raise
    finally:
        if own:
            conn.close()
