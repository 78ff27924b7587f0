"""Resolution of PrivateMail requests against a collection's active run, in PostgreSQL.

::

    public_anchor(collection) -> (PublicAnchor, frame_info)      (see pm_vector.db.frame)
    client_frame(collection) -> AnchorFrame                      (rebuilt from public data, verified)
    class_frames(collection) -> ClassFrames                      (class-rows requests)
    resolve(collection, request, k=8, include_features=False, *, conn=None, max_query_rows=1000) -> dict
    explain_resolution(collection, request, k=8) -> dict         (the plans of resolve's statement)
    rerank(query_features, rows_features, k=None) -> indices     (client side)
    ReleaseOnlyPrivateMail(frame, ...).request_release(query, label, anchor) -> (ReleaseRequest, ClientSecret)
    post_process_release(collection, release) -> PrivateMailRequest   (server side of that option)

What :func:`resolve` does, in order, writing nothing until the last step:

1. *parse and validate* the request (a :class:`~pm_vector.client.PrivateMailRequest`, its dict,
   its JSON text, or a :class:`ReleaseRequest` / its JSON): row counts, finite numbers, ``k``;
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

Class-rows requests (format ``"pm_vector.class-rows/1"``)
----------------------------------------------------------
:func:`resolve` also takes a :class:`~pm_vector.client.query.QueryRequest` (object, dict or JSON
text): one noised row per class in the active run's class frames. A client builds it from
:func:`public_anchor` (``frame_info["class_frames"]`` -> ``ClassFrames.from_dict``, the dummy
pool of the :class:`~pm_vector.client.PublicAnchor`) or :func:`class_frames`. The server checks
the frames digest (a request built on other frames is refused: fetch the current public
anchor), one row per class in the run's order, finite numbers, ``k'`` in 1..1000, then answers
**all** rows with **one** statement, ``pm_vector.pm_shortlist`` (``sql/0005_class_rows.sql``:
the posterior shortlist of :class:`pm_vector.shortlist.PosteriorShortlist`, computed in SQL from
the run's prior, raw-feature graph and hub tables) joined with the items, in the same REPEATABLE
READ transaction as the checks and the log. With ``include_features`` (and
``allow_raw_features``) every candidate of every row carries its raw features, so the answer
does not depend on which row is real; the client re-ranks its real row locally
(:meth:`~pm_vector.client.query.PrivateKNN.rerank`). With ``include_codes`` (any collection)
every candidate of every row carries its published compact code (``run_<id>_codes``, see
:mod:`pm_vector.db.class_rows`); the client re-ranks by ``||projection.transform(x) - code||``
with the :class:`~pm_vector.manifold.codes.PublicProjection` of :func:`public_anchor`. When the
collection has a KAHM model every candidate also carries its class scores, as on the PrivateMail
path. Codes and scores are joined in the same single statement.

Iteration-distribute-recursion (the paper's option)
---------------------------------------------------
A client may stop after the private first iteration and send its noisy release
(:class:`ReleaseOnlyPrivateMail` builds such a :class:`ReleaseRequest`); the server then runs
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
``n_post_iter`` is capped (:data:`MAX_POST_ITER`).

Client-side re-ranking
----------------------
When a collection allows raw features (``allow_raw_features=True``) a client may ask for
``k' > k`` candidates with ``include_features=True`` and re-rank them by its own raw
features (:func:`rerank`), which the server never sees. :func:`rerank_precision` measures
what that does to precision@k.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from .._validation import as_labels, as_matrix
from ..client import PrivateMail
from ..client.request import FORMAT as REQUEST_FORMAT
from ..client.query import FORMAT as CLASS_ROWS_FORMAT
from ..client.query import QueryRequest
from ..client.request import ClientSecret, PrivateMailRequest
from ..errors import AlignmentError, InvalidInputError, PMVectorError
from .api import log_request
from .engine import connect
from .errors import ClassRowsUnavailableError, DimensionMismatchError, RawFeaturesNotAllowedError, translate_sql_error
from .frame import (FrameMismatchError, RunFrame, _run_row, anchor_id, anchor_ids, class_frames,  # noqa: F401
                    client_frame, public_anchor, run_frame)

RELEASE_FORMAT = "pm_vector.privatemail-release/1"
#: query rows per request (each is one HNSW index scan of the statement)
MAX_QUERY_ROWS = 1000
MAX_K = 1000
#: post-processing iterations a release-only request may ask the server to run
MAX_POST_ITER = 2000
#: request JSON text larger than this is refused before parsing
MAX_REQUEST_BYTES = 64 * 1024 * 1024


def _loads(text: str):
    """JSON text -> Python objects: orjson when installed (about 8x faster on a request's
    thousands of floats), else the standard library; NaN/Infinity tokens (which orjson
    refuses as invalid JSON) go to the standard library, so that they get the precise error."""
    try:
        import orjson
    except ImportError:
        return json.loads(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _dumps(obj) -> str:
    try:
        import orjson
    except ImportError:
        return json.dumps(obj, allow_nan=False)
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY).decode()


_blas = None


def _one_blas_thread():
    """A context limiting BLAS to one thread: the alignment's small SVD and products are ~20x
    slower with OpenBLAS threads spinning on a busy machine (measured 60 ms vs 3 ms)."""
    global _blas
    try:
        if _blas is None:
            from threadpoolctl import ThreadpoolController

            _blas = ThreadpoolController()
        return _blas.limit(limits=1, user_api="blas")
    except Exception:  # noqa: BLE001 - threadpoolctl missing or failing: run as is
        import contextlib

        return contextlib.nullcontext()


class AnchorIdMismatchError(InvalidInputError):
    """The request's anchor ids are not the active run's anchor set's ids, in order."""


