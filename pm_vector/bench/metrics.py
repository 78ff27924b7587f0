"""Class-based retrieval metrics.

A retrieved item is *relevant* to a query when it has the query's class label. All
functions take ``retrieved_labels``, a ``(q, k)`` integer array whose row ``i`` holds the
labels of the ``k`` items retrieved for query ``i`` in rank order (best first), and
``query_labels``, the ``(q,)`` labels of the queries.

``recall_at_k`` is the metric of the PrivateMail papers: the fraction of queries with *at
least one* relevant item among the ``k`` retrieved. With few classes it is lenient (random
retrieval over ``C`` balanced classes scores ``1 - (1 - 1/C)^k``, see
:func:`chance_recall_at_k`), so report :func:`precision_at_k` and :func:`map_at_k` beside it.

Neighbour metrics (no labels): :func:`nn_recall_at_k` compares retrieved item *indices* with the
exact non-private ``k`` nearest server items of each query (on unit-norm features cosine and
Euclidean rank alike), and :func:`distinct_lists_per_class` measures how much the retrieved
lists depend on the query beyond its class. Transfer sizes: :func:`candidate_bytes`,
:func:`float_payload_bytes`, :func:`bytes_per_request`, :func:`collection_bytes`.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError
from ..deprecation import renamed_keywords
from ..client.query import rerank
from ..protocol.codec import MSGPACK, encode

__all__ = [
    "wire_answer_bytes",
    "wire_bytes",
    "wire_request_bytes",
    "ID_BYTES",
    "average_precision_at_k",
    "bytes_per_request",
    "candidate_bytes",
    "collection_bytes",
    "distinct_lists_per_class",
    "rerank_precision",
    "float_payload_bytes",
    "nn_recall_at_k",
    "chance_precision_at_k",
    "chance_recall_at_k",
    "hits",
    "map_at_k",
    "precision_at_k",
    "recall_at_k",
]


def _int_array(a, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise InvalidInputError(f"{name} must hold integer class labels; got non-integer values.")
    elif arr.dtype.kind not in "iu":
        raise InvalidInputError(f"{name} must hold integer class labels; got dtype {arr.dtype}.")
    return arr.astype(np.int64)


def _check_k(k, available: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InvalidInputError(f"k must be a positive integer; got {k!r}.")
    if k > available:
        raise InvalidInputError(f"k={k} but only {available} retrieved labels per query were given.")
    return int(k)


def hits(retrieved_labels, query_labels, k: int | None = None) -> np.ndarray:
    """Boolean ``(q, k)`` relevance matrix: ``retrieved_labels[i, j] == query_labels[i]``.

    ``k`` (default: all columns) keeps only the first ``k`` ranks. Shapes are validated:
    ``retrieved_labels`` must be 2-d with one row per query and at least one column.
    """
    r = _int_array(retrieved_labels, "retrieved_labels")
    if r.ndim != 2:
        raise InvalidInputError(f"retrieved_labels must be 2-d (queries x k); got shape {r.shape}.")
    qy = _int_array(query_labels, "query_labels")
    if qy.ndim != 1:
        raise InvalidInputError(f"query_labels must be 1-d (one label per query); got shape {qy.shape}.")
    if r.shape[0] != qy.shape[0]:
        raise InvalidInputError(f"retrieved_labels has {r.shape[0]} rows but there are {qy.shape[0]} query labels.")
    if r.shape[0] == 0:
        raise InvalidInputError("no queries: retrieved_labels has 0 rows.")
    if r.shape[1] == 0:
        raise InvalidInputError("retrieved_labels has 0 columns (k = 0).")
    if k is not None:
        r = r[:, :_check_k(k, r.shape[1])]
    return r == qy[:, None]


def recall_at_k(retrieved_labels, query_labels, k: int | None = None) -> float:
    """Fraction of queries with at least one retrieved item of the query's class (the papers' Recall@k)."""
    return float(np.mean(np.any(hits(retrieved_labels, query_labels, k), axis=1)))


def precision_at_k(retrieved_labels, query_labels, k: int | None = None) -> float:
    """Mean over queries of the fraction of the ``k`` retrieved items that have the query's class."""
    return float(np.mean(hits(retrieved_labels, query_labels, k)))


