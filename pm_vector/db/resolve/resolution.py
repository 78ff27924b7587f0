"""The server's resolve: a request against a collection's active run, in PostgreSQL.

::

    resolve(collection, request, ...) -> dict            a pm_vector request (default) or the paper's
    explain_resolution(collection, request) -> dict      the plans of resolve's statement
    public_anchor(collection) -> (PublicAnchor, info)    what clients download (pm_vector.db.resolve.frame)
    class_frames(collection) -> ClassFrames              the active run's published class frames

Parsing and the checks every request passes live in :mod:`pm_vector.db.resolve.requests`; the client
side is :mod:`pm_vector.client.query`. The dispatch is the table of releases (:mod:`pm_vector.protocol.releases`):
a request's release names its resolver (the ``resolve_*_request`` functions below) and its EXPLAIN.

Class-rows requests (format ``"pm_vector.class-rows/1"``)
----------------------------------------------------------
:func:`resolve` also takes a :class:`~pm_vector.client.query.ClassRowsRequest` (object, dict or JSON
text): one noised row per class in the active run's class frames. A client builds it from
:func:`public_anchor` (``frame_info["class_frames"]`` -> ``ClassFrames.from_dict``, the dummy
pool of the :class:`~pm_vector.client.PublicAnchor`) or :func:`class_frames`. The server checks
the frames digest (a request built on other frames is refused: fetch the current public
anchor), one row per class in the run's order, finite numbers, ``k'`` in 1..1000, then answers
**all** rows in one REPEATABLE READ transaction with the checks and the log:

1. **one** pgvector k-NN statement finds every row's retained prior (the ``max_prior`` items of
   its class nearest the released row, through the class partition's HNSW index; a class of at
   most ``max_prior`` items is retained whole and needs no search) --
   :func:`pm_vector.db.resolve.run_graph.prior_knn`;
2. the rows are ranked on the run's graph held in this process's memory
   (:func:`pm_vector.shortlist.rank_retained` on :class:`pm_vector.db.resolve.run_graph.RunGraph`: the
   posterior shortlist of :class:`pm_vector.shortlist.PosteriorShortlist`, the same scores as the
   SQL function ``pm_vector.pm_shortlist``);
3. **one** statement returns every row's ``k'`` candidates with their items.

Sharded runs and runs built before migration 0009 are ranked in the database instead: one
statement, ``pm_vector.pm_shortlist`` (``sql/0005_class_rows.sql``, ``sql/0009_fast_shortlist.sql``,
``sql/0011_cluster.sql``) joined with the items. With ``include_features`` (and
``allow_raw_features``) every candidate of every row carries its raw features, so the answer
does not depend on which row is real; the client re-ranks its real row locally
(:meth:`~pm_vector.client.query.PrivateKNN.rerank`). With ``code_bytes`` (any collection whose
run publishes product codes) every candidate of every row carries that prefix of its code
(``run_<id>_codes``, see :mod:`pm_vector.db.runs.class_rows`; a published stage width). The
**compact answer** (``compact=True``; the service's default) carries per row only the
candidates' ids, their codes and, when the answer has any, their payloads
(:func:`pm_vector.db.resolve.requests.compact_rows`), fetched as three values per row
(:func:`pm_vector.db.resolve.answer.compact_columns`); the client re-ranks by
:meth:`~pm_vector.manifold.codes.ProductCodes.distances` with the codes published with
:func:`public_anchor`. When the collection has a KAHM model every candidate of a full answer
also carries its class scores, as on the PrivateMail path. Codes and scores are joined in the
candidates statement.

Cell requests (release ``"cells"``, format ``"pm_vector.cells/1"``: one reported public cell per
class, pure eps) are answered by :func:`pm_vector.db.resolve.cell_resolution.resolve_cells`: one statement
(``pm_vector.pm_cell_shortlist_core``, or its sharded fan-out) joined with the items.

The paper's requests (format ``"pm_vector.privatemail/1"`` and release-only
``"pm_vector.privatemail-release/1"``) are answered by
:func:`pm_vector.db.resolve.paper_resolution.resolve_paper` (align + ``pm_knn_batch``).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any, Mapping

import numpy as np
from psycopg import sql

from ...protocol import bounds, releases
from ...protocol.class_rows import ClassRowsRequest
from ...protocol.formats import CLASS_ROWS_FORMAT
from ...errors import InvalidInputError, RequestError
from . import run_graph
from ..postgres.adapt import Int8Array, configure
from .answer import compact_columns, explain, item_joins, log_on_primary
from ..postgres import connect
from ..errors import ClassRowsUnavailableError, DimensionMismatchError, FramesDigestMismatchError
from .frame import run_row, class_frames, client_frame, public_anchor  # noqa: F401  (the public-anchor API)
from .paper_resolution import explain_paper, post_process_release, resolve_paper  # noqa: F401  (paper API)
from .requests import (
    MAX_QUERY_ROWS,
    check_k,
    outputs_allowed,
    parse_request,
    assemble_answer,
    check_codes,
    code_offset,
    compact_groups,
    finish,
    run_snapshot,
    statement_answer,
)
from ...deprecation import renamed_keyword
from ...shortlist import prior_d2, rank_retained
from ..runs.delta import live_ids
from .cell_resolution import explain_cells, resolve_cells
from .location_resolution import resolve_location


def resolve(collection: str, request, k: int = 8, include_features: bool = False, *, conn=None,
            max_query_rows: int = MAX_QUERY_ROWS, ef_search: int | None = None, log: bool = True,
            class_scores: bool = True, shortlist: int | None = None, code_bytes: int | None = None,
            compact: bool = False, read_conn=None, k_prime: int | None = None) -> dict[str, Any]:
    """Resolve a PrivateMail or a class-rows request against ``collection``'s active run.

    A class-rows request (:class:`~pm_vector.client.query.ClassRowsRequest`, its dict or JSON text,
    format ``"pm_vector.class-rows/1"``) is answered by :func:`_resolve_class_rows` (see there:
    ``k`` is not used, the candidates per row are the request's ``shortlist`` or the ``shortlist`` argument;
    ``code_bytes``: every candidate of every row carries that prefix of its product code, one of
    the run's published code widths; ``compact``: the compact answer -- per row ``item_ids``
    (uint32 array), ``codes`` ((k', b) uint8, b = ``code_bytes`` or the whole code) and
    ``payloads`` when the answer has any; no features, external ids, labels, scores or class
    scores. Both put ``codes = {"bytes": b, "digest": ...}`` in the answer).

    ``request``: a :class:`~pm_vector.client.PrivateMailRequest`, a :class:`ReleaseRequest`
    (the server post-processes it first), either one's dict, or JSON text (``str``/``bytes``;
    the log stores the validated request, not the text). ``k``: neighbours per query row (1..1000). ``include_features``: also
    return the items' raw features (the collection must allow it). ``conn``: an idle psycopg
    connection from :func:`pm_vector.db.connect` to reuse (a server's pool); by default one is
    opened. ``read_conn``: an idle connection to a streaming replica (class-rows requests): the
    checks and the statement run there, in one snapshot, and the request log is written on
    ``conn`` (the primary) before the answer is returned. ``log=False`` skips the request log
    (benchmarks of the statement alone only).

    Returns ``{"collection", "run_id", "k", "n_query_rows", "rows", "alignment", "timings_ms",
    "request_log_id"}`` where ``rows[i]`` answers query row ``i`` (the client keeps which one
    is real: ``ClientSecret.pick(result["rows"])``) with ``item_ids``, ``external_ids``,
    ``labels``, ``distances`` (lists, nearest first), ``payloads`` and, if asked,
    ``features`` (``(k, d)`` float32 array).

    When the collection has a KAHM model (:func:`pm_vector.db.kahm.roles.fit_kahm_models`) whose
    outputs may leave the database (a private kind, or a raw model where the collection opted in
    with ``settings["kahm"]["raw_distances"]``: the policy of ``/kahm/distances``,
    :func:`pm_vector.db.kahm.store.model_outputs_allowed`) and ``class_scores`` is true, every
    row also carries ``class_scores`` (per returned item, its
    class-matching scores of Definition 8 in the order of ``result["kahm"]["classes"]``; None for
    an item ingested after the model) and ``predicted`` (the model's label, Definition 7);
    ``result["kahm"]`` is ``{"model_id", "classes"}`` (None without such a model). They are read
    from the scores stored with the model: one primary-key lookup per returned item.

    Raises (nothing written): CollectionNotFoundError, NoActiveRunError, AnchorIdMismatchError,
    DimensionMismatchError, RequestError (NaN/inf, malformed, too many rows),
    RawFeaturesNotAllowedError, AlignmentError (a foreign frame); for class-rows requests also
    FramesDigestMismatchError (other class frames) and ClassRowsUnavailableError (a run
    without class rows).
    """
    received = dt.datetime.now(dt.timezone.utc)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    if k_prime is not None:  # shortlist's old keyword, until 0.3.0 (inline: no wrapper on every query's path)
        shortlist = renamed_keyword("resolve", "k_prime", "shortlist", k_prime, shortlist)
    k = check_k(k)
    if isinstance(max_query_rows, bool) or int(max_query_rows) < 1:
        raise InvalidInputError("max_query_rows must be a positive integer.")
    req, raw = parse_request(request)
    timings["parse"] = (time.perf_counter() - t0) * 1e3
    _check_answer_kind(include_features, code_bytes, compact)
    rel = release_of(req)
    return rel.resolve(collection, req, raw, k=k, include_features=include_features, conn=conn, read_conn=read_conn,
                       max_query_rows=max_query_rows, shortlist=shortlist, code_bytes=code_bytes, compact=compact,
                       class_scores=class_scores, ef_search=ef_search, log=log, received=received, t0=t0,
                       timings=timings)


def release_of(req):
    """The release of a parsed request (:func:`pm_vector.protocol.releases.by_request`), after the
    server's checks the release names beyond its type's own (``check_request``)."""
    rel = releases.by_request(req)
    if rel is None:  # parse_request only returns registered types
        raise RequestError(f"no release answers a {type(req).__name__}.")
    if rel.check_request is not None:
        releases.load(rel.check_request)(req)
    return rel


# the table's resolvers (pm_vector.protocol.releases names them; each takes resolve's keywords, uses its own)

def resolve_paper_request(collection, req, raw, *, k, include_features, conn, max_query_rows, ef_search, log,
                          class_scores, received, t0, timings, code_bytes=None, compact=False, **_):
    if code_bytes is not None or compact:
        raise InvalidInputError("codes and the compact answer apply to class-rows and cell requests (formats "
                                f"{CLASS_ROWS_FORMAT!r}, 'pm_vector.cells/1'); the paper's protocol has no codes.")
    return resolve_paper(collection, req, raw, k, include_features, conn=conn, max_query_rows=max_query_rows,
                         ef_search=ef_search, log=log, class_scores=class_scores, received=received, t0=t0,
                         timings=timings)


def resolve_cell_request(collection, req, raw, *, include_features, conn, log, received, t0, timings, code_bytes,
                         compact, class_scores, read_conn, shortlist, **_):
    return resolve_cells(collection, req, raw, include_features, conn=conn, shortlist=shortlist, log=log,
                         received=received, t0=t0, timings=timings, code_bytes=code_bytes, compact=compact,
                         class_scores=class_scores, read_conn=read_conn)


def resolve_location_request(collection, req, raw, *, include_features, conn, log, received, t0, timings,
                             read_conn, **_):
    if include_features:
        raise InvalidInputError("a location answer carries codes, not raw features.")
    return resolve_location(collection, req, raw, conn=conn, log=log, received=received, t0=t0, timings=timings,
                            read_conn=read_conn)


def resolve_class_rows_request(collection, req, raw, *, include_features, conn, max_query_rows, shortlist, log,
                               received, t0, timings, code_bytes, compact, class_scores, read_conn, **_):
    return _resolve_class_rows(collection, req, raw, include_features, conn=conn, max_query_rows=max_query_rows,
                               shortlist=shortlist, log=log, received=received, t0=t0, timings=timings,
                               code_bytes=code_bytes, compact=compact, class_scores=class_scores,
                               read_conn=read_conn)


def explain_cell_request(collection, req, k, include_features):
    return explain_cells(collection, req, include_features)


def explain_class_rows_request(collection, req, k, include_features):
    return _explain_class_rows(collection, req, include_features)


def explain_paper_request(collection, req, k, include_features):
    return explain_paper(collection, req, k, include_features)


def _check_answer_kind(include_features, code_bytes, compact) -> None:
    if not isinstance(compact, (bool, np.bool_)):
        raise InvalidInputError(f"compact must be true or false, got {compact!r}.")
    if compact and include_features:
        raise InvalidInputError("a compact answer carries no raw features; ask for one or the other.")
    if code_bytes is not None and (isinstance(code_bytes, bool) or not isinstance(code_bytes, (int, np.integer))):
        raise InvalidInputError(f"code_bytes must be an integer (a published stage width), got {code_bytes!r}.")


def explain_resolution(collection: str, request, k: int = 8, include_features: bool = False) -> dict[str, list[str]]:
    """The plans of :func:`resolve`'s statements for this request, without logging (a class-rows
    request's prior k-NN runs, read-only, to know the candidates whose fetch is explained):
    ``{"statement": EXPLAIN of the outer statement, "knn": pm_knn_batch_explain of the
    k-NN statement pm_knn_batch runs inside (one HNSW index scan per query row)}``; for a
    class-rows request ``{"prior_knn": the rows' prior k-NN (empty when every class is retained
    whole), "statement": the candidates with their items, "shortlist": pm_shortlist_explain of
    the SQL function's statement}`` (a sharded or older run: no ``prior_knn``, and ``statement``
    calls pm_shortlist)."""
    k = check_k(k)
    req, _ = parse_request(request)
    rel = release_of(req)
    if rel.explain is None:
        raise InvalidInputError(f"the {rel.name} release has no EXPLAIN (its answer is a lookup).")
    return releases.load(rel.explain)(collection, req, k, include_features)


# ----------------------------------------------------------------------------- class-rows requests

def _check_class_rows_against_run(meta: Mapping[str, Any], req: ClassRowsRequest, collection: str,
                                  max_query_rows: int) -> dict[str, Any]:
    """The run's class_rows document, after checking the request against it."""
    if req.collection is not None and req.collection != collection:
        raise RequestError(f"the request was built for collection {req.collection!r}, not {collection!r}.")
    run_id = int(meta["run"]["id"])
    doc = meta["coll"].get("class_rows")
    if not doc or doc.get("status") != "ready":
        why = (doc or {}).get("error") or "it was built before class rows existed"
        raise ClassRowsUnavailableError(
            f"the active run {run_id} of collection {collection!r} has no class rows ({why}); run a new embedding "
            "job for the collection.")
    if req.frames_digest != doc["frames_digest"]:
        raise FramesDigestMismatchError(
            f"the request was built on class frames with digest {req.frames_digest!r}, but collection "
            f"{collection!r}'s active run {run_id} publishes frames with digest {doc['frames_digest']!r}. Fetch the "
            "current public anchor (pm_vector.db.resolve.resolution.public_anchor: frame_info['class_frames'] and the "
            "dummy pool, or class_frames(collection)) and rebuild the client.")
    C = len(doc["classes"])
    if req.n_rows != C or [int(c) for c in req.classes] != [int(c) for c in doc["classes"]]:
        raise RequestError(f"the request has {req.n_rows} rows for classes {list(req.classes)[:12]}; collection "
                           f"{collection!r}'s active run {run_id} needs exactly {C} rows, one per class "
                           f"{doc['classes'][:12]}, in that order.")
    if req.n_rows > int(max_query_rows):
        raise RequestError(f"the request has {req.n_rows} rows; at most {int(max_query_rows)} are answered per "
                           "request.")
    if req.rows.shape[1] != int(doc["n_components"]):
        raise DimensionMismatchError(f"the request's rows have {req.rows.shape[1]} coordinates; the active run's "
                                     f"class frames have {doc['n_components']}.")
    return doc


#: the ranked candidates from the SQL function (the ranking done in the database): collection,
#: rows, sigmas, k'
SQL_SOURCE = ("(SELECT x.row_index, x.rank, x.item_id, x.score "
              "FROM pm_vector.pm_shortlist(%s, %s::float8[], %s::float8[], %s, NULL::integer) AS x)")


def _shortlist_statement(coll: Mapping[str, Any], include_features: bool, *, codes_run_id: int | None = None,
                         kahm_model_id: int | None = None, code_bytes: int | None = None,
                         code_offset: int = 0, compact: bool = False) -> sql.Composed:
    """pm_shortlist's candidates with their items: ``row_index, rank, item_id, external_id,
    label, score, payload[, features][, code][, predicted, scores]`` (sharded and older runs).
    ``codes_run_id``: join every candidate's code (its first ``code_bytes``) from that run's
    ``run_<id>_codes``; ``kahm_model_id``: join every candidate's stored KAHM class scores;
    ``compact``: one row per answer row, ``row_index`` and
    :func:`~pm_vector.db.resolve.answer.compact_columns` by rank."""
    if compact:
        _, joins = item_joins(coll, False, codes_run_id, None, code_bytes, code_offset)
        return sql.SQL("SELECT s.row_index, {} FROM {} AS s{} GROUP BY s.row_index ORDER BY s.row_index").format(
            compact_columns(code_bytes, "s.rank"), sql.SQL(SQL_SOURCE), joins)
    extra, joins = item_joins(coll, include_features, codes_run_id, kahm_model_id, code_bytes, code_offset)
    return sql.SQL("SELECT s.row_index, s.rank, s.item_id, i.external_id, i.label, s.score, i.payload{} FROM {} AS s{} "
                   "ORDER BY s.row_index, s.rank").format(extra, sql.SQL(SQL_SOURCE), joins)


def _items_statement(coll: Mapping[str, Any], include_features: bool, *, codes_run_id: int | None = None,
                     kahm_model_id: int | None = None, code_bytes: int | None = None,
                     code_offset: int = 0, compact: bool = False) -> sql.Composed:
    """The items of candidates ranked here (one parameter: their ids, bigint[], in answer order):
    ``external_id, label, payload[, features][, code][, predicted, scores]`` in that order;
    ``compact`` (a second parameter: their 1-based rows, integer[]): one row per answer row,
    ``row_index`` and :func:`~pm_vector.db.resolve.answer.compact_columns` in answer order."""
    if compact:
        _, joins = item_joins(coll, False, codes_run_id, None, code_bytes, code_offset)
        return sql.SQL("SELECT s.row_index, {} FROM unnest(%s::bigint[], %s::integer[]) WITH ORDINALITY AS s(item_id, "
                       "row_index, ord){} GROUP BY s.row_index ORDER BY s.row_index").format(compact_columns(code_bytes, "s.ord"), joins)
    extra, joins = item_joins(coll, include_features, codes_run_id, kahm_model_id, code_bytes, code_offset)
    return sql.SQL("SELECT i.external_id, i.label, i.payload{} FROM unnest(%s::bigint[]) WITH ORDINALITY "
                   "AS s(item_id, ord){} ORDER BY s.ord").format(extra, joins)


def _scored_candidates(rconn, meta: Mapping[str, Any], doc: Mapping[str, Any], req: ClassRowsRequest, shortlist: int,
                       timings: dict[str, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(row_of, item_ids, scores)`` of every row's ranked candidates (row, then rank order;
    ``row_of`` 1-based): the retained prior found by ONE pgvector k-NN statement
    (:func:`pm_vector.db.resolve.run_graph.prior_knn`), ranked on the run's cached graph
    (:func:`pm_vector.shortlist.rank_retained`)."""
    t = time.perf_counter()
    graph = run_graph.run_graph(rconn, meta)
    timings["graph"] = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    rows = np.asarray(req.rows, dtype=np.float64)
    labels = [int(c) for c in doc["classes"]]
    max_prior = int(doc.get("max_prior") or 1024)
    retained = run_graph.prior_knn(rconn, graph, doc, rows, labels, max_prior)
    timings["prior_knn"] = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    sizes = {int(c): int(n) for c, n in zip(doc["classes"], doc["class_sizes"])}
    mw = float(doc.get("min_weight") or 0.0)
    r_of, r_ids, r_score = [], [], []
    for i, (z, sigma, c) in enumerate(zip(rows, req.sigmas, labels)):
        pos = retained[i]
        d2 = prior_d2(graph.coords[pos], z)
        order = np.lexsort((graph.ids[pos], d2))  # (distance, item id): the order pm_shortlist sums in
        pos, d2 = pos[order], d2[order]
        top_ids, top_hubs = graph.top_hubs[c]
        ids, scores = rank_retained(d2, graph.nbrs[pos], graph.nhub[pos], float(sigma), sizes[c] > max_prior, mw,
                                    top_ids, top_hubs, graph.fill_ids, shortlist)
        r_of.append(np.full(ids.size, i + 1, np.int64))
        r_ids.append(ids)
        r_score.append(scores)
    timings["score"] = (time.perf_counter() - t) * 1e3

    r_of, r_ids, r_score = np.concatenate(r_of), np.concatenate(r_ids), np.concatenate(r_score)
    live = live_ids(rconn, int(meta["run"]["id"]), r_ids)
    return r_of[live], r_ids[live], r_score[live]


def _fetch_rows(rconn, meta: dict, doc, req: ClassRowsRequest, shortlist: int, collection: str, include_features: bool,
                compact: bool, joins: dict, extra: dict, timings: dict[str, float], t: float) -> tuple:
    """The class-rows answer's rows, in the request's snapshot: ranked on the run's graph then joined
    with the items by one statement (compact or full), or, for sharded and older runs, ranked and
    joined by ``pm_vector.pm_shortlist``. Returns (the rows, the candidates found, when the fetch
    started)."""
    coll, code_dim = meta["coll"], extra["code_dim"]
    if run_graph.supports(rconn, meta) and compact:
        row_of, ids, _ = _scored_candidates(rconn, meta, doc, req, shortlist, timings)
        t_fetch = time.perf_counter()
        groups = rconn.execute(_items_statement(coll, False, compact=True, **joins),
                               [Int8Array(ids), row_of.astype(np.int32).tolist()], binary=True,
                               prepare=True).fetchall()
        out_rows = compact_groups(req.n_rows, groups, code_dim)
        n_found = int(ids.size)
    elif run_graph.supports(rconn, meta):
        row_of, ids, scores = _scored_candidates(rconn, meta, doc, req, shortlist, timings)
        t_fetch = time.perf_counter()
        items = rconn.execute(_items_statement(coll, include_features, **joins), [Int8Array(ids)],
                              binary=True, prepare=True).fetchall()
        cols = list(zip(*items)) if items else [()] * (3 + (extra["feature_dim"] is not None) +
                                                       (extra["code_dim"] is not None) + 2 * extra["kahm"])
        out_rows = assemble_answer(req.n_rows, row_of, ids.tolist(), cols[0], cols[1], scores.tolist(), cols[2],
                                   cols[3:], "scores", **extra)
        n_found = int(ids.size)
    else:  # sharded runs, runs built before migration 0009: ranked by pm_shortlist in the database
        t_fetch = t
        rows = rconn.execute(_shortlist_statement(coll, include_features, compact=compact, **joins),
                             [collection, np.asarray(req.rows, dtype=np.float64).tolist(),
                              [float(v) for v in req.sigmas], shortlist], binary=True).fetchall()
        out_rows, n_found = statement_answer(rows, req.n_rows, compact, **extra)
    return out_rows, n_found, t_fetch


def _resolve_class_rows(collection: str, req: ClassRowsRequest, raw: str | None, include_features: bool, *, conn,
                        max_query_rows: int, shortlist, log: bool, received, t0: float,
                        timings: dict[str, float], code_bytes: int | None = None, compact: bool = False,
                        class_scores: bool = True, read_conn=None) -> dict[str, Any]:
    """Answer a class-rows request: every row's ``k'`` candidates (the module doc: one prior k-NN
    statement and one candidates statement for all rows, or ``pm_vector.pm_shortlist`` for sharded
    and older runs, in the same REPEATABLE READ snapshot as the checks), joined with the items for
    payloads and -- with ``include_features`` on a collection that allows raw features --
    the raw features of every candidate of every row (so the answer does not depend on which row
    is real). With ``code_bytes`` or ``compact`` (any collection whose run publishes product
    codes: they are what it reveals instead of raw features) every candidate of every row carries
    its code prefix from the run's ``run_<id>_codes``; ``compact``: the compact answer
    (:func:`pm_vector.db.resolve.requests.compact_rows`). In a full answer, when the collection has a KAHM
    model whose outputs may leave the database (:func:`resolve`) and ``class_scores`` is true, every
    candidate of every row carries its stored class scores and predicted label (the lookup of the
    PrivateMail path). Codes and scores are joined in the candidates statement. Checks first
    (nothing written on error): collection, frames digest, one row per class in the run's class
    order, the frames' dimension, finite numbers, ``k'`` in 1..1000.

    Returns ``{"collection", "run_id", "format", "answer", "k_prime", "n_query_rows", "rows",
    "kahm", "codes", "timings_ms", "request_log_id"}``; ``answer``: ``"compact"`` or ``"full"``;
    a full answer's ``rows[c]``: ``{"row", "item_ids", "external_ids", "labels", "scores",
    "payloads"[, "features" ((k', p) float32)][, "codes" ((k', b) uint8)][, "predicted",
    "class_scores"]}``, best first (a compact one's: :func:`~pm_vector.db.resolve.requests.compact_rows`);
    ``kahm``: ``{"model_id", "classes"}`` or None; ``codes``: ``{"bytes": b, "digest"}`` or None
    without codes."""
    shortlist = bounds.shortlist(req.shortlist if shortlist is None else shortlist)
    want_codes = compact or code_bytes is not None
    t = time.perf_counter()
    with run_snapshot(collection, conn if read_conn is None else read_conn, include_features) as (rconn, meta):
        coll = meta["coll"]
        doc = _check_class_rows_against_run(meta, req, collection, max_query_rows)
        run_id = int(meta["run"]["id"])
        code_dim, digest = check_codes(doc, collection, run_id, code_bytes) if want_codes else (None, None)
        kahm_id = (coll.get("kahm_model_id") if class_scores and not compact and outputs_allowed(coll)
                   else None)
        timings["lookup"] = (time.perf_counter() - t) * 1e3

        t = time.perf_counter()
        joins = {"codes_run_id": run_id if want_codes else None, "kahm_model_id": kahm_id, "code_bytes": code_dim,
                 "code_offset": code_offset(doc, code_dim) if want_codes else 0}
        configure(rconn)
        extra = {"feature_dim": int(coll["feature_dim"]) if include_features else None,
                 "code_dim": code_dim, "kahm": kahm_id is not None}
        out_rows, n_found, t_fetch = _fetch_rows(rconn, meta, doc, req, shortlist, collection, include_features,
                                                 compact, joins, extra, timings, t)
        timings["fetch"] = (time.perf_counter() - t_fetch) * 1e3
        timings["shortlist"] = (time.perf_counter() - t) * 1e3
        if read_conn is None:
            log_id = finish(rconn, collection, req, raw, run_id=run_id, n_rows=n_found, received=received, t0=t0,
                            log=log, timings=timings)
        else:  # read on a replica: end its snapshot; the log goes to the primary, before the answer
            rconn.rollback()
    if read_conn is not None:
        log_id = log_on_primary(conn, collection, req, raw, run_id=run_id, n_rows=n_found, received=received,
                                t0=t0, log=log, timings=timings)
    C = req.n_rows
    timings["total"] = (time.perf_counter() - t0) * 1e3
    return {"collection": collection, "run_id": run_id, "format": CLASS_ROWS_FORMAT,
            "answer": "compact" if compact else "full", "k_prime": shortlist, "n_query_rows": C,
            "rows": out_rows,
            "kahm": None if kahm_id is None else {"model_id": int(kahm_id),
                                                  "classes": [int(c) for c in coll["kahm_classes"]]},
            "codes": None if code_dim is None else {"bytes": int(code_dim), "digest": digest},
            "timings_ms": {a: round(b, 3) for a, b in timings.items()}, "request_log_id": log_id}


def _explain_class_rows(collection: str, req: ClassRowsRequest, include_features: bool) -> dict[str, list[str]]:
    shortlist = bounds.shortlist(req.shortlist)
    with connect() as conn:
        meta = run_row(conn, collection)
        doc = _check_class_rows_against_run(meta, req, collection, MAX_QUERY_ROWS)
        rows = np.asarray(req.rows, dtype=np.float64).tolist()
        sig = [float(v) for v in req.sigmas]
        # as resolve runs it (class scores on, where the policy lets them out)
        joins = {"kahm_model_id": meta["coll"].get("kahm_model_id") if outputs_allowed(meta["coll"]) else None}
        out: dict[str, list[str]] = {}
        if run_graph.supports(conn, meta):
            # what resolve runs: the prior k-NN of the rows whose class is searched, then the candidates
            graph = run_graph.run_graph(conn, meta)
            labels = [int(c) for c in doc["classes"]]
            mp = int(doc.get("max_prior") or 1024)
            search = run_graph.searched_rows(doc, labels, mp)
            with conn.transaction():
                conn.execute("SELECT pm_vector.pm_prepare_prior_search(%s)", [mp])
                out["prior_knn"] = [r[0] for r in conn.execute(
                    explain(run_graph.prior_knn_statement(graph.run_id, int(doc["n_components"]), mp)),
                    [[rows[i] for i in search], [labels[i] for i in search]]).fetchall()] if search else []
            configure(conn)
            _, ids, _ = _scored_candidates(conn, meta, doc, req, shortlist, {})
            out["statement"] = [r[0] for r in conn.execute(
                explain(_items_statement(meta["coll"], include_features, **joins)), [Int8Array(ids)]).fetchall()]
        else:
            out["statement"] = [r[0] for r in conn.execute(
                explain(_shortlist_statement(meta["coll"], include_features, **joins)),
                [collection, rows, sig, shortlist]).fetchall()]
        # the SQL function's own statement (SQL callers; sharded and older runs through resolve)
        out["shortlist"] = [r[0] for r in conn.execute(
            "SELECT * FROM pm_vector.pm_shortlist_explain(%s, %s::float8[], %s::float8[], %s)",
            [collection, rows, sig, shortlist]).fetchall()]
        conn.rollback()
    return out