class RequestError(InvalidInputError):
    """A request is malformed (shape, counts, numbers, format)."""


class FramesDigestMismatchError(InvalidInputError):
    """A class-rows request was built on other class frames than the active run's."""


# ----------------------------------------------------------------------------- release-only requests

@dataclass
class ReleaseRequest:
    """A PrivateMail request that stops after the private first iteration.

    ``release``: the noisy first iteration ``f(X) + noise`` of all ``C + A`` rows (query rows
    in the client's shuffled order, then the anchor rows in ``anchor_ids`` order);
    ``query_labels``: the C query rows' labels in that order (the post-processing needs
    them); ``noise_sigma``/``q_rms``: what the post-processing's bandwidth uses;
    ``n_post_iter``/``post_alpha``: its iterations. See the module doc for what the client
    reveals by sending this instead of a post-processed :class:`PrivateMailRequest`.
    """

    anchor_ids: list
    release: np.ndarray
    query_labels: list
    epsilon: float
    delta: float
    sensitivity: float
    noise_sigma: float
    q_rms: float
    mechanism: str
    n_post_iter: int
    post_alpha: float
    params: dict = field(default_factory=dict)
    collection: str | None = None

    def __post_init__(self):
        self.release = as_matrix(self.release, "release")
        self.query_labels = [int(v) for v in as_labels(np.asarray(self.query_labels), len(self.query_labels),
                                                       "query_labels")]
        if len(self.query_labels) < 1:
            raise RequestError("a release request needs at least one query row (query_labels is empty).")
        if len(self.anchor_ids) + len(self.query_labels) != self.release.shape[0]:
            raise RequestError(f"release has {self.release.shape[0]} rows; expected {len(self.query_labels)} query "
                               f"rows + {len(self.anchor_ids)} anchor rows.")
        for name in ("epsilon", "delta", "sensitivity", "noise_sigma", "q_rms", "post_alpha"):
            v = float(getattr(self, name))
            if not math.isfinite(v) or v < 0:
                raise RequestError(f"{name} must be a finite number >= 0, got {v!r}.")
            setattr(self, name, v)
        if self.q_rms <= 0:
            raise RequestError("q_rms must be positive.")
        if isinstance(self.n_post_iter, bool) or int(self.n_post_iter) != self.n_post_iter or \
                not 0 <= int(self.n_post_iter) <= MAX_POST_ITER:
            raise RequestError(f"n_post_iter must be an integer in 0..{MAX_POST_ITER}, got {self.n_post_iter!r}.")
        self.n_post_iter = int(self.n_post_iter)

    @property
    def n_query_rows(self) -> int:
        return len(self.query_labels)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["release"] = self.release.tolist()
        d["anchor_ids"] = [a.item() if isinstance(a, np.generic) else a for a in self.anchor_ids]
        d["format"] = RELEASE_FORMAT
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping) -> "ReleaseRequest":
        if not isinstance(d, Mapping):
            raise RequestError("a release request must be a JSON object.")
        if d.get("format") != RELEASE_FORMAT:
            raise RequestError(f"unsupported format {d.get('format')!r}; expected {RELEASE_FORMAT!r}.")
        need = ("anchor_ids", "release", "query_labels", "epsilon", "delta", "sensitivity", "noise_sigma", "q_rms",
                "mechanism", "n_post_iter", "post_alpha")
        missing = [k for k in need if k not in d]
        if missing:
            raise RequestError(f"release request is missing fields: {', '.join(missing)}.")
        try:
            rel = np.asarray(d["release"], dtype=np.float64)
        except (TypeError, ValueError):
            raise RequestError("release must be a list of equal-length lists of numbers.") from None
        if not isinstance(d["anchor_ids"], list) or not isinstance(d["query_labels"], list):
            raise RequestError("anchor_ids and query_labels must be lists.")
        try:
            return cls(anchor_ids=list(d["anchor_ids"]), release=rel, query_labels=list(d["query_labels"]),
                       epsilon=float(d["epsilon"]), delta=float(d["delta"]), sensitivity=float(d["sensitivity"]),
                       noise_sigma=float(d["noise_sigma"]), q_rms=float(d["q_rms"]), mechanism=str(d["mechanism"]),
                       n_post_iter=d["n_post_iter"], post_alpha=float(d["post_alpha"]),
                       params=dict(d.get("params") or {}), collection=d.get("collection"))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, InvalidInputError):
                raise
            raise RequestError(f"release request has a field of the wrong type ({exc}).") from None


