"""One re-rank (pm_vector.client.rerank.rank) behind query.rerank, PrivateKNN.rerank /
rerank_codes and Client.query: the same order, by raw features or by published codes."""

import numpy as np
import pytest

from pm_vector.client.query import PrivateKNN, rerank
from pm_vector.client.rerank import rank
from pm_vector.errors import InvalidInputError
from pm_vector.privacy import secure_generator


def _data(n=40, d=12):
    g = secure_generator()
    F = g.normal(size=(n, d))
    F[7] = F[3]  # a tie: stable order keeps the earlier candidate first
    return g.normal(size=d), F, np.arange(1000, 1000 + n)


def test_features_order_is_exact_and_stable():
    q, F, ids = _data()
    order, d = rank(q, F)
    np.testing.assert_allclose(d, np.linalg.norm(F - q, axis=1))
    assert np.all(np.diff(d[order]) >= 0)
    assert list(order).index(3) < list(order).index(7)
    np.testing.assert_array_equal(rerank(q, F, 5), order[:5])
    np.testing.assert_array_equal(PrivateKNN.rerank(q, ids, F, k=5), ids[order[:5]])
    assert PrivateKNN.rerank(q, ids[:0], F[:0], k=5).shape == (0,)
    with pytest.raises(InvalidInputError, match="one row per candidate"):
        PrivateKNN.rerank(q, ids[:-1], F, k=5)
    with pytest.raises(InvalidInputError, match="features"):
        rank(q[:-1], F)


def test_codes_order_is_the_asymmetric_distance():
    faiss = pytest.importorskip("faiss")  # noqa: F841
    from pm_vector.manifold.codes import ProductCodes

    g = secure_generator()
    A = g.normal(size=(600, 16))
    pc = ProductCodes(code_bytes=8).fit(A)
    X = g.normal(size=(50, 16))
    codes = pc.encode(X)
    q = g.normal(size=16)
    order, d = rank(q, codes=codes, product_codes=pc)
    np.testing.assert_allclose(d, pc.distances(q, codes))
    np.testing.assert_array_equal(order, np.argsort(pc.distances(q, codes), kind="stable"))
    ids = np.arange(50) * 3
    np.testing.assert_array_equal(PrivateKNN.rerank_codes(q, ids, codes, pc, k=8), ids[order[:8]])
    with pytest.raises(InvalidInputError, match="one row per candidate"):
        PrivateKNN.rerank_codes(q, ids[:-1], codes, pc, k=8)
