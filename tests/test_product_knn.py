"""The matrix-product flat search (:func:`pm_vector.neighbors.product_knn`): the ``k`` nearest items
by squared L2 or largest inner product, as a float64 brute force ranks them up to the float32 error,
across block boundaries and with fewer items than ``k``."""

from __future__ import annotations

import numpy as np
import pytest

from pm_vector.neighbors import PRODUCT_BLOCK, product_knn


def _exact(Q, X, inner_product):
    Q, X = Q.astype(np.float64), X.astype(np.float64)
    if inner_product:
        return Q @ X.T
    return (Q * Q).sum(1)[:, None] + (X * X).sum(1)[None, :] - 2 * Q @ X.T


@pytest.mark.parametrize("inner_product", [False, True])
@pytest.mark.parametrize("n", [5, PRODUCT_BLOCK, 2 * PRODUCT_BLOCK + 37])
def test_the_k_best_as_a_float64_brute_force_ranks_them(inner_product, n):
    rng = np.random.default_rng(n)
    # rows of very different norms: the inner product's lift (sqrt(M^2 - |x|^2)) is far from 0 for most
    X = (rng.normal(size=(n, 12)) * rng.uniform(0.1, 5.0, size=(n, 1))).astype(np.float32)
    Q = rng.normal(size=(23, 12)).astype(np.float32)
    k = 17
    D, I = product_knn(Q, X, k, inner_product=inner_product)
    assert D.shape == I.shape == (23, k) and I.dtype == np.int64 and D.dtype == np.float32
    exact = _exact(Q, X, inner_product)
    scale = (np.linalg.norm(Q, axis=1)[:, None] + np.linalg.norm(X, axis=1).max()) ** 2
    tol = 1e-5 * scale
    for i in range(Q.shape[0]):
        got = I[i][I[i] >= 0]
        assert got.size == min(k, n) and np.unique(got).size == got.size
        # the distances returned are the rows' own, within the float32 error
        assert np.all(np.abs(D[i, :got.size] - exact[i, got]) <= tol[i])
        # sorted best first
        step = np.diff(D[i, :got.size])
        assert np.all(step <= 0) if inner_product else np.all(step >= 0)
        # no row left out is better than the last kept one by more than the error
        rest = np.setdiff1d(np.arange(n), got)
        if rest.size:
            last = exact[i, got].min() if inner_product else exact[i, got].max()
            if inner_product:
                assert exact[i, rest].max() <= last + 2 * tol[i]
            else:
                assert exact[i, rest].min() >= last - 2 * tol[i]
    if n < k:
        assert np.all(I[:, n:] == -1)


@pytest.mark.parametrize("n", [3, 3000])
def test_the_same_items_as_faiss_flat_search_on_separated_data(n):
    """Distances far apart (no float32 tie): the same ordered items as faiss's own search."""
    import faiss

    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, 16)).astype(np.float32)
    Q = rng.normal(size=(40, 16)).astype(np.float32)
    for ip in (False, True):
        _, want = faiss.knn(Q, X, 10, metric=faiss.METRIC_INNER_PRODUCT if ip else faiss.METRIC_L2)
        D, got = product_knn(Q, X, 10, inner_product=ip)
        assert np.array_equal(got, want)
        # past the items (n < k): -1, and faiss's largest float32 (negated for the inner product)
        assert np.all(D[:, n:] == (-1 if ip else 1) * np.finfo(np.float32).max)