class ReleaseOnlyPrivateMail(PrivateMail):
    """A :class:`~pm_vector.client.PrivateMail` client that can stop after the noisy first
    iteration and leave the post-processing to the server (iteration-distribute-recursion).

    :meth:`request_release` runs exactly the steps of :meth:`PrivateMail.request` -- same
    dummies, shuffle, noise for the same seed -- but returns the release instead of
    post-processing it. :meth:`request` still builds ordinary requests.
    """

    _capture: dict | None = None

    def post_process(self, release, query_labels, *, noise_sigma: float, q_rms: float):
        if self._capture is None:
            return super().post_process(release, query_labels, noise_sigma=noise_sigma, q_rms=q_rms)
        self._capture.update(release=np.array(release, dtype=np.float64), query_labels=np.asarray(query_labels),
                             noise_sigma=float(noise_sigma), q_rms=float(q_rms))
        return np.zeros((len(query_labels), self.frame.anchor_embedding_.shape[1]))

    def request_release(self, query, label: int, anchor, collection: str | None = None):
        """``(ReleaseRequest, ClientSecret)`` for one query row; nothing is post-processed."""
        self._capture = {}
        try:
            req, secret = self.request(query, label, anchor, collection)
            cap = self._capture
        finally:
            self._capture = None
        rel = ReleaseRequest(anchor_ids=list(req.anchor_ids), release=cap["release"],
                             query_labels=[int(v) for v in cap["query_labels"]], epsilon=req.epsilon,
                             delta=req.delta, sensitivity=req.sensitivity, noise_sigma=cap["noise_sigma"],
                             q_rms=cap["q_rms"], mechanism=req.mechanism, n_post_iter=int(self.n_post_iter),
                             post_alpha=float(self.post_alpha), params=dict(req.params), collection=collection)
        return rel, secret


def _post_process(rf: RunFrame, rel: ReleaseRequest) -> PrivateMailRequest:
    from ..manifold.laplacian import single_threaded

    frame = rf.frame()
    unknown = sorted(set(rel.query_labels) - set(int(c) for c in frame.classes_))
    if unknown:
        raise RequestError(f"query_labels {unknown} are not classes of the run's anchor set "
                           f"{frame.classes_.tolist()}.")
    pm = PrivateMail(frame, epsilon=max(rel.epsilon, 1e-12), delta=rel.delta, n_post_iter=rel.n_post_iter,
                     post_alpha=rel.post_alpha, _rng=0)
    with single_threaded():
        Zq = pm.post_process(rel.release, np.asarray(rel.query_labels), noise_sigma=rel.noise_sigma, q_rms=rel.q_rms)
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
    rel = release if isinstance(release, ReleaseRequest) else _parse(release)[0]
    if not isinstance(rel, ReleaseRequest):
        raise RequestError("post_process_release needs a release-only request (format "
                           f"{RELEASE_FORMAT!r}).")
    with connect() as conn:
        meta = _run_row(conn, collection)
        rf = run_frame(conn, collection, meta)
        conn.rollback()
    _check_against_run(rf, rel.anchor_ids, rel.release.shape[1], rel.n_query_rows, MAX_QUERY_ROWS, collection,
                       rel.collection)
    return _post_process(rf, rel)


# ----------------------------------------------------------------------------- parsing and checks

def _parse(request) -> tuple[PrivateMailRequest | ReleaseRequest, str | None]:
    """The request object and, when it came as JSON text, that text (logged verbatim)."""
    raw: str | None = None
    if isinstance(request, (PrivateMailRequest, ReleaseRequest, QueryRequest)):
        return request, None
    if isinstance(request, (bytes, bytearray, memoryview)):
        try:
            request = bytes(request).decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError("the request is not UTF-8 JSON text.") from None
    if isinstance(request, str):
        if len(request) > MAX_REQUEST_BYTES:
            raise RequestError(f"the request is {len(request)} characters long; at most {MAX_REQUEST_BYTES}.")
        raw = request
        try:
            request = _loads(request)
        except json.JSONDecodeError as exc:
            raise RequestError(f"the request is not valid JSON: {exc}.") from None
    if not isinstance(request, Mapping):
        raise RequestError(f"a request must be a PrivateMailRequest, a ReleaseRequest, or their JSON object/text; "
                           f"got {type(request).__name__}.")
    fmt = request.get("format", REQUEST_FORMAT)
    if fmt == RELEASE_FORMAT:
        return ReleaseRequest.from_dict(request), raw
    if fmt == CLASS_ROWS_FORMAT:
        try:
            return QueryRequest.from_dict(request), raw
        except InvalidInputError:
            raise
        except (TypeError, ValueError, KeyError) as exc:
            raise RequestError(f"the class-rows request has a field of the wrong type ({exc}).") from None
    if fmt != REQUEST_FORMAT:
        raise RequestError(f"unsupported request format {fmt!r}; expected {REQUEST_FORMAT!r}, {RELEASE_FORMAT!r} "
                           f"or {CLASS_ROWS_FORMAT!r}.")
    if not isinstance(request.get("anchor_ids", []), list):
        raise RequestError("anchor_ids must be a list.")
    try:
        return PrivateMailRequest.from_dict(dict(request)), raw
    except InvalidInputError:
        raise
    except (TypeError, ValueError) as exc:
        raise RequestError(f"the request has a field of the wrong type ({exc}).") from None


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= int(k) <= MAX_K:
        raise InvalidInputError(f"k must be an integer in 1..{MAX_K}, got {k!r}.")
    return int(k)


