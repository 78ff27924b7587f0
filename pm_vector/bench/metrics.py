"""Class-based retrieval metrics.

A retrieved item is *relevant* to a query when it has the query's class label. All
functions take ``retrieved_labels``, a ``(q, k)`` integer array whose row ``i`` holds the
labels of the ``k`` items retrieved for query ``i`` in rank order (best first), and
``query_labels``, the ``(q,)`` labels of the queries.

``recall_at_k`` is the metric of the PrivateMail papers: the fraction of queries with *at
least one* relevant item among the ``k`` retrieved. With few classes it is lenient (random
retrieval over ``C`` balanced classes scores ``1 - (1 - 1/C)^k``, see
:func:`chance_recall_at_k`), so report :func:`precision_at_k` and :func:`map_at_k` beside it.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError

__all__ = [
    "average_precision_at_k",
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
