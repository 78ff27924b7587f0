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

from .._validation import as_matrix, unit_query
from ..errors import InvalidInputError
from ..privacy.rng import secure_generator


def _ranked(dist_of, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, distances)`` of ``n`` candidates whose distances ``dist_of(p)`` gives for the
    candidates at positions ``p``, computed in an order that does not depend on the server's.

    The candidates are taken in a fresh CSPRNG permutation ``p`` (the order of ``n`` uniform 64-bit
    words of :func:`~pm_vector.privacy.secure_generator`: 3 ms for 65,536) before their distances are computed and sorted,
    so the distances reach the sort as a uniformly random arrangement of their multiset whatever
    order the server chose (numpy's sorts are faster on ordered input: a server that ordered its
    candidates by distance from a guessed query could time the re-rank, issue #35, finding 12b).
    Equal distances are then ordered by candidate position, as a stable sort of the server's
    order would: one more sort of ``run * n + position`` keys, whose arrangement (nondecreasing
    runs, random inside a run of equal distances) does not depend on the server's order either.
    Nothing here branches on the data: the same operations run for every order."""
    p = np.argsort(secure_generator().words(n))  # a uniform permutation (ties of 64-bit words aside)
    dp = np.asarray(dist_of(p), dtype=np.float64)
    op = np.argsort(dp, kind="stable")
    sd = dp[op]
    run = np.concatenate([[0], np.cumsum(sd[1:] != sd[:-1])]).astype(np.int64)
    order = np.sort(run * n + p[op]) % n
    d = np.empty(n, dtype=np.float64)
    d[p] = dp
    return order.astype(np.int64), d


def rank(query, candidate_features=None, *, codes=None, product_codes=None) -> tuple[np.ndarray, np.ndarray]:
    """``(order, distances)``: the candidates' positions by distance to ``query``, nearest first
    (equal distances by position), and each candidate's distance (in candidate order).

    By raw features (``candidate_features``, one row per candidate): the Euclidean distance.
    By product codes (``codes``, the ``(n, b)`` uint8 prefixes of a compact answer, and
    ``product_codes``, the published :class:`~pm_vector.manifold.codes.ProductCodes`): the
    asymmetric distance of the exact query to each coded candidate
    (:meth:`~pm_vector.manifold.codes.ProductCodes.distances`). The query is used as given.

    The work does not depend on the order the candidates came in (:func:`_ranked`: a CSPRNG
    permutation before the distances are computed and sorted); the result is the same as a
    stable sort of the distances in the candidates' order."""
    q = np.asarray(query, dtype=np.float64)
    if codes is not None:
        if product_codes is None:
            raise InvalidInputError("re-ranking by codes needs the published product codes.")
        C = np.asarray(codes, dtype=np.uint8)
        if C.ndim != 2:
            raise InvalidInputError("codes must be a 2-d array, one row per candidate.")
        if C.shape[0] == 0:
            return np.zeros(0, np.int64), np.zeros(0)
        qr = q.ravel()
        return _ranked(lambda p: product_codes.distances(qr, C[p]), C.shape[0])
    q = q.reshape(1, -1)
    R = as_matrix(candidate_features, "candidate_features")
    if R.shape[1] != q.shape[1]:
        raise InvalidInputError(f"candidates have {R.shape[1]} features; the query has {q.shape[1]}.")
    order, d2 = _ranked(lambda p: ((R[p] - q) ** 2).sum(1), R.shape[0])
    return order, np.sqrt(d2)


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
    q = unit_query(q_raw)  # checked before the first request (Client.query)
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