def _check_rows(req) -> None:
    if isinstance(req, QueryRequest):
        return _check_class_rows(req)
    emb = req.release if isinstance(req, ReleaseRequest) else req.embedding
    emb = np.asarray(emb)
    if emb.ndim != 2 or emb.dtype.kind not in "fiu":
        raise RequestError(f"the request's embedding must be a 2-d numeric array, got shape {emb.shape}.")
    if not np.all(np.isfinite(emb)):
        bad = int(np.argwhere(~np.isfinite(emb))[0][0])
        raise RequestError(f"the request's embedding contains NaN or infinite values (first at row {bad}); "
                           "a valid client never sends them -- rebuild the request.")
    n_q = req.n_query_rows
    if isinstance(n_q, bool) or int(n_q) != n_q or int(n_q) < 1:
        raise RequestError(f"n_query_rows must be a positive integer, got {n_q!r}.")
    if len(req.anchor_ids) + int(n_q) != emb.shape[0]:
        raise RequestError(f"the request's embedding has {emb.shape[0]} rows; expected {int(n_q)} query rows + "
                           f"{len(req.anchor_ids)} anchor rows.")


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


# ----------------------------------------------------------------------------- resolution

def _knn_statement(coll: Mapping[str, Any], include_features: bool, kahm_model_id: int | None = None) -> str:
    col = "features" if coll["feature_type"] == "vector" else "features_half"
    feat = f", i.{col}" if include_features else ""
    scores = ", sc.predicted, sc.scores" if kahm_model_id is not None else ""
    # LATERAL by primary key, OFFSET 0 so it is not flattened into a join: one index lookup per returned
    # row, whatever the planner thinks of the function's size (it would hash-join a seq scan of items)
    return ("SELECT b.query_index, b.rank, b.item_id, b.external_id, b.label, b.distance, i.payload" + feat + scores +
            " FROM pm_vector.pm_knn_batch(%s, %s::vector[], %s, %s) AS b"
            " CROSS JOIN LATERAL (SELECT it.payload" + (f", it.{col}" if include_features else "") +
            " FROM pm_vector.items AS it WHERE it.id = b.item_id OFFSET 0) AS i" +
            (" LEFT JOIN LATERAL (SELECT s.predicted, s.scores FROM pm_vector.kahm_item_scores AS s"
             f" WHERE s.model_id = {int(kahm_model_id)} AND s.item_id = b.item_id OFFSET 0) AS sc ON true"
             if kahm_model_id is not None else "") +
            " ORDER BY b.query_index, b.rank")


def _begin_snapshot(conn) -> None:
    if conn.info.transaction_status != 0:  # psycopg.pq.TransactionStatus.IDLE
        raise InvalidInputError("resolve() needs an idle connection (no transaction in progress).")
    if conn.autocommit:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    else:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")


def _vectors(Q: np.ndarray):
    from pgvector import Vector

    return [Vector(r) for r in np.asarray(Q, dtype=np.float32)]


