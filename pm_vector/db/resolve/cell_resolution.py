"""The server's resolve of a cell request (release ``"cells"``, format ``"pm_vector.cells/1"``).

A :class:`~pm_vector.client.request.CellRequest` reports one public cell per class of the active
run, at one level K (:mod:`pm_vector.privacy.cell_release`: pure eps, delta 0 for the whole request).
:func:`resolve_cells` checks it against the run's published cells, then answers **all** rows with
**one** statement in one REPEATABLE READ snapshot, and logs it (delta 0) in the same transaction:

* checks (nothing written on error, a 4xx through HTTP): the run has class rows and publishes
  ready cells (:class:`CellsUnavailableError`), the request's ``cells_digest`` is the
  run's (:class:`CellsDigestMismatchError`: fetch the current public anchor), ``n_cells`` is one of
  the published levels, one report per class in ``[0, K)`` in the run's class order (C of them),
  ``k'`` in 1..1000;
* the statement: ``pm_vector.pm_cell_shortlist_core`` (``sql/0013_cells.sql``, its ranking
  ``sql/0014_cell_statement.sql``: each row's cell
  row of ``run_<id>_cells`` by primary key, its class's top hubs, the fill, scored
  ``h_c + w h_{c,K,r}`` with ``w = cell_weight(eps)`` passed from Python so both sides rank with
  the same float64 numbers; the answers are exactly :meth:`pm_vector.shortlist.CellShortlist.shortlist`'s)
  -- or, on a sharded run, ``pm_vector.pm_cell_shortlist_sharded`` (each shard ranks the rows of its
  classes) -- joined with the candidates' items (payloads and, when asked, raw features / codes /
  KAHM class scores, for every row alike).
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping

from psycopg import sql

from ...protocol.cell_request import CellRequest
from ...protocol.formats import CELL_FORMAT
from ...errors import RequestError
from ..errors import CellsDigestMismatchError, CellsUnavailableError  # noqa: F401  (CellsUnavailable: PM009 in SQL)
from ..postgres.adapt import configure
from .answer import compact_columns, explain, item_joins, log_on_primary
from .requests import finish, run_snapshot, statement_answer, check_codes, code_offset
from ...privacy.cell_release import cell_weight
from ...protocol import bounds
from ..postgres import connect
from .frame import run_row


def check_against_run(meta: Mapping[str, Any], req: CellRequest, collection: str) -> dict[str, Any]:
    """The run's ``class_rows`` document, after checking the cell request against its cells."""
    if req.collection is not None and req.collection != collection:
        raise RequestError(f"the request was built for collection {req.collection!r}, not {collection!r}.")
    run_id = int(meta["run"]["id"])
    doc = meta["coll"].get("class_rows") or {}
    cells = doc.get("cells") or {}
    if doc.get("status") != "ready" or cells.get("status") != "ready":
        why = cells.get("error") or doc.get("error") or "it was built before the cell release existed"
        raise CellsUnavailableError(
            f"the active run {run_id} of collection {collection!r} publishes no cells ({why}); run a full embedding "
            "job for the collection (pm-vector embed COLLECTION), or use the Gaussian release.")
    if req.cells_digest != cells["digest"]:
        raise CellsDigestMismatchError(
            f"the request was built on public cells with digest {req.cells_digest[:16]!r}..., but collection "
            f"{collection!r}'s active run {run_id} publishes cells with digest {cells['digest'][:16]!r}...; fetch "
            "the current public anchor (its class_rows['cells'] and public_cells) and rebuild the request.")
    levels = [int(k) for k in cells["levels"]]
    if req.n_cells not in levels:
        raise RequestError(f"n_cells (K) must be one of the published levels {levels}; got {req.n_cells}.")
    C = len(doc["classes"])
    if req.n_rows != C:
        raise RequestError(f"the request reports {req.n_rows} cells; collection {collection!r}'s active run {run_id} "
                           f"needs exactly {C}, one per class {doc['classes'][:12]}, in that order.")
    return doc


def statement(coll: Mapping[str, Any], include_features: bool, sharded: bool, *, codes_run_id: int | None = None,
              kahm_model_id: int | None = None, code_bytes: int | None = None, code_offset: int = 0,
              compact: bool = False) -> sql.Composed:
    """The one statement: every row's ranked candidates (``row_index, rank, item_id``), with their
    items: ``row_index, rank, item_id, external_id, label, score, payload[, features][, code]
    [, predicted, scores]``; ``compact`` (with ``codes_run_id`` and ``code_bytes``): one row per
    answer row, ``row_index`` and :func:`~pm_vector.db.resolve.answer.compact_columns` by rank.
    Parameters: run id, [placement,] level, classes, reports, w, k'."""
    src = ("pm_vector.pm_cell_shortlist_sharded(%s, %s::jsonb, %s, %s::bigint[], %s::integer[], %s::float8, %s)"
           if sharded else
           "pm_vector.pm_cell_shortlist_core(%s, %s, %s::bigint[], %s::integer[], %s::float8, %s)")
    if compact:
        _, joins = item_joins(coll, False, codes_run_id, None, code_bytes, code_offset)
        return sql.SQL("SELECT s.row_index, {} FROM {} AS s{} GROUP BY s.row_index ORDER BY s.row_index").format(
            compact_columns(code_bytes, "s.rank"), sql.SQL(src), joins)
    extra, joins = item_joins(coll, include_features, codes_run_id, kahm_model_id, code_bytes, code_offset)
    return sql.SQL("SELECT s.row_index, s.rank, s.item_id, i.external_id, i.label, s.score, i.payload{} FROM {} AS s{} "
                   "ORDER BY s.row_index, s.rank").format(extra, sql.SQL(src), joins)


