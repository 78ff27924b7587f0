"""The server's resolve of the paper's requests (PrivateMail, ``protocol="privatemail_paper"``).

What :func:`resolve_paper` does, in order, writing nothing until the last step:

1. *parse and validate* the request (a :class:`~pm_vector.client.PrivateMailRequest`, its dict,
   its JSON text, or a :class:`~pm_vector.client.release.ReleaseRequest` / its JSON): row counts, finite numbers, ``k``;
2. read the collection and its active run (one query; the run's anchor ids and stored anchor
   embedding are cached per run, which never changes once it succeeded) and check the
   request against it: the anchor ids must be the run's anchor set's ids ``"S:0" .. "S:A-1"``
   in order, the embedding must have the run's dimension, at most ``max_query_rows`` rows;
3. *align* the request's anchor rows onto the run's stored anchor embedding
   (:func:`pm_vector.alignment.align_request`, Kabsch-Umeyama with a residual check) and map
   the query rows with the same similarity;
4. answer **all** query rows with **one** SQL statement: ``pm_vector.pm_knn_batch`` (one HNSW
   index scan per row, LATERAL) joined with the items for payloads (and raw features). Steps
   2-4 run in one REPEATABLE READ transaction, so the run that aligned the rows is the run
   that answers them even if a job switches runs meanwhile;
5. log the request with :func:`pm_vector.db.log_request`: the released request JSON (as
   received), the timing and the number of rows returned -- nothing else.

Any error in steps 1-4 raises a clear exception and nothing is written.

Iteration-distribute-recursion (the paper's option)
---------------------------------------------------
A client may stop after the private first iteration and send its noisy release
(:class:`~pm_vector.client.release.ReleaseOnlyPrivateMail` builds such a
:class:`~pm_vector.client.release.ReleaseRequest`); the server then runs
the post-processing iterations itself (:func:`post_process_release`) against the run's frame,
rebuilt from the same public data the client would use, and resolves the result as above.
For the same seed the answer is the same as when the client post-processes (tested).

What the client reveals by doing so: the release ``f(X) + noise`` of all ``C + A`` rows
(already (eps, delta)-DP: the post-processed request is computed from it and public data
only, so sending the release instead costs no privacy beyond the same (eps, delta)), the
query rows' labels in the shuffled row order (the post-processing needs them, as on the
client; they were revealed anyway -- each post-processed row sits in its class's region of
the frame -- and they are "every class once" for every query), the noise scale and ``q_rms``
(functions of (eps, delta), the public frame and the sizes) and its post-processing
parameters (public). It does not reveal which row is real: that stays in the client's
:class:`~pm_vector.client.ClientSecret`. In exchange the server spends the post-processing
time (a ``C x (C + A)`` graph and ``n_post_iter`` iterations), which is why
``n_post_iter`` is capped (:data:`pm_vector.client.release.MAX_POST_ITER`).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np
from pgvector import Vector
from psycopg import sql

from ...protocol.formats import RELEASE_FORMAT
from ...protocol.paper import PrivateMailRequest, ReleaseRequest
from ...errors import RequestError
from ..postgres import connect
from ..errors import AnchorIdMismatchError, DimensionMismatchError
from .frame import RunFrame, run_row, run_frame
from .requests import (MAX_QUERY_ROWS, one_blas_thread, outputs_allowed, parse_request,
                       answer_rows, finish, run_snapshot)
from ...alignment import align_request
from ...manifold import post_process
from ...manifold.laplacian import single_threaded
from ..core.features import feature_sql


def _post_process(rf: RunFrame, rel: ReleaseRequest) -> PrivateMailRequest:
    frame = rf.frame()
    unknown = sorted(set(rel.query_labels) - set(int(c) for c in frame.classes_))
    if unknown:
        raise RequestError(f"query_labels {unknown} are not classes of the run's anchor set "
                           f"{frame.classes_.tolist()}.")
    with single_threaded():
        Zq = post_process.post_process_release(frame, rel.release, np.asarray(rel.query_labels), noise_sigma=rel.noise_sigma,
                                  q_rms=rel.q_rms, n_post_iter=rel.n_post_iter, post_alpha=rel.post_alpha)
    if not np.all(np.isfinite(Zq)):
        raise RequestError("the post-processing of this release did not converge (non-finite rows); the release "
                           "is corrupted.")
    return PrivateMailRequest(anchor_ids=list(rel.anchor_ids), embedding=np.vstack([Zq, frame.anchor_embedding_]),
                              n_query_rows=rel.n_query_rows, epsilon=rel.epsilon, delta=rel.delta,
                              sensitivity=rel.sensitivity, noise_sigma=rel.noise_sigma, mechanism=rel.mechanism,
                              params=dict(rel.params), collection=rel.collection)


def post_process_release(collection: str, release) -> PrivateMailRequest:
    """Server side of iteration-distribute-recursion: the post-processed request for a
    :class:`ReleaseRequest` (object, dict or JSON), computed with the active run's frame."""
    rel = parse_request(release)[0]  # (a request object comes back as it is)
    if not getattr(rel, "release_only", False):
        raise RequestError("post_process_release needs a release-only request (format "
                           f"{RELEASE_FORMAT!r}).")
    with connect() as conn:
        meta = run_row(conn, collection)
        rf = run_frame(conn, collection, meta)
        conn.rollback()
    _check_against_run(rf, rel.anchor_ids, rel.release.shape[1], rel.n_query_rows, MAX_QUERY_ROWS, collection,
                       rel.collection)
    return _post_process(rf, rel)