def resolve(collection: str, request, k: int = 8, include_features: bool = False, *, conn=None,
            max_query_rows: int = MAX_QUERY_ROWS, ef_search: int | None = None, log: bool = True,
            class_scores: bool = True, k_prime: int | None = None, include_codes: bool = False) -> dict[str, Any]:
    """Resolve a PrivateMail or a class-rows request against ``collection``'s active run.

    A class-rows request (:class:`~pm_vector.client.query.QueryRequest`, its dict or JSON text,
    format ``"pm_vector.class-rows/1"``) is answered by :func:`_resolve_class_rows` (see there:
    ``k`` is not used, the candidates per row are the request's ``shortlist`` or ``k_prime``;
    ``include_codes``: every candidate of every row carries its published compact code).

    ``request``: a :class:`~pm_vector.client.PrivateMailRequest`, a :class:`ReleaseRequest`
    (the server post-processes it first), either one's dict, or JSON text (``str``/``bytes``,
    logged verbatim). ``k``: neighbours per query row (1..1000). ``include_features``: also
    return the items' raw features (the collection must allow it). ``conn``: an idle psycopg
    connection from :func:`pm_vector.db.connect` to reuse (a server's pool); by default one is
    opened. ``log=False`` skips the request log (benchmarks of the statement alone only).

    Returns ``{"collection", "run_id", "k", "n_query_rows", "rows", "alignment", "timings_ms",
    "request_log_id"}`` where ``rows[i]`` answers query row ``i`` (the client keeps which one
    is real: ``ClientSecret.pick(result["rows"])``) with ``item_ids``, ``external_ids``,
    ``labels``, ``distances`` (lists, nearest first), ``payloads`` and, if asked,
    ``features`` (``(k, d)`` float32 array).

    When the collection has a KAHM model (:func:`pm_vector.db.kahm.fit_kahm_models`) and
    ``class_scores`` is true, every row also carries ``class_scores`` (per returned item, its
    class-matching scores of Definition 8 in the order of ``result["kahm"]["classes"]``; None for
    an item ingested after the model) and ``predicted`` (the model's label, Definition 7);
    ``result["kahm"]`` is ``{"model_id", "classes"}`` (None without a model). They are read
    from the scores stored with the model: one primary-key lookup per returned item.

    Raises (nothing written): CollectionNotFoundError, NoActiveRunError, AnchorIdMismatchError,
    DimensionMismatchError, RequestError (NaN/inf, malformed, too many rows),
    RawFeaturesNotAllowedError, AlignmentError (a foreign frame); for class-rows requests also
    FramesDigestMismatchError (other class frames) and ClassRowsUnavailableError (a run
    without class rows).
    """
    from ..alignment import align_request

    received = dt.datetime.now(dt.timezone.utc)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    k = _check_k(k)
    if isinstance(max_query_rows, bool) or int(max_query_rows) < 1:
        raise InvalidInputError("max_query_rows must be a positive integer.")
    req, raw = _parse(request)
    _check_rows(req)
    timings["parse"] = (time.perf_counter() - t0) * 1e3
    if isinstance(req, QueryRequest):
        return _resolve_class_rows(collection, req, raw, include_features, conn=conn, max_query_rows=max_query_rows,
                                   k_prime=k_prime, log=log, received=received, t0=t0, timings=timings,
                                   include_codes=include_codes, class_scores=class_scores)
    if include_codes:
        raise InvalidInputError("include_codes applies to class-rows requests (format "
                                f"{CLASS_ROWS_FORMAT!r}); the paper's protocol has no codes.")

    own = conn is None
    if own:
        conn = connect()
    try:
        t = time.perf_counter()
        _begin_snapshot(conn)
        try:
            meta = _run_row(conn, collection)
            coll = meta["coll"]
            if include_features and not (coll["settings"] or {}).get("allow_raw_features", False):
                raise RawFeaturesNotAllowedError(
                    f"collection {collection!r} does not allow returning raw features to clients (its setting "
                    "allow_raw_features is false); resolve without include_features, or create the collection "
                    "with allow_raw_features=True.")
            rf = run_frame(conn, collection, meta)
            dim = (req.release if isinstance(req, ReleaseRequest) else req.embedding).shape[1]
            _check_against_run(rf, req.anchor_ids, dim, req.n_query_rows, max_query_rows, collection,
                               req.collection)
            timings["lookup"] = (time.perf_counter() - t) * 1e3

            t = time.perf_counter()
            if isinstance(req, ReleaseRequest):
                pm_req = _post_process(rf, req)
                timings["post_process"] = (time.perf_counter() - t) * 1e3
                t = time.perf_counter()
            else:
                pm_req = req
            with _one_blas_thread():
                aligned = align_request(pm_req, rf.anchor_ids if pm_req.anchor_ids == rf.anchor_ids
                                        else pm_req.anchor_ids, rf.anchor_embedding)
            if not np.all(np.isfinite(aligned)) or np.abs(aligned).max() > 3e38:
                raise RequestError("the aligned query rows are not finite float32 values; the request is corrupted.")
            timings["align"] = (time.perf_counter() - t) * 1e3

            t = time.perf_counter()
            kahm_id = coll.get("kahm_model_id") if class_scores else None
            cur = conn.execute(_knn_statement(coll, include_features, kahm_id),
                               [collection, _vectors(aligned), k, ef_search], binary=True)
            rows = cur.fetchall()
            timings["knn"] = (time.perf_counter() - t) * 1e3
            log_id = None
            if log:  # in the same transaction: one commit, and nothing is logged unless all went well
                t = time.perf_counter()
                finished = dt.datetime.now(dt.timezone.utc)
                if raw is None:  # serialised once (log_request would serialise twice)
                    raw = _dumps(req.to_dict())
                log_id = log_request(collection, None, run_id=rf.run_id,
                                     row_count=len(rows), received_at=received, finished_at=finished,
                                     duration_ms=(time.perf_counter() - t0) * 1e3, conn=conn, request_json=raw)
                timings["log"] = (time.perf_counter() - t) * 1e3
            else:
                conn.commit()
        except BaseException as exc:
            conn.rollback()
            if isinstance(exc, Exception):
                err = translate_sql_error(exc)
                if err is not exc:
                    raise err from None
            raise

        C = int(pm_req.n_query_rows)
        out_rows: list[dict[str, Any]] = [{"row": i, "item_ids": [], "external_ids": [], "labels": [], "distances": [],
                                           "payloads": []} for i in range(C)]
        feats: list[list] = [[] for _ in range(C)]
        if kahm_id is not None:
            for o in out_rows:
                o["predicted"], o["class_scores"] = [], []
            si = 8 if include_features else 7
        for r in rows:
            o = out_rows[r[0] - 1]
            if kahm_id is not None:
                o["predicted"].append(None if r[si] is None else int(r[si]))
                o["class_scores"].append(None if r[si + 1] is None else [float(v) for v in r[si + 1]])
            o["item_ids"].append(int(r[2]))
            o["external_ids"].append(r[3])
            o["labels"].append(int(r[4]))
            o["distances"].append(float(r[5]))
            o["payloads"].append(r[6])
            if include_features:
                v = r[7]
                feats[r[0] - 1].append(np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v, dtype=np.float32))
        if include_features:
            d = int(coll["feature_dim"])
            for o, f in zip(out_rows, feats):
                o["features"] = np.stack(f) if f else np.zeros((0, d), np.float32)
    finally:
        if own:
            conn.close()
    timings["total"] = (time.perf_counter() - t0) * 1e3
    return {"collection": collection, "run_id": rf.run_id, "k": k, "n_query_rows": C, "rows": out_rows,
            "release_only": isinstance(req, ReleaseRequest),
            "kahm": None if kahm_id is None else {"model_id": int(kahm_id),
                                                  "classes": [int(c) for c in coll["kahm_classes"]]},
            "timings_ms": {a: round(b, 3) for a, b in timings.items()}, "request_log_id": log_id}


