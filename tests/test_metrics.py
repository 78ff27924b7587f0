"""Retrieval metrics against hand-computed examples."""

from __future__ import annotations

import numpy as np
import pytest

from pm_vector.bench.metrics import (
    average_precision_at_k,
    chance_precision_at_k,
    chance_recall_at_k,
    hits,
    map_at_k,
    precision_at_k,
    recall_at_k,
)
from pm_vector.errors import InvalidInputError

# three queries, k = 4
R = np.array([
    [1, 0, 1, 2],   # query label 1: hits at ranks 1, 3
    [0, 0, 0, 0],   # query label 2: no hit
    [5, 5, 2, 5],   # query label 5: hits at ranks 1, 2, 4
])
Q = np.array([1, 2, 5])


def test_recall_at_k():
    assert recall_at_k(R, Q) == pytest.approx(2 / 3)
    # k = 1: query 0 and 2 hit at rank 1
    assert recall_at_k(R, Q, k=1) == pytest.approx(2 / 3)
    assert recall_at_k(np.array([[0, 1], [1, 1]]), np.array([1, 0]), k=1) == 0.0
    assert recall_at_k(np.array([[0, 1], [1, 1]]), np.array([1, 0])) == pytest.approx(0.5)


def test_precision_at_k():
    assert precision_at_k(R, Q) == pytest.approx((2 / 4 + 0 + 3 / 4) / 3)
    assert precision_at_k(R, Q, k=2) == pytest.approx((1 / 2 + 0 + 2 / 2) / 3)


def test_average_precision_at_k():
    # q0: (1/1 + 2/3) / 2 ; q1: 0 ; q2: (1 + 1 + 3/4) / 3
    ap = average_precision_at_k(R, Q)
    np.testing.assert_allclose(ap, [(1 + 2 / 3) / 2, 0.0, (1 + 1 + 3 / 4) / 3])
    assert map_at_k(R, Q) == pytest.approx(np.mean(ap))
    # with known relevant counts: normaliser min(k, n_relevant)
    ap2 = average_precision_at_k(R, Q, n_relevant=[10, 3, 3])
    np.testing.assert_allclose(ap2, [(1 + 2 / 3) / 4, 0.0, (1 + 1 + 3 / 4) / 3])
    with pytest.raises(InvalidInputError, match="n_relevant"):
        average_precision_at_k(R, Q, n_relevant=[1, 3, 3])  # q0 retrieved 2 relevant


def test_hits_matrix():
    np.testing.assert_array_equal(hits(R, Q, k=2), [[True, False], [False, False], [True, True]])


def test_chance_levels():
    assert chance_recall_at_k(np.ones(10), 8) == pytest.approx(1 - 0.9 ** 8)
    assert chance_recall_at_k([30, 70], 1) == pytest.approx(0.3 * 0.3 + 0.7 * 0.7)
    assert chance_recall_at_k([30, 70], 2, query_frequencies=[1, 0]) == pytest.approx(1 - 0.7 ** 2)
    assert chance_precision_at_k(np.ones(4)) == pytest.approx(0.25)
    # Monte Carlo agreement for an unbalanced database
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.2])
    q = rng.choice(3, size=20000, p=p)
    r = rng.choice(3, size=(20000, 3), p=p)
    assert recall_at_k(r, q) == pytest.approx(chance_recall_at_k(p, 3), abs=0.01)
    assert precision_at_k(r, q) == pytest.approx(chance_precision_at_k(p), abs=0.01)


@pytest.mark.parametrize("args, match", [
    ((np.array([1, 2]), np.array([1, 2])), "2-d"),
    ((R, np.array([1, 2])), "3 rows but there are 2"),
    ((R, Q[:, None]), "1-d"),
    ((R.astype(float) + 0.5, Q), "integer"),
    ((np.zeros((3, 0), dtype=int), Q), "0 columns"),
])
def test_shape_validation(args, match):
    with pytest.raises(InvalidInputError, match=match):
        recall_at_k(*args)


def test_bad_k():
    with pytest.raises(InvalidInputError, match="k=5"):
        precision_at_k(R, Q, k=5)
    with pytest.raises(InvalidInputError, match="positive integer"):
        precision_at_k(R, Q, k=0)
    with pytest.raises(InvalidInputError, match="positive integer"):
        chance_recall_at_k([1, 1], 0)
    with pytest.raises(InvalidInputError, match="non-negative"):
        chance_recall_at_k([1, -1], 2)
