"""Exact k-NN on raw features: the ground truth of every benchmark and the server's neighbour
graph (:func:`neighbor_graph`, what the shortlist of :mod:`pm_vector.shortlist` walks)."""

from __future__ import annotations

import numpy as np

from .errors import InvalidInputError

#: float64 entries of one distance block (256 MB)
_BLOCK = 1 << 25


def knn_search(queries: np.ndarray, items: np.ndarray, k: int, *, batch_size: int | None = None,
               item_sqnorms: np.ndarray | None = None) -> np.ndarray:
    """Exact Euclidean k-NN: ``(q, k)`` int64 indices of the ``k`` nearest ``items`` of each query,
    nearest first (ties broken by the lower index). Computed in float64, in query batches of
    ``batch_size`` (memory ``batch_size x n_items``; by default at most ~256 MB per batch)."""
    qs = np.asarray(queries, dtype=np.float64)
    xs = np.asarray(items, dtype=np.float64)
    n = xs.shape[0]
    if not 1 <= k <= n:
        raise InvalidInputError(f"k must be between 1 and the number of server items ({n}); got {k}.")
    sq = np.einsum("ij,ij->i", xs, xs) if item_sqnorms is None else item_sqnorms
    if batch_size is None:
        batch_size = max(1, min(1024, _BLOCK // max(n, 1)))
    out = np.empty((qs.shape[0], k), dtype=np.int64)
    for start in range(0, qs.shape[0], batch_size):
        qb = qs[start:start + batch_size]
        # ||q - x||^2 minus the per-query constant ||q||^2
        d = sq[None, :] - 2.0 * (qb @ xs.T)
        if k < n:
            cand = np.argpartition(d, k - 1, axis=1)[:, :k]
            cand.sort(axis=1)  # ascending index, so the stable sort below breaks ties by index
        else:
            cand = np.broadcast_to(np.arange(n), d.shape).copy()
        dc = np.take_along_axis(d, cand, axis=1)
        order = np.argsort(dc, axis=1, kind="stable")
        out[start:start + qb.shape[0]] = np.take_along_axis(cand, order, axis=1)
    return out


def neighbor_graph(X: np.ndarray, g: int) -> np.ndarray:
    """``(n, g)`` positions of the ``g`` nearest *other* rows of every row of ``X`` (nearest
    first, ties by the lower index); ``g`` is capped at ``n - 1``."""
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    g = min(int(g), n - 1)
    if g <= 0:
        return np.zeros((n, 0), np.int64)
    nb = knn_search(X, X, g + 1)
    own = nb == np.arange(n)[:, None]
    # drop the row itself (a duplicate of lower index may precede it); if absent, drop the farthest
    drop = np.where(own.any(1), own.argmax(1), g)
    keep = np.ones_like(nb, dtype=bool)
    keep[np.arange(n), drop] = False
    return nb[keep].reshape(n, g)
