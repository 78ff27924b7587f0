"""The cell release (K-ary randomized response of the real row, uniform dummy rows): its exact
privacy loss by enumeration against the claim, mechanisms that must fail it, the exact sampler's
frequencies, and attacks that see only what the server sees."""

import math

import numpy as np
import pytest
from scipy import stats

from pm_vector.errors import InvalidInputError, PrivacyParameterError
from pm_vector.privacy import secure_generator
from pm_vector.privacy.cells import (CellRandomizedResponse, cell_level_for_epsilon, release_for_epsilon,
                                     rr_probabilities)


# --------------------------------------------------------------------------- the sampler
@pytest.mark.parametrize("eps,K", [(0.5, 2), (1.0, 4), (2.0, 8), (0.1, 3), (3.7, 5)])
def test_sampler_frequencies_are_p_and_q(eps, K):
    m = CellRandomizedResponse(eps, K)
    n = 40_000
    a = K // 2
    draws = m.sample(a, n, secure_generator(int(eps * 1000) + K))
    counts = np.bincount(draws, minlength=K)
    p, q = rr_probabilities(eps, K)
    expected = np.full(K, q * n)
    expected[a] = p * n
    assert math.isclose(p + (K - 1) * q, 1.0)
    assert stats.chisquare(counts, expected).pvalue > 1e-3


def test_a_wrong_p_is_caught_by_the_chi_square():
    """The test above can fail: frequencies of RR computed with K - 1 instead of K are rejected."""
    K, eps, n = 4, 1.0, 40_000
    draws = CellRandomizedResponse(eps, K - 1).sample(1, n, secure_generator(5))
    draws = np.where(draws == 1, 1, np.where(draws == 0, 0, 3))  # cells 0, 1 and 3 only
    p, q = rr_probabilities(eps, K)
    expected = np.full(K, q * n)
    expected[1] = p * n
    assert stats.chisquare(np.bincount(draws, minlength=K), expected).pvalue < 1e-6


def test_release_has_uniform_dummy_rows_and_rr_real_row():
    K, C, eps, n = 4, 3, 1.0, 6000
    m = CellRandomizedResponse(eps, K)
    g = secure_generator(11)
    out = np.stack([m.release(1, 2, C, g) for _ in range(n)])
    assert out.dtype == np.int64 and out.shape == (n, C)
    p, q = rr_probabilities(eps, K)
    real = np.bincount(out[:, 1], minlength=K)
    assert stats.chisquare(real, [q * n, q * n, p * n, q * n]).pvalue > 1e-3
    for j in (0, 2):
        assert stats.chisquare(np.bincount(out[:, j], minlength=K)).pvalue > 1e-3


def test_infinite_epsilon_reports_the_true_cell():
    m = CellRandomizedResponse(float("inf"), 8)
    assert m.delta == 0.0 and (m.p_, m.q_) == (1.0, 0.0)
    assert np.all(m.sample(5, 100, secure_generator(0)) == 5)


def test_bad_parameters_are_refused():
    for eps in (0, -1, float("nan"), "1", True):
        with pytest.raises(PrivacyParameterError):
            CellRandomizedResponse(eps, 4)
    for K in (1, 0, 2.5, True):
        with pytest.raises(InvalidInputError):
            CellRandomizedResponse(1.0, K)
    m = CellRandomizedResponse(1.0, 4)
    for args in ((3, 0, 3), (0, 4, 3), (-1, 0, 3), (0, 0, 0)):
        with pytest.raises(InvalidInputError):
            m.release(*args)


def test_public_rules_are_functions_of_eps_and_levels():
    levels = (2, 4, 8, 16, 32, 64, 128)
    ks = [cell_level_for_epsilon(e, levels) for e in (0.5, 1, 2, 4, 8, 16, 64, float("inf"))]
    assert ks == sorted(ks) and all(k in levels for k in ks)
    assert cell_level_for_epsilon(64, (2, 4)) == 4
    assert release_for_epsilon(1.0) == "cells" and release_for_epsilon(float("inf")) == "gaussian"