def _check_against_run(rf: RunFrame, ids, dim: int, n_query_rows: int, max_query_rows: int, collection: str,
                       req_collection) -> None:
    if req_collection is not None and req_collection != collection:
        raise RequestError(f"the request was built for collection {req_collection!r}, not {collection!r}.")
    if int(n_query_rows) > int(max_query_rows):
        raise RequestError(f"the request has {int(n_query_rows)} query rows; at most {int(max_query_rows)} are "
                           "answered per request.")
    expected = rf.anchor_ids
    got = ids if isinstance(ids, list) else list(ids)
    if got != expected and [str(a) for a in got] != expected:
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if str(a) != b), min(len(got), len(expected)))
        raise AnchorIdMismatchError(
            f"the request's anchor ids do not match the anchor set of collection {collection!r}'s active run "
            f"{rf.run_id} (anchor set {rf.anchor_set_id}: {len(expected)} ids "
            f"{expected[0] if expected else ''}..{expected[-1] if expected else ''}; the request has {len(got)}, "
            f"first difference at position {first}). Fetch the current public anchor "
            "(pm_vector.db.public_anchor) and rebuild the request.")
    if int(dim) != rf.embedding_dim:
        raise DimensionMismatchError(
            f"the request's embedding has dimension {int(dim)}, but collection {collection!r}'s active run "
            f"{rf.run_id} embeds in {rf.embedding_dim}; rebuild the frame with the run's parameters "
            "(pm_vector.db.client_frame).")


def _knn_statement(coll: Mapping[str, Any], include_features: bool, kahm_model_id: int | None = None) -> sql.Composed:
    col = sql.Identifier("features" if coll["feature_type"] == "vector" else "features_half")
    none = sql.SQL("")
    # LATERAL by primary key, OFFSET 0 so it is not flattened into a join: one index lookup per returned
    # row, whatever the planner thinks of the function's size (it would hash-join a seq scan of items)
    return sql.SQL(
        "SELECT b.query_index, b.rank, b.item_id, b.external_id, b.label, b.distance, i.payload{feat}{scores}"
        " FROM pm_vector.pm_knn_batch(%s, %s::vector[], %s, %s) AS b"
        " CROSS JOIN LATERAL (SELECT it.payload{ifeat} FROM pm_vector.items AS it WHERE it.id = b.item_id OFFSET 0) AS i"
        "{kahm} ORDER BY b.query_index, b.rank").format(
        feat=sql.SQL(", i.{}").format(col) if include_features else none,
        scores=sql.SQL(", sc.predicted, sc.scores") if kahm_model_id is not None else none,
        ifeat=sql.SQL(", {} AS {}").format(feature_sql(coll, "it", answer=True), col) if include_features else none,
        kahm=sql.SQL(" LEFT JOIN LATERAL (SELECT s.predicted, s.scores FROM pm_vector.kahm_item_scores AS s"
                     " WHERE s.model_id = {} AND s.item_id = b.item_id OFFSET 0) AS sc ON true").format(
            sql.Literal(int(kahm_model_id))) if kahm_model_id is not None else none)


