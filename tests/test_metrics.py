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


# ---------------------------------------------------------------------------- neighbour metrics

from pm_vector.bench.metrics import (  # noqa: E402
    bytes_per_request,
    candidate_bytes,
    collection_bytes,
    distinct_lists_per_class,
    float_payload_bytes,
    nn_recall_at_k,
)

TRUE = np.array([[0, 1, 2, 3],
                 [4, 5, 6, 7]])


def test_nn_recall_hand_made():
    assert nn_recall_at_k(TRUE, TRUE) == 1.0
    # order does not matter
    assert nn_recall_at_k(TRUE[:, ::-1], TRUE) == 1.0
    # q0: 2 of 4 (0, 2); q1: 0 of 4
    ret = np.array([[9, 0, 8, 2],
                    [0, 1, 2, 3]])
    assert nn_recall_at_k(ret, TRUE) == pytest.approx((2 / 4 + 0) / 2)
    # a repeated retrieved index counts once
    assert nn_recall_at_k(np.array([[0, 0, 0, 0], [4, 4, 5, 5]]), TRUE) == pytest.approx((1 / 4 + 2 / 4) / 2)
    # more retrieved columns than true neighbours: recall of the true set
    wide = np.array([[10, 11, 0, 1, 2, 3], [4, 12, 13, 14, 15, 16]])
    assert nn_recall_at_k(wide, TRUE) == pytest.approx((1 + 1 / 4) / 2)


def test_nn_recall_is_not_class_precision():
    # the right class but the wrong items: class precision 1, nn_recall 0
    labels = np.zeros(20, dtype=int)
    ret = np.array([[10, 11, 12, 13]])
    assert precision_at_k(labels[ret], np.array([0])) == 1.0
    assert nn_recall_at_k(ret, TRUE[:1]) == 0.0


def test_nn_recall_validation():
    with pytest.raises(InvalidInputError, match="1 rows but true_idx has 2"):
        nn_recall_at_k(TRUE[:1], TRUE)
    with pytest.raises(InvalidInputError, match="2-d"):
        nn_recall_at_k(TRUE[0], TRUE)
    with pytest.raises(InvalidInputError, match="integer"):
        nn_recall_at_k(TRUE + 0.5, TRUE)
    with pytest.raises(InvalidInputError, match="0 columns"):
        nn_recall_at_k(np.zeros((2, 0), dtype=int), TRUE)


def test_distinct_lists_per_class():
    ret = np.array([[1, 2, 3],
                    [3, 2, 1],    # same set as row 0, other order: not distinct
                    [1, 2, 4],
                    [7, 8, 9],
                    [7, 8, 9]])
    y = np.array([0, 0, 0, 1, 1])
    # class 0: 2 distinct of 3; class 1: 1 of 2
    assert distinct_lists_per_class(ret, y) == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert distinct_lists_per_class(np.arange(12).reshape(4, 3), [0, 0, 1, 1]) == 1.0
    with pytest.raises(InvalidInputError, match="one label per row"):
        distinct_lists_per_class(ret, y[:3])


def test_byte_helpers():
    assert float_payload_bytes(10) == 80
    assert float_payload_bytes(10, n_ids=3) == 104
    # k' = 32 candidates for 10 rows of 64-d items: 32 * 10 * (8 + 256)
    assert candidate_bytes(32, 10, 64) == 32 * 10 * 264
    assert collection_bytes(1000, 64) == 264_000
    assert bytes_per_request(100, 32, 10, 64) == 100 + 84_480
    with pytest.raises(InvalidInputError, match="non-negative"):
        candidate_bytes(-1, 1, 4)
    with pytest.raises(InvalidInputError, match="request_bytes"):
        bytes_per_request(float("nan"), 1, 1, 4)