def average_precision_at_k(retrieved_labels, query_labels, k: int | None = None,
                           n_relevant=None) -> np.ndarray:
    """Per-query average precision at ``k``, a ``(q,)`` float array.

    ``AP@k = (1 / Z) * sum_{i <= k} P@i * rel_i`` with ``rel_i`` the relevance of rank ``i``
    and ``P@i`` the precision of the first ``i`` ranks. The normaliser ``Z`` is
    ``min(k, n_relevant)`` when ``n_relevant`` (scalar or ``(q,)``: number of items of the
    query's class in the database) is given, and otherwise the number of relevant items
    retrieved (then AP is 0 for a query with no relevant item retrieved).
    """
    h = hits(retrieved_labels, query_labels, k).astype(np.float64)
    kk = h.shape[1]
    prec_at_i = np.cumsum(h, axis=1) / np.arange(1, kk + 1)
    num = np.sum(prec_at_i * h, axis=1)
    if n_relevant is None:
        z = h.sum(axis=1)
    else:
        nr = np.broadcast_to(np.asarray(n_relevant, dtype=np.float64), (h.shape[0],))
        if np.any(~np.isfinite(nr)) or np.any(nr < 0) or np.any(nr != np.round(nr)):
            raise InvalidInputError("n_relevant must be non-negative integers.")
        if np.any(h.sum(axis=1) > nr):
            raise InvalidInputError("n_relevant is smaller than the number of relevant items retrieved for some query.")
        z = np.minimum(kk, nr)
    out = np.zeros(h.shape[0])
    np.divide(num, z, out=out, where=z > 0)
    return out


def map_at_k(retrieved_labels, query_labels, k: int | None = None, n_relevant=None) -> float:
    """Mean of :func:`average_precision_at_k` over the queries."""
    return float(np.mean(average_precision_at_k(retrieved_labels, query_labels, k, n_relevant)))


def _frequencies(freq, name: str) -> np.ndarray:
    p = np.asarray(freq, dtype=np.float64)
    if p.ndim != 1 or p.shape[0] == 0:
        raise InvalidInputError(f"{name} must be a non-empty 1-d array (one entry per class); got shape {p.shape}.")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise InvalidInputError(f"{name} must be finite, non-negative and not all zero.")
    return p / p.sum()


def chance_recall_at_k(class_frequencies, k: int, query_frequencies=None) -> float:
    """Expected :func:`recall_at_k` of random retrieval.

    ``class_frequencies`` are the class counts or proportions of the database; each of the
    ``k`` retrieved labels is drawn independently from them (sampling with replacement, a
    close approximation when the database is much larger than ``k``). The query's class is
    drawn from ``query_frequencies`` (default: the same). Result:
    ``sum_c q_c (1 - (1 - p_c)^k)``; for ``C`` balanced classes ``1 - (1 - 1/C)^k``.
    """
    k = _check_k(k, np.iinfo(np.int64).max)
    p = _frequencies(class_frequencies, "class_frequencies")
    q = p if query_frequencies is None else _frequencies(query_frequencies, "query_frequencies")
    if q.shape != p.shape:
        raise InvalidInputError(f"query_frequencies has {q.shape[0]} classes, class_frequencies {p.shape[0]}.")
    return float(np.sum(q * (1.0 - (1.0 - p) ** k)))


def chance_precision_at_k(class_frequencies, query_frequencies=None) -> float:
    """Expected :func:`precision_at_k` of random retrieval (any ``k``): ``sum_c q_c p_c``."""
    p = _frequencies(class_frequencies, "class_frequencies")
    q = p if query_frequencies is None else _frequencies(query_frequencies, "query_frequencies")
    if q.shape != p.shape:
        raise InvalidInputError(f"query_frequencies has {q.shape[0]} classes, class_frequencies {p.shape[0]}.")
    return float(np.sum(q * p))


# --------------------------------------------------------------------------------------
# neighbour metrics (item indices, no labels)
# --------------------------------------------------------------------------------------