def _vectors(Q: np.ndarray):
    return [Vector(r) for r in np.asarray(Q, dtype=np.float32)]


def resolve_paper(collection: str, req, raw: str | None, k: int, include_features: bool, *, conn,
                  max_query_rows: int, ef_search: int | None, log: bool, class_scores: bool, received, t0: float,
                  timings: dict[str, float]) -> dict[str, Any]:
    """Resolve a parsed and checked PrivateMail (or release-only) request: align, ONE
    ``pm_knn_batch`` statement, log (see the module doc); called by
    :func:`pm_vector.db.resolve.resolution.resolve`, which documents the arguments and the result."""
    t = time.perf_counter()
    with run_snapshot(collection, conn, include_features) as (conn, meta):
        coll = meta["coll"]
        rf = run_frame(conn, collection, meta)
        dim = req.rows.shape[1]
        _check_against_run(rf, req.anchor_ids, dim, req.n_query_rows, max_query_rows, collection, req.collection)
        timings["lookup"] = (time.perf_counter() - t) * 1e3

        t = time.perf_counter()
        if req.release_only:
            pm_req = _post_process(rf, req)
            timings["post_process"] = (time.perf_counter() - t) * 1e3
            t = time.perf_counter()
        else:
            pm_req = req
        with one_blas_thread():
            aligned = align_request(pm_req, rf.anchor_ids if pm_req.anchor_ids == rf.anchor_ids
                                    else pm_req.anchor_ids, rf.anchor_embedding)
        if not np.all(np.isfinite(aligned)) or np.abs(aligned).max() > 3e38:
            raise RequestError("the aligned query rows are not finite float32 values; the request is corrupted.")
        timings["align"] = (time.perf_counter() - t) * 1e3

        t = time.perf_counter()
        kahm_id = coll.get("kahm_model_id") if class_scores and outputs_allowed(coll) else None
        cur = conn.execute(_knn_statement(coll, include_features, kahm_id),
                           [collection, _vectors(aligned), k, ef_search], binary=True)
        rows = cur.fetchall()
        timings["knn"] = (time.perf_counter() - t) * 1e3
        log_id = finish(conn, collection, req, raw, run_id=rf.run_id, n_rows=len(rows), received=received, t0=t0,
                        log=log, timings=timings)

    C = int(pm_req.n_query_rows)
    out_rows = answer_rows(rows, C, "distances", feature_dim=int(coll["feature_dim"]) if include_features else None,
                           kahm=kahm_id is not None)
    timings["total"] = (time.perf_counter() - t0) * 1e3
    return {"collection": collection, "run_id": rf.run_id, "k": k, "n_query_rows": C, "rows": out_rows,
            "release_only": req.release_only,
            "kahm": None if kahm_id is None else {"model_id": int(kahm_id),
                                                  "classes": [int(c) for c in coll["kahm_classes"]]},
            "timings_ms": {a: round(b, 3) for a, b in timings.items()}, "request_log_id": log_id}


def explain_paper(collection: str, req, k: int, include_features: bool) -> dict[str, list[str]]:
    """The plans of :func:`resolve_paper`'s statement for a parsed request (see
    :func:`pm_vector.db.resolve.resolution.explain_resolution`)."""
    with connect() as conn:
        meta = run_row(conn, collection)
        rf = run_frame(conn, collection, meta)
        dim = req.rows.shape[1]
        _check_against_run(rf, req.anchor_ids, dim, req.n_query_rows, MAX_QUERY_ROWS, collection, req.collection)
        pm_req = _post_process(rf, req) if req.release_only else req
        vecs = _vectors(align_request(pm_req, rf.anchor_ids, rf.anchor_embedding))
        kahm_id = meta["coll"].get("kahm_model_id") if outputs_allowed(meta["coll"]) else None
        stmt = _knn_statement(meta["coll"], include_features, kahm_id)  # as resolve runs it
        outer = [r[0] for r in conn.execute(sql.SQL("EXPLAIN {}").format(stmt), [collection, vecs, k, None]).fetchall()]
        inner = [r[0] for r in conn.execute("SELECT * FROM pm_vector.pm_knn_batch_explain(%s, %s::vector[], %s)",
                                            [collection, vecs, k]).fetchall()]
        conn.rollback()
    return {"statement": outer, "knn": inner}