def explain_resolution(collection: str, request, k: int = 8, include_features: bool = False) -> dict[str, list[str]]:
    """The plans of :func:`resolve`'s statement for this request, without running it or logging:
    ``{"statement": EXPLAIN of the outer statement, "knn": pm_knn_batch_explain of the
    k-NN statement pm_knn_batch runs inside (one HNSW index scan per query row)}``; for a
    class-rows request ``{"statement", "shortlist": pm_shortlist_explain of the statement
    pm_shortlist runs inside}``."""
    from ..alignment import align_request

    k = _check_k(k)
    req, _ = _parse(request)
    _check_rows(req)
    if isinstance(req, QueryRequest):
        return _explain_class_rows(collection, req, include_features)
    with connect() as conn:
        meta = _run_row(conn, collection)
        rf = run_frame(conn, collection, meta)
        dim = (req.release if isinstance(req, ReleaseRequest) else req.embedding).shape[1]
        _check_against_run(rf, req.anchor_ids, dim, req.n_query_rows, MAX_QUERY_ROWS, collection, req.collection)
        pm_req = _post_process(rf, req) if isinstance(req, ReleaseRequest) else req
        vecs = _vectors(align_request(pm_req, rf.anchor_ids, rf.anchor_embedding))
        stmt = _knn_statement(meta["coll"], include_features, meta["coll"].get("kahm_model_id"))  # as resolve runs it
        outer = [r[0] for r in conn.execute("EXPLAIN " + stmt, [collection, vecs, k, None]).fetchall()]
        inner = [r[0] for r in conn.execute("SELECT * FROM pm_vector.pm_knn_batch_explain(%s, %s::vector[], %s)",
                                            [collection, vecs, k]).fetchall()]
        conn.rollback()
    return {"statement": outer, "knn": inner}


# ----------------------------------------------------------------------------- class-rows requests

def _check_class_rows(req: QueryRequest) -> None:
    rows = np.asarray(req.rows)
    if rows.ndim != 2 or rows.dtype.kind not in "fiu":
        raise RequestError(f"the request's rows must be a 2-d numeric array, got shape {rows.shape}.")
    if not np.all(np.isfinite(rows)):
        bad = int(np.argwhere(~np.isfinite(rows))[0][0])
        raise RequestError(f"the request's rows contain NaN or infinite values (first at row {bad}); a valid client "
                           "never sends them -- rebuild the request.")
    sig = np.asarray(req.sigmas, dtype=np.float64).reshape(-1)
    if sig.shape[0] != rows.shape[0] or not np.all(np.isfinite(sig)) or np.any(sig <= 0):
        raise RequestError(f"sigmas must be {rows.shape[0]} finite numbers > 0 (one per row).")
    if len(req.classes) != rows.shape[0]:
        raise RequestError(f"the request has {rows.shape[0]} rows but {len(req.classes)} classes.")


def _check_k_prime(kp) -> int:
    if isinstance(kp, bool) or not isinstance(kp, (int, np.integer)) or not 1 <= int(kp) <= MAX_K:
        raise InvalidInputError(f"k' (the request's shortlist, or k_prime) must be an integer in 1..{MAX_K}, "
                                f"got {kp!r}.")
    return int(kp)