def _index_matrix(a, name: str) -> np.ndarray:
    arr = _int_array(a, name)
    if arr.ndim != 2:
        raise InvalidInputError(f"{name} must be 2-d (queries x items); got shape {arr.shape}.")
    if arr.shape[0] == 0:
        raise InvalidInputError(f"no queries: {name} has 0 rows.")
    if arr.shape[1] == 0:
        raise InvalidInputError(f"{name} has 0 columns.")
    return arr


def nn_recall_at_k(retrieved_idx, true_idx) -> float:
    """Mean over queries of the share of the exact ``k`` nearest items that were retrieved.

    ``true_idx`` ``(q, k)``: indices of each query's exact non-private ``k`` nearest server items
    (raw features); ``retrieved_idx`` ``(q, m)``: the indices a method returned (usually ``m = k``).
    Query ``i`` scores ``|set(retrieved_idx[i]) & set(true_idx[i])| / k`` (order-free; a repeated
    index counts once). With ``m = k`` it is both the recall and the precision of the exact
    neighbour set.
    """
    r = _index_matrix(retrieved_idx, "retrieved_idx")
    t = _index_matrix(true_idx, "true_idx")
    if r.shape[0] != t.shape[0]:
        raise InvalidInputError(f"retrieved_idx has {r.shape[0]} rows but true_idx has {t.shape[0]}.")
    found = (t[:, :, None] == r[:, None, :]).any(axis=2)              # (q, k): true item i,j came back
    # a true list with a repeated index counts that neighbour once
    k = np.array([len(set(row.tolist())) for row in t], dtype=np.float64)
    first = np.ones_like(found)
    for j in range(1, t.shape[1]):
        first[:, j] = ~(t[:, :j] == t[:, j:j + 1]).any(axis=1)
    return float(np.mean((found & first).sum(axis=1) / k))


def distinct_lists_per_class(retrieved_idx, query_labels) -> float:
    """Mean over the query classes of ``(# distinct retrieved lists) / (# queries of the class)``.

    Lists are compared as sets (each row sorted), so a method that returns the same items for
    every query of a class -- what the label alone allows -- scores ``1 / n_c`` per class, and
    one whose every query gets its own list scores 1.
    """
    r = _index_matrix(retrieved_idx, "retrieved_idx")
    y = _int_array(query_labels, "query_labels")
    if y.ndim != 1 or y.shape[0] != r.shape[0]:
        raise InvalidInputError(f"query_labels must be 1-d with one label per row of retrieved_idx "
                                f"({r.shape[0]}); got shape {y.shape}.")
    rs = np.sort(r, axis=1)
    shares = []
    for c in np.unique(y):
        rows = rs[y == c]
        shares.append(len({tuple(row.tolist()) for row in rows}) / rows.shape[0])
    return float(np.mean(shares))


# --------------------------------------------------------------------------------------
# transfer sizes
# --------------------------------------------------------------------------------------

#: bytes of one item id on the wire (bigint)
ID_BYTES = 8
#: bytes of one raw feature (float32, as pgvector stores it)
FEATURE_BYTES = 4
#: bytes of one released number (float64)
FLOAT_BYTES = 8


