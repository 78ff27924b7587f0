"""The client's local re-rank: one function (:func:`rank`) orders a real row's candidates by their
distance to the client's own query, by raw features or by published product codes.

Used by :func:`rerank` (positions), :meth:`PrivateKNN.rerank <pm_vector.client.query.PrivateKNN.rerank>`
and :meth:`~pm_vector.client.query.PrivateKNN.rerank_codes` (ids), and
:meth:`Client.query <pm_vector.client.http.Client.query>` (the answer's row, re-ordered by
:func:`rerank_row`). The server never sees the query's features: this runs on the client, after
the answer, and sends nothing.
"""

from __future__ import annotations

import numpy as np

from .._validation import as_matrix
from ..errors import InvalidInputError


def rank(query, candidate_features=None, *, codes=None, product_codes=None) -> tuple[np.ndarray, np.ndarray]:
    """``(order, distances)``: the candidates' positions by distance to ``query``, nearest first
    (stable for ties), and each candidate's distance (in candidate order).

    By raw features (``candidate_features``, one row per candidate): the Euclidean distance.
    By product codes (``codes``, the ``(n, b)`` uint8 prefixes of a compact answer, and
    ``product_codes``, the published :class:`~pm_vector.manifold.codes.ProductCodes`): the
    asymmetric distance of the exact query to each coded candidate
    (:meth:`~pm_vector.manifold.codes.ProductCodes.distances`). The query is used as given."""
    q = np.asarray(query, dtype=np.float64)
    if codes is not None:
        if product_codes is None:
            raise InvalidInputError("re-ranking by codes needs the published product codes.")
        C = np.asarray(codes, dtype=np.uint8)
        if C.ndim != 2:
            raise InvalidInputError("codes must be a 2-d array, one row per candidate.")
        if C.shape[0] == 0:
            return np.zeros(0, np.int64), np.zeros(0)
        d = np.asarray(product_codes.distances(q.ravel(), C), dtype=np.float64)
        return np.argsort(d, kind="stable"), d
    q = q.reshape(1, -1)
    R = as_matrix(candidate_features, "candidate_features")
    if R.shape[1] != q.shape[1]:
        raise InvalidInputError(f"candidates have {R.shape[1]} features; the query has {q.shape[1]}.")
    d2 = ((R - q) ** 2).sum(1)
    return np.argsort(d2, kind="stable"), np.sqrt(d2)


def rerank(query_features, candidate_features, k: int | None = None) -> np.ndarray:
    """Client side: positions of the candidates ordered by Euclidean distance of their features
    (raw features, or published codes with the query projected alike) to the client's own query,
    stable for ties; the first ``k`` if given (:func:`rank`). The server never sees the query's
    features."""
    order = rank(query_features, candidate_features)[0]
    return order if k is None else order[: int(k)]


def rerank_ids(query, candidate_ids, candidate_features=None, k: int = 8, *, codes=None,
               product_codes=None) -> np.ndarray:
    """The ``k`` candidate ids nearest to ``query`` (:func:`rank`, by features or by codes)."""
    ids = np.asarray(candidate_ids)
    if codes is not None:
        C = np.asarray(codes, dtype=np.uint8)
        if C.ndim != 2 or C.shape[0] != ids.shape[0]:
            raise InvalidInputError("codes must have one row per candidate id.")
    else:
        F = np.asarray(candidate_features, dtype=np.float64)
        if F.ndim != 2 or F.shape[0] != ids.shape[0]:
            raise InvalidInputError("candidate_features must have one row per candidate id.")
        if F.shape[0] == 0:
            return ids[:0]
    if ids.shape[0] == 0:
        return ids[:0]
    return ids[rank(query, candidate_features, codes=codes, product_codes=product_codes)[0][: int(k)]]


def rerank_row(row: dict, q_raw: np.ndarray, mode, req, pc, b) -> str | bool:
    """:meth:`Client.query <pm_vector.client.http.Client.query>`'s real row (an answer's row dict)
    re-ranked by :func:`rank`, in place, with its distances (``mode``: by the candidates' raw
    features or their codes, ``b`` bytes of the product codes ``pc``); the features and codes
    dropped. Returns how it was re-ranked (``mode``), or False."""
    n = len(row["item_ids"])
    reranked: str | bool = False
    q = q_raw / max(float(np.linalg.norm(q_raw)), 1e-12)
    order = d = None
    if mode == "features" and row.get("features") is not None and len(row["features"]):
        order, d = rank(q, row["features"])
    elif mode == "codes" and n:
        # on k' codes whatever the row holds (zeros after its n): the time does not tell the row
        padded = np.zeros((max(n, int(getattr(req, "shortlist", n) or n)), b), np.uint8)
        padded[:n] = row["codes"]
        order, d = rank(q, codes=padded, product_codes=pc)
        order, d = order[order < n], d[:n]
    if d is not None:
        for key2 in ("item_ids", "external_ids", "labels", "features", "scores", "payloads",
                     "predicted", "class_scores"):
            if row.get(key2) is not None:
                row[key2] = [row[key2][i] for i in order]
        row["distances"] = d[order].tolist()
        reranked = mode
    row.pop("features", None)
    row.pop("codes", None)
    return reranked
