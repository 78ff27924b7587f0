"""What both resolves of a class-level request share once they have their ranked candidates: the
item joins of the answer statement and the request log written on the primary (the connection's
adapters are :func:`pm_vector.db.postgres.adapt.configure`'s).

A leaf below :mod:`pm_vector.db.resolve.resolution` (class-rows requests) and
:mod:`pm_vector.db.resolve.cell_resolution` (cell requests): the first dispatches cell requests
to the second, so what both use lives here and neither imports the other back.
"""

from __future__ import annotations

from typing import Any, Mapping

from .requests import finish
from ..postgres import connect
from ..runs.delta import live_sql
from ..store._source import feature_sql


def item_joins(coll: Mapping[str, Any], include_features: bool, codes_run_id: int | None,
               kahm_model_id: int | None, code_bytes: int | None = None, code_offset: int = 0) -> tuple[str, str]:
    """``(extra columns, joins)`` that bring each candidate ``s.item_id``'s item (``i.external_id,
    i.label, i.payload``, and the extra columns: features, its ``code_bytes``-byte code (from
    byte ``code_offset`` of the stored code; the whole stored code when None), its stored KAHM
    class scores, each when asked): LATERAL by primary key, OFFSET 0, one index lookup per
    candidate. A candidate the collection's active run holds a tombstone of
    (:mod:`pm_vector.db.runs.delta`: deleted, its rows not merged yet) is left out: an inner LATERAL
    join on the tombstones' primary key."""
    col = "features" if coll["feature_type"] == "vector" else "features_half"
    cols = ((f", i.{col}" if include_features else "") +
            (", cd.code" if codes_run_id is not None else "") +
            (", sc.predicted, sc.scores" if kahm_model_id is not None else ""))
    live = (" JOIN LATERAL (SELECT 1 AS pm_live WHERE " +
            live_sql(str(int(coll["active_run_id"])), "s.item_id") + " OFFSET 0) AS pm_lv ON true"
            if coll.get("active_run_id") is not None else "")
    joins = (live + " LEFT JOIN LATERAL (SELECT it.external_id, it.label, it.payload" +
             (f", {feature_sql(coll, 'it', answer=True)} AS {col}" if include_features else "") +
             " FROM pm_vector.items AS it WHERE it.id = s.item_id OFFSET 0) AS i ON true" +
             (" LEFT JOIN LATERAL (SELECT " + ("c.code" if code_bytes is None else
                                              f"substr(c.code, {int(code_offset) + 1}, {int(code_bytes)}) AS code") +
              " FROM pm_vector.run_" + str(int(codes_run_id)) + "_codes AS c"
              " WHERE c.item_id = s.item_id OFFSET 0) AS cd ON true" if codes_run_id is not None else "") +
             (" LEFT JOIN LATERAL (SELECT k.predicted, k.scores FROM pm_vector.kahm_item_scores AS k"
              f" WHERE k.model_id = {int(kahm_model_id)} AND k.item_id = s.item_id OFFSET 0) AS sc ON true"
              if kahm_model_id is not None else ""))
    return cols, joins


def compact_columns(code_bytes: int, order: str) -> str:
    """The select list of a compact answer's group (one row of candidates ``s`` joined by
    :func:`item_joins` with codes): the candidates' ids as one ``bytea`` of big-endian int64
    (``int8send``), their code prefixes (``code_bytes`` each; zeros for an item without a code, as
    in a full answer) as one ``bytea``, and their payloads as one ``jsonb`` array (null where an item
    has none), each in ``order``. Three values per row instead of three per candidate: the client
    library parses 1,300 candidates' payloads as ten JSON texts, and their ids and codes as two
    buffers each (:func:`pm_vector.db.resolve.requests.compact_groups`)."""
    zero = "'\\x" + "00" * int(code_bytes) + "'::bytea"
    return (f"string_agg(int8send(s.item_id), ''::bytea ORDER BY {order}), "
            f"string_agg(coalesce(cd.code, {zero}), ''::bytea ORDER BY {order}), "
            f"jsonb_agg(i.payload ORDER BY {order})")


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