def _nonneg_int(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise InvalidInputError(f"{name} must be a non-negative integer; got {v!r}.")
    return int(v)


def float_payload_bytes(n_numbers: int, *, n_ids: int = 0) -> int:
    """Binary size of a request: ``n_numbers`` float64 values plus ``n_ids`` 8-byte integers."""
    return FLOAT_BYTES * _nonneg_int(n_numbers, "n_numbers") + ID_BYTES * _nonneg_int(n_ids, "n_ids")


def candidate_bytes(n_candidates: int, n_rows: int, dim: int, value_bytes: int = FEATURE_BYTES) -> int:
    """Size of an answer of ``n_candidates`` items for each of ``n_rows`` request rows, each
    item an 8-byte id plus ``dim`` values of ``value_bytes`` (raw float32 features by default;
    2 for a published halfvec code) -- what the client re-ranks with."""
    return (_nonneg_int(n_candidates, "n_candidates") * _nonneg_int(n_rows, "n_rows")
            * (ID_BYTES + _nonneg_int(value_bytes, "value_bytes") * _nonneg_int(dim, "dim")))


def collection_bytes(n_items: int, dim: int) -> int:
    """Size of the whole collection (ids and raw float32 features): what downloading it all costs."""
    return candidate_bytes(n_items, 1, dim)


def bytes_per_request(request_bytes: float, n_candidates: int, n_rows: int, dim: int) -> float:
    """Request plus response bytes of one query (see :func:`candidate_bytes`)."""
    rb = float(request_bytes)
    if not np.isfinite(rb) or rb < 0:
        raise InvalidInputError(f"request_bytes must be a finite number >= 0; got {request_bytes!r}.")
    return rb + candidate_bytes(n_candidates, n_rows, dim)


def rerank_precision(results: list[dict], query_features, query_labels, k: int = 8) -> dict[str, float]:
    """precision@k of the real rows' answers as returned (first k) and after the client's
    re-rank of all returned candidates by raw features (keep k).

    ``results``: the real row of each query (``secret.pick(resolve(...)["rows"])``, resolved
    with ``k' >= k`` and ``include_features=True``)."""
    yq = np.asarray(query_labels)
    plain, rer = [], []
    for r, x, y in zip(results, np.asarray(query_features), yq):
        lab = np.asarray(r["labels"])
        plain.append(np.mean(lab[:k] == y))
        rer.append(np.mean(lab[rerank(x, r["features"], k)] == y))
    return {f"precision_at_{k}": float(np.mean(plain)), f"precision_at_{k}_reranked": float(np.mean(rer)),
            "candidates": int(len(results[0]["labels"])) if results else 0, "queries": int(len(results))}


# --------------------------------------------------------------------------------------
# bytes on the wire (msgpack, pm_vector.protocol.codec)
# --------------------------------------------------------------------------------------

#: ids on the wire in a compact or raw answer (uint32, as the compact answer's ``item_ids``)
WIRE_ID_DTYPE = np.uint32


def wire_bytes(doc) -> int:
    """Bytes of ``doc`` on the wire as msgpack (:func:`pm_vector.protocol.codec.encode`)."""
    return len(encode(doc, MSGPACK))


@renamed_keywords(k_prime="shortlist")  # its old keyword, until 0.3.0
def wire_answer_bytes(n_rows: int, shortlist: int, *, dim: int | None = None, code_bytes: int | None = None,
                      fields: dict | None = None) -> int:
    """Bytes on the wire of an answer of ``n_rows`` rows of ``shortlist`` candidates each: per row
    ``item_ids`` (uint32 ``(k',)``) and either ``codes`` (uint8 ``(k', code_bytes)``: the compact
    answer) or ``features`` (float32 ``(k', dim)``: the raw-feature answer), plus ``fields`` at the
    top level. The arrays' contents do not change their size."""
    n, shortlist = _nonneg_int(n_rows, "n_rows"), _nonneg_int(shortlist, "shortlist")
    if (dim is None) == (code_bytes is None):
        raise InvalidInputError("give exactly one of dim (raw features) or code_bytes (compact codes).")
    ids = np.zeros(shortlist, dtype=WIRE_ID_DTYPE)
    if code_bytes is not None:
        row = {"item_ids": ids, "codes": np.zeros((shortlist, _nonneg_int(code_bytes, "code_bytes")), dtype=np.uint8)}
    else:
        row = {"item_ids": ids, "features": np.zeros((shortlist, _nonneg_int(dim, "dim")), dtype=np.float32)}
    return wire_bytes({**(fields or {}), "rows": [row] * n})


def wire_request_bytes(n_numbers: int, n_ids: int = 0, fields: dict | None = None) -> int:
    """Bytes on the wire of a request of ``n_numbers`` float64 values and ``n_ids`` uint32 ids (for
    the methods whose request is not a pm_vector request object)."""
    return wire_bytes({**(fields or {}), "values": np.zeros(_nonneg_int(n_numbers, "n_numbers")),
                       "ids": np.zeros(_nonneg_int(n_ids, "n_ids"), dtype=WIRE_ID_DTYPE)})