def statement_params(run_id: int, doc: Mapping[str, Any], req: CellRequest, shortlist: int) -> list:
    shards = doc.get("shards")
    head: list = [int(run_id)] + ([_json(shards)] if shards else [])
    return head + [int(req.n_cells), [int(c) for c in doc["classes"]], [int(r) for r in req.reports],
                   float(cell_weight(req.epsilon)), int(shortlist)]


def _json(v) -> str:
    return json.dumps(v)


def resolve_cells(collection: str, req: CellRequest, raw: str | None, include_features: bool, *, conn, shortlist,
                  log: bool, received, t0: float, timings: dict[str, float], code_bytes: int | None = None,
                  compact: bool = False, class_scores: bool = True, read_conn=None) -> dict[str, Any]:
    """Answer a cell request (module doc). Returns the shape of a class-rows answer
    (:func:`pm_vector.db.resolve.resolution.resolve`) with ``format`` ``"pm_vector.cells/1"``, ``release``
    ``"cells"`` and ``n_cells``; a full answer's ``rows[c]``: ``{"row", "item_ids", "external_ids",
    "labels", "scores", "payloads"[, "features"][, "codes"][, "predicted", "class_scores"]}``,
    best first; ``compact``: :func:`pm_vector.db.resolve.requests.compact_rows`."""
    shortlist = bounds.shortlist(req.shortlist if shortlist is None else shortlist)
    want_codes = compact or code_bytes is not None
    t = time.perf_counter()
    with run_snapshot(collection, conn if read_conn is None else read_conn, include_features) as (rconn, meta):
        coll = meta["coll"]
        doc = check_against_run(meta, req, collection)
        run_id = int(meta["run"]["id"])
        code_dim, digest = check_codes(doc, collection, run_id, code_bytes) if want_codes else (None, None)
        kahm_id = coll.get("kahm_model_id") if class_scores and not compact else None
        timings["lookup"] = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        configure(rconn)
        extra = {"feature_dim": int(coll["feature_dim"]) if include_features else None,
                 "code_dim": code_dim, "kahm": kahm_id is not None}
        sql = statement(coll, include_features, bool(doc.get("shards")),
                        codes_run_id=run_id if want_codes else None, kahm_model_id=kahm_id, code_bytes=code_dim,
                        code_offset=code_offset(doc, code_dim) if want_codes else 0, compact=compact)
        rows = rconn.execute(sql, statement_params(run_id, doc, req, shortlist), binary=True).fetchall()
        out_rows, n_found = statement_answer(rows, req.n_rows, compact, **extra)
        timings["shortlist"] = (time.perf_counter() - t) * 1e3
        if read_conn is None:
            log_id = finish(rconn, collection, req, raw, run_id=run_id, n_rows=n_found, received=received, t0=t0,
                            log=log, timings=timings)
        else:  # read on a replica: end its snapshot; the log goes to the primary, before the answer
            rconn.rollback()
    if read_conn is not None:
        log_id = log_on_primary(conn, collection, req, raw, run_id=run_id, n_rows=n_found, received=received,
                                t0=t0, log=log, timings=timings)
    timings["total"] = (time.perf_counter() - t0) * 1e3
    return {"collection": collection, "run_id": run_id, "format": CELL_FORMAT, "release": "cells",
            "answer": "compact" if compact else "full", "n_cells": int(req.n_cells), "k_prime": shortlist,
            "n_query_rows": req.n_rows, "rows": out_rows,
            "kahm": None if kahm_id is None else {"model_id": int(kahm_id),
                                                  "classes": [int(c) for c in coll["kahm_classes"]]},
            "codes": None if code_dim is None else {"bytes": int(code_dim), "digest": digest},
            "timings_ms": {a: round(b, 3) for a, b in timings.items()},
            "request_log_id": log_id}


def explain_cells(collection: str, req: CellRequest, include_features: bool) -> dict[str, list[str]]:
    """``{"statement": EXPLAIN of the statement, "shortlist": the generic plan of the ranking
    statement pm_cell_shortlist_core runs (single node: the cells' primary key, the class's top
    hubs, the fill)}``."""
    with connect() as conn:
        meta = run_row(conn, collection)
        doc = check_against_run(meta, req, collection)
        run_id = int(meta["run"]["id"])
        params = statement_params(run_id, doc, req, int(req.shortlist))
        kahm = meta["coll"].get("kahm_model_id")
        out = {"statement": [r[0] for r in conn.execute(
            explain(statement(meta["coll"], include_features, bool(doc.get("shards")), kahm_model_id=kahm)),
            params).fetchall()]}
        if not doc.get("shards"):  # the ranking statement's generic plan (its parameters are $1..$5)
            text = conn.execute("SELECT pm_vector.pm_cell_shortlist_sql(%s)", [run_id]).fetchone()[0]
            out["shortlist"] = [r[0] for r in conn.execute(sql.SQL("EXPLAIN (GENERIC_PLAN) {}").format(sql.SQL(text))).fetchall()]
        conn.rollback()
    return out