def _check_class_rows_against_run(meta: Mapping[str, Any], req: QueryRequest, collection: str,
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
            "current public anchor (pm_vector.db.resolution.public_anchor: frame_info['class_frames'] and the "
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


def _shortlist_statement(coll: Mapping[str, Any], include_features: bool, *, codes_run_id: int | None = None,
                         kahm_model_id: int | None = None) -> str:
    """The one statement answering every row: ``row_index, rank, item_id, external_id, label,
    score, payload[, features][, code][, predicted, scores]``. ``codes_run_id``: join every
    candidate's code from that run's ``run_<id>_codes``; ``kahm_model_id``: join every
    candidate's stored KAHM class scores (the lookup of :func:`_knn_statement`)."""
    col = "features" if coll["feature_type"] == "vector" else "features_half"
    # LATERAL by primary key, OFFSET 0: one index lookup per returned candidate
    return ("SELECT s.row_index, s.rank, s.item_id, s.external_id, s.label, s.score, i.payload" +
            (f", i.{col}" if include_features else "") +
            (", cd.code" if codes_run_id is not None else "") +
            (", sc.predicted, sc.scores" if kahm_model_id is not None else "") +
            " FROM pm_vector.pm_shortlist(%s, %s::float8[], %s::float8[], %s, NULL::integer) AS s"
            " CROSS JOIN LATERAL (SELECT it.payload" + (f", it.{col}" if include_features else "") +
            " FROM pm_vector.items AS it WHERE it.id = s.item_id OFFSET 0) AS i" +
            (" LEFT JOIN LATERAL (SELECT c.code FROM pm_vector.run_" + str(int(codes_run_id)) + "_codes AS c"
             " WHERE c.item_id = s.item_id OFFSET 0) AS cd ON true" if codes_run_id is not None else "") +
            (" LEFT JOIN LATERAL (SELECT k.predicted, k.scores FROM pm_vector.kahm_item_scores AS k"
             f" WHERE k.model_id = {int(kahm_model_id)} AND k.item_id = s.item_id OFFSET 0) AS sc ON true"
             if kahm_model_id is not None else "") +
            " ORDER BY s.row_index, s.rank")


def _resolve_class_rows(collection: str, req: QueryRequest, raw: str | None, include_features: bool, *, conn,
                        max_query_rows: int, k_prime, log: bool, received, t0: float,
                        timings: dict[str, float], include_codes: bool = False,
                        class_scores: bool = True) -> dict[str, Any]:
    """Answer a class-rows request: every row's ``k'`` candidates (``pm_vector.pm_shortlist``, ONE
    statement for all rows, in the same REPEATABLE READ snapshot as the checks), joined with the
    items for payloads and -- with ``include_features`` on a collection that allows raw features --
    the raw features of every candidate of every row (so the answer does not depend on which row
    is real). With ``include_codes`` (any collection: the codes are what it publishes instead of
    raw features) every candidate of every row carries its compact code from the run's
    ``run_<id>_codes``; when the collection has a KAHM model and ``class_scores`` is true, every
    candidate of every row carries its stored class scores and predicted label (the lookup of the
    PrivateMail path). Codes and scores are joined in the same single statement. Checks first
    (nothing written on error): collection, frames digest, one row per class in the run's class
    order, the frames' dimension, finite numbers, ``k'`` in 1..1000.

    Returns ``{"collection", "run_id", "format", "k_prime", "n_query_rows", "rows", "kahm",
    "code_dim", "timings_ms", "request_log_id"}``; ``rows[c]``: ``{"row", "item_ids",
    "external_ids", "labels", "scores", "payloads"[, "features" ((k', p) float32)][, "codes"
    ((k', m) float16)][, "predicted", "class_scores"]}``, best first; ``kahm``:
    ``{"model_id", "classes"}`` or None; ``code_dim``: m, or None without ``include_codes``."""
    kp = _check_k_prime(req.shortlist if k_prime is None else k_prime)
    if not isinstance(include_codes, (bool, np.bool_)):
        raise InvalidInputError(f"include_codes must be true or false, got {include_codes!r}.")
    own = conn is None
    if own:
        conn = connect()
    try:
        t = time.perf_counter()
        _begin_snapshot(conn)
        try:
            meta = _run_row(conn, collection)
            coll = meta["coll"]
            if include_features and not (coll["settings"] or {}).get("allow_raw_features", False):
                raise RawFeaturesNotAllowedError(
                    f"collection {collection!r} does not allow returning raw features to clients (its setting "
                    "allow_raw_features is false); resolve without include_features, or create the collection "
                    "with allow_raw_features=True.")
            doc = _check_class_rows_against_run(meta, req, collection, max_query_rows)
            run_id = int(meta["run"]["id"])
            code_dim = _check_codes(doc, collection, run_id) if include_codes else None
            kahm_id = coll.get("kahm_model_id") if class_scores else None
            timings["lookup"] = (time.perf_counter() - t) * 1e3

            t = time.perf_counter()
            cur = conn.execute(_shortlist_statement(coll, include_features,
                                                    codes_run_id=run_id if include_codes else None,
                                                    kahm_model_id=kahm_id),
                               [collection, np.asarray(req.rows, dtype=np.float64).tolist(),
                                [float(v) for v in req.sigmas], kp], binary=True)
            rows = cur.fetchall()
            timings["shortlist"] = (time.perf_counter() - t) * 1e3
            log_id = None
            if log:
                t = time.perf_counter()
                finished = dt.datetime.now(dt.timezone.utc)
                if raw is None:
                    raw = _dumps(req.to_dict())
                log_id = log_request(collection, None, run_id=run_id, row_count=len(rows), received_at=received,
                                     finished_at=finished, duration_ms=(time.perf_counter() - t0) * 1e3, conn=conn,
                                     request_json=raw)
                timings["log"] = (time.perf_counter() - t) * 1e3
            else:
                conn.commit()
        except BaseException as exc:
            conn.rollback()
            if isinstance(exc, Exception):
                err = translate_sql_error(exc)
                if err is not exc:
                    raise err from None
            raise
    finally:
        if own:
            conn.close()
    C = req.n_rows
    out_rows: list[dict[str, Any]] = [{"row": i, "item_ids": [], "external_ids": [], "labels": [], "scores": [],
                                       "payloads": []} for i in range(C)]
    feats: list[list] = [[] for _ in range(C)]
    codes: list[list] = [[] for _ in range(C)]
    if kahm_id is not None:
        for o in out_rows:
            o["predicted"], o["class_scores"] = [], []
    ci = 8 if include_features else 7  # the code's column
    si = ci + (1 if include_codes else 0)  # the KAHM columns'
    for r in rows:
        o = out_rows[r[0] - 1]
        o["item_ids"].append(int(r[2]))
        o["external_ids"].append(r[3])
        o["labels"].append(int(r[4]))
        o["scores"].append(float(r[5]))
        o["payloads"].append(r[6])
        if include_features:
            v = r[7]
            feats[r[0] - 1].append(np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v, dtype=np.float32))
        if include_codes:
            v = r[ci]
            codes[r[0] - 1].append(np.full(code_dim, np.nan, np.float16) if v is None else
                                   np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v, dtype=np.float16))
        if kahm_id is not None:
            o["predicted"].append(None if r[si] is None else int(r[si]))
            o["class_scores"].append(None if r[si + 1] is None else [float(v) for v in r[si + 1]])
    if include_features:
        d = int(coll["feature_dim"])
        for o, f in zip(out_rows, feats):
            o["features"] = np.stack(f) if f else np.zeros((0, d), np.float32)
    if include_codes:
        for o, f in zip(out_rows, codes):
            o["codes"] = np.stack(f) if f else np.zeros((0, code_dim), np.float16)
    timings["total"] = (time.perf_counter() - t0) * 1e3
    return {"collection": collection, "run_id": run_id, "format": CLASS_ROWS_FORMAT, "k_prime": kp,
            "n_query_rows": C, "rows": out_rows,
            "kahm": None if kahm_id is None else {"model_id": int(kahm_id),
                                                  "classes": [int(c) for c in coll["kahm_classes"]]},
            "code_dim": code_dim, "timings_ms": {a: round(b, 3) for a, b in timings.items()},
            "request_log_id": log_id}


def _check_codes(doc: Mapping[str, Any], collection: str, run_id: int) -> int:
    """The run's code dimension; ClassRowsUnavailableError when the run publishes no codes."""
    m = doc.get("code_dim")
    if not m:
        raise ClassRowsUnavailableError(
            f"the active run {run_id} of collection {collection!r} publishes no compact codes (it was built before "
            "codes existed); resolve without include_codes, or run a new embedding job for the collection.")
    return int(m)


def _explain_class_rows(collection: str, req: QueryRequest, include_features: bool) -> dict[str, list[str]]:
    kp = _check_k_prime(req.shortlist)
    with connect() as conn:
        meta = _run_row(conn, collection)
        _check_class_rows_against_run(meta, req, collection, MAX_QUERY_ROWS)
        rows = np.asarray(req.rows, dtype=np.float64).tolist()
        sig = [float(v) for v in req.sigmas]
        stmt = _shortlist_statement(meta["coll"], include_features,  # as resolve runs it (class scores on)
                                    kahm_model_id=meta["coll"].get("kahm_model_id"))
        outer = [r[0] for r in conn.execute("EXPLAIN " + stmt,
                                            [collection, rows, sig, kp]).fetchall()]
        inner = [r[0] for r in conn.execute(
            "SELECT * FROM pm_vector.pm_shortlist_explain(%s, %s::float8[], %s::float8[], %s)",
            [collection, rows, sig, kp]).fetchall()]
        conn.rollback()
    return {"statement": outer, "shortlist": inner}


# ----------------------------------------------------------------------------- client-side re-ranking

def rerank(query_features, rows_features, k: int | None = None) -> np.ndarray:
    """Client side: the order of the candidates by Euclidean distance of their raw features to
    the client's own query features (stable for ties); the first ``k`` if given.

    ``rows_features``: ``(k', d)`` (the ``features`` of the client's real row in
    :func:`resolve`'s answer). Returns indices into the candidates."""
    q = np.asarray(query_features, dtype=np.float64).reshape(1, -1)
    R = as_matrix(rows_features, "rows_features")
    if R.shape[1] != q.shape[1]:
        raise InvalidInputError(f"candidates have {R.shape[1]} features; the query has {q.shape[1]}.")
    d = ((R - q) ** 2).sum(1)
    order = np.argsort(d, kind="stable")
    return order if k is None else order[: int(k)]


def rerank_precision(results: list[dict], query_features, query_labels, k: int = 8) -> dict[str, float]:
    """precision@k of the real rows' answers as returned (first k) and after client-side
    re-ranking of all returned candidates by raw features (keep k).

    ``results``: the real row of each query (``ClientSecret.pick(resolve(...)["rows"])``,
    resolved with ``k' >= k`` and ``include_features=True``)."""
    yq = np.asarray(query_labels)
    plain, rer = [], []
    for r, x, y in zip(results, np.asarray(query_features), yq):
        lab = np.asarray(r["labels"])
        plain.append(np.mean(lab[:k] == y))
        rer.append(np.mean(lab[rerank(x, r["features"], k)] == y))
    return {f"precision_at_{k}": float(np.mean(plain)), f"precision_at_{k}_reranked": float(np.mean(rer)),
            "candidates": int(len(results[0]["labels"])) if results else 0, "queries": int(len(results))}


__all__ = ["AnchorIdMismatchError", "CLASS_ROWS_FORMAT", "ClassRowsUnavailableError", "FramesDigestMismatchError",
           "QueryRequest", "class_frames",
           "FrameMismatchError", "MAX_QUERY_ROWS", "RELEASE_FORMAT", "ReleaseOnlyPrivateMail",
           "ReleaseRequest", "RequestError", "anchor_id", "anchor_ids", "client_frame", "explain_resolution",
           "post_process_release", "public_anchor", "rerank", "rerank_precision", "resolve", "ClientSecret",
           "AlignmentError", "PMVectorError"]
