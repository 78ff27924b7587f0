"""SMLQ first-iteration sensitivity (PrivateMail Appendix B, corrected form).

The empirical part draws >= 300 neighbouring pairs (X_pad, X~) over many regimes
and checks, for each pair,

* ``||f(X_pad) - f(X~)||_F <= smlq_sensitivity`` for a random Q (the claim used for noise),
* every squared row norm of the difference matrix M is <= appendix_b_constant (Lemma 1 as corrected),
* ``||M||_F <= sqrt((n+1) M)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from pm_vector.errors import DomainError, InvalidInputError
from pm_vector.privacy import (appendix_b_constant, paper_smlq_sensitivity, smallest_valid_n, smallest_valid_sigma,
                               smlq_first_iteration, smlq_sensitivity)


# ----------------------------------------------------------------------------- helpers (also used by the report script)
def unit_rows(rng, m, d):
    z = rng.normal(size=(m, d))
    return z / np.linalg.norm(z, axis=1, keepdims=True)


def neighbours(X, Y, v, yv):
    """(X_pad, Y_pad, X~, Y~): zero row with zero label vs the extra record (v, yv)."""
    n, d = X.shape
    Xp = np.vstack([X, np.zeros((1, d))])
    Yp = np.vstack([Y, np.zeros((1, Y.shape[1]))])
    Xt = np.vstack([X, v[None, :]])
    Yt = np.vstack([Y, yv[None, :]])
    return Xp, Yp, Xt, Yt


def difference_matrix(X, Y, v, yv, sigma, alpha):
    """M = Diag(L_X)^+(a L_Y - L_X) - Diag(L_X~)^+(a L_Y~ - L_X~), via f(.; Q = I) (f(X) - f(X~) = M Q / 2)."""
    Xp, Yp, Xt, Yt = neighbours(X, Y, v, yv)
    eye = np.eye(X.shape[0] + 1)
    return 2.0 * (smlq_first_iteration(Xp, Yp, eye, sigma, alpha) - smlq_first_iteration(Xt, Yt, eye, sigma, alpha))


@dataclass
class Pair:
    X: np.ndarray
    Y: np.ndarray          # label vectors, (n, 1) integer labels or (n, C) one-hot
    v: np.ndarray
    yv: np.ndarray
    sigma: float
    alpha: float
    label_diameter_sq: float


def _int_labels(rng, n, c, mode):
    if mode == "equal":
        return np.zeros((n, 1))
    if mode == "different":
        return rng.permutation(c + 1)[:n].astype(float)[:, None]
    return rng.integers(0, c + 1, size=(n, 1)).astype(float)


def _sigmas(n, rng):
    s0 = smallest_valid_sigma(n)
    return [s0 * 1.001, s0 * 1.05, s0 * 1.5, 3.0, 50.0][rng.integers(0, 5)]


ALPHAS = (0.0, 0.5, 2.0)


def regime_pairs(name, rng, count):
    """Yield ``count`` neighbouring pairs of the named regime."""
    for t in range(count):
        alpha = ALPHAS[t % 3]
        if name == "random-lowdim":
            n = int(rng.integers(2, 11)); c = 4
            X = unit_rows(rng, n, 3); Y = _int_labels(rng, n, c, "random")
            v = unit_rows(rng, 1, 3)[0]; yv = np.array([float(rng.integers(0, c + 1))])
        elif name == "random-highdim":
            n = int(rng.choice([5, 100])); c = 9
            X = unit_rows(rng, n, 256); Y = _int_labels(rng, n, c, "random")
            v = unit_rows(rng, 1, 256)[0]; yv = np.array([float(rng.integers(0, c + 1))])
        elif name == "identical-rows":
            n = int(rng.choice([2, 7, 100])); c = 3
            x = unit_rows(rng, 1, 4)[0]; X = np.tile(x, (n, 1)); Y = _int_labels(rng, n, c, "equal")
            v = [x, -x, unit_rows(rng, 1, 4)[0]][t % 3]; yv = np.array([float(c)])
        elif name == "antipodal-clusters":
            n = int(rng.choice([4, 10, 100])); c = 1
            x = unit_rows(rng, 1, 8)[0]
            signs = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)[:, None]
            X = signs * x + 0.01 * rng.normal(size=(n, 8)); X /= np.linalg.norm(X, axis=1, keepdims=True)
            Y = (signs > 0).astype(float); v = unit_rows(rng, 1, 8)[0]; yv = np.array([float(rng.integers(0, 2))])
        elif name == "new-equals-existing":
            n = int(rng.integers(2, 11)); c = 5
            X = unit_rows(rng, n, 3); Y = _int_labels(rng, n, c, "random")
            j = int(rng.integers(0, n)); v = X[j].copy(); yv = Y[j].copy()
        elif name == "new-opposite-existing":
            n = int(rng.integers(2, 11)); c = 5
            X = unit_rows(rng, n, 3); Y = _int_labels(rng, n, c, "random")
            j = int(rng.integers(0, n)); v = -X[j]; yv = np.array([float(c)]) - Y[j]
        elif name == "labels-all-equal":
            n = int(rng.choice([3, 10, 100])); c = 6
            X = unit_rows(rng, n, 5); Y = np.full((n, 1), float(c))
            v = unit_rows(rng, 1, 5)[0]; yv = np.array([0.0])
        elif name == "labels-all-different":
            n = int(rng.integers(2, 11)); c = n  # labels 0..c, all distinct among the n rows
            X = unit_rows(rng, n, 3); Y = _int_labels(rng, n, c, "different")
            v = unit_rows(rng, 1, 3)[0]; yv = np.array([float(rng.integers(0, c + 1))])
        elif name == "one-hot":
            n = int(rng.choice([3, 10, 100])); C = 4
            X = unit_rows(rng, n, 16); Y = np.eye(C)[rng.integers(0, C, size=n)]
            v = unit_rows(rng, 1, 16)[0]; yv = np.eye(C)[int(rng.integers(0, C))]
            sigma = _sigmas(n, rng)
            yield Pair(X, Y, v, yv, sigma, alpha, 2.0)
            continue
        elif name == "moderate-n":
            n = 100; c = 9
            X = unit_rows(rng, n, 32); Y = _int_labels(rng, n, c, "random")
            v = unit_rows(rng, 1, 32)[0]; yv = np.array([float(rng.integers(0, c + 1))])
        else:  # pragma: no cover
            raise ValueError(name)
        sigma = _sigmas(n, rng)
        yield Pair(X, Y, v, yv, sigma, alpha, float(c) ** 2)


REGIMES = {  # regime -> number of random pairs
    "random-lowdim": 45, "random-highdim": 30, "identical-rows": 30, "antipodal-clusters": 30,
    "new-equals-existing": 30, "new-opposite-existing": 30, "labels-all-equal": 30,
    "labels-all-different": 30, "one-hot": 30, "moderate-n": 30,
}


def measure(pair: Pair, rng, k: int = 2):
    """(||f diff||_F / smlq_sensitivity, max_i ||M_i||^2 / M, ||M||_F / sqrt((n+1) M)) for one pair."""
    n = pair.X.shape[0]
    Q = rng.normal(size=(n + 1, k))
    Xp, Yp, Xt, Yt = neighbours(pair.X, pair.Y, pair.v, pair.yv)
    diff = smlq_first_iteration(Xp, Yp, Q, pair.sigma, pair.alpha) - smlq_first_iteration(Xt, Yt, Q, pair.sigma,
                                                                                            pair.alpha)
    bound = smlq_sensitivity(n, pair.sigma, pair.alpha, pair.label_diameter_sq, np.linalg.norm(Q))
    m_const = appendix_b_constant(n, pair.sigma, pair.alpha, pair.label_diameter_sq)
    M = difference_matrix(pair.X, pair.Y, pair.v, pair.yv, pair.sigma, pair.alpha)
    return (np.linalg.norm(diff) / bound, float(np.max(np.sum(M * M, axis=1))) / m_const,
            np.linalg.norm(M) / math.sqrt((n + 1) * m_const))


# ----------------------------------------------------------------------------- (a) empirical sensitivity
def test_at_least_300_pairs_are_checked():
    assert sum(REGIMES.values()) >= 300


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_empirical_difference_never_exceeds_corrected_bound(regime):
    rng = np.random.default_rng(sorted(REGIMES).index(regime) + 1)
    worst = np.zeros(3)
    for pair in regime_pairs(regime, rng, REGIMES[regime]):
        # the data really are in the analysed domain
        assert np.allclose(np.linalg.norm(pair.X, axis=1), 1.0) and math.isclose(np.linalg.norm(pair.v), 1.0)
        r = measure(pair, rng)
        worst = np.maximum(worst, r)
        assert r[0] <= 1.0, f"sensitivity bound violated in {regime}: ratio {r[0]} at {pair}"
        assert r[1] <= 1.0, f"Lemma 1 (squared row norm) violated in {regime}: ratio {r[1]} at {pair}"
        assert r[2] <= 1.0, f"||M||_F bound violated in {regime}: ratio {r[2]} at {pair}"
    assert worst[0] > 0  # the pairs are not trivially identical


def test_difference_identity_and_zero_change_for_identical_neighbour():
    # f(X_pad) - f(X~) = 1/2 M Q, checked against the Q = I construction used above.
    rng = np.random.default_rng(7)
    X = unit_rows(rng, 6, 3); Y = rng.integers(0, 3, size=(6, 1)).astype(float)
    v = unit_rows(rng, 1, 3)[0]; yv = np.array([2.0]); Q = rng.normal(size=(7, 3))
    Xp, Yp, Xt, Yt = neighbours(X, Y, v, yv)
    M = difference_matrix(X, Y, v, yv, 2.0, 0.5)
    diff = smlq_first_iteration(Xp, Yp, Q, 2.0, 0.5) - smlq_first_iteration(Xt, Yt, Q, 2.0, 0.5)
    np.testing.assert_allclose(diff, 0.5 * M @ Q, atol=1e-12)
    assert np.linalg.norm(M) > 1e-3


def test_reference_query_matches_elementwise_definition():
    rng = np.random.default_rng(3)
    X = np.vstack([unit_rows(rng, 4, 3), np.zeros((1, 3))])
    Y = np.array([[0.0], [2.0], [1.0], [2.0], [0.0]])
    Q = rng.normal(size=(5, 2)); sigma, alpha = 1.3, 0.7
    m = X.shape[0]
    W = np.array([[0.0 if i == j else math.exp(-np.sum((X[i] - X[j]) ** 2) / (2 * sigma ** 2)) for j in range(m)]
                  for i in range(m)])
    V = np.array([[0.0 if i == j else math.exp(-np.sum((Y[i] - Y[j]) ** 2) / (2 * sigma ** 2)) for j in range(m)]
                  for i in range(m)])
    LX = np.diag(W.sum(1)) - W; LY = np.diag(V.sum(1)) - V
    expected = Q + 0.5 * np.linalg.inv(np.diag(np.diag(LX))) @ (alpha * LY - LX) @ Q
    np.testing.assert_allclose(smlq_first_iteration(X, Y, Q, sigma, alpha), expected, atol=1e-13)
    np.testing.assert_allclose(smlq_first_iteration(X, Y[:, 0], Q, sigma, alpha), expected, atol=1e-13)


# ----------------------------------------------------------------------------- (c) the constant, by hand
def test_constant_at_hand_evaluated_point():
    # sigma^2 = 1/ln 2 makes e^{-1/sigma^2} = 1/2: every exponential in eq (8) is a power of 1/2.
    # n = 10, alpha = 1, c^2 = 2 (one-hot): e^{-2/s^2} = 1/4, e^{-1/(2 s^2)} = 2^{-1/2}, e^{-c^2/(2 s^2)} = 1/2,
    # e^{-(c^2+4)/(2 s^2)} = 1/8, e^{-c^2/s^2} = 1/4, e^{-4/s^2} = 1/16.
    r = 2 ** -0.5
    a = 10 / 4 + r - 1          # n e^{-2/s^2} + e^{-1/(2s^2)} - 1
    b = 11 / 4 - 1              # (n+1) e^{-2/s^2} - 1
    u = 10 + r - 1              # n + e^{-1/(2s^2)} - 1
    m_ii = (10 / a) ** 2 + (10 / b) ** 2 - 2 * (11 / 2 - 1) ** 2 / (10 * u)
    m_ij = 2 / a ** 2 - 2 / 8 / u ** 2 + 2 / b ** 2 - 2 / 8 / 100 - 2 * (1 / 4 + 1 / 16) / (10 * u) + 4 / (a * b)
    expected = 10 * m_ij + m_ii
    # by calculator: a = 2.2071068, b = 1.75, u = 9.7071068, M_ii = 52.76416, M_ij = 2.087651
    assert expected == pytest.approx(73.64067, rel=1e-6)
    assert appendix_b_constant(10, 1 / math.sqrt(math.log(2)), 1.0, 2.0) == pytest.approx(expected, rel=1e-12)


def _eq8_in_powers_of_E(n, sigma, alpha, c2):
    """Independent re-transcription of eq (8) written in E = e^{-1/sigma^2}."""
    E = math.exp(-1 / sigma ** 2)
    A = n * E ** 2 + E ** 0.5 - 1
    B = (n + 1) * E ** 2 - 1
    U = n + E ** 0.5 - 1
    mii = alpha ** 2 * ((n / A) ** 2 + (n / B) ** 2 - 2 * ((n + 1) * E ** (c2 / 2) - 1) ** 2 / (n * U))
    mij = ((alpha ** 2 + 1) / A ** 2 - 2 * alpha * E ** (c2 / 2 + 2) / U ** 2 + (alpha ** 2 + 1) / B ** 2
           - 2 * alpha * E ** (c2 / 2 + 2) / n ** 2 - 2 * (alpha ** 2 * E ** c2 + E ** 4) / (n * U)
           + 4 * alpha / (A * B))
    return n * mij + mii


@pytest.mark.parametrize("n,sigma,alpha,c2", [(500, 5.0, 0.5, 81.0), (3, 2.0, 2.0, 4.0), (100, 0.9, 0.0, 2.0)])
def test_constant_against_independent_transcription(n, sigma, alpha, c2):
    assert appendix_b_constant(n, sigma, alpha, c2) == pytest.approx(_eq8_in_powers_of_E(n, sigma, alpha, c2),
                                                                     rel=1e-12)


def test_constant_matches_team_notes_anchor():
    # NOTES item 4: M is about 0.57 at n = 500, sigma = 5, alpha = 0.5 (10 integer classes -> c = 9).
    assert appendix_b_constant(500, 5.0, 0.5, 81.0) == pytest.approx(0.574, abs=0.001)


# ----------------------------------------------------------------------------- (d) domain and corrected vs paper form
def test_domain_error_below_the_domain_names_the_fix():
    with pytest.raises(DomainError) as exc:
        appendix_b_constant(100, 0.5, 0.5, 81.0)
    msg = str(exc.value)
    assert "0.658" in msg and "2980" in msg            # smallest sigma for n=100, smallest n for sigma=0.5
    with pytest.raises(DomainError):
        smlq_sensitivity(100, 0.5, 0.5, 81.0, 1.0)
    with pytest.raises(DomainError):
        paper_smlq_sensitivity(100, 0.5, 0.5, 81.0, 1.0)


def test_domain_boundary_is_exact():
    assert smallest_valid_sigma(100) == pytest.approx(math.sqrt(2 / math.log(101)))
    assert smallest_valid_n(0.5) == 2980                 # n > e^8 - 1 = 2979.96
    appendix_b_constant(2980, 0.5, 0.5, 1.0)
    with pytest.raises(DomainError):
        appendix_b_constant(2979, 0.5, 0.5, 1.0)
    s0 = smallest_valid_sigma(7)
    with pytest.raises(DomainError):
        appendix_b_constant(7, s0 * (1 - 1e-9), 0.5, 1.0)
    assert appendix_b_constant(7, s0 * (1 + 1e-6), 0.5, 1.0) > 1e6  # blows up at the boundary


@pytest.mark.parametrize("n,sigma,alpha,c2", [(500, 5.0, 0.5, 81.0), (100, 10.0, 0.0, 81.0), (10, 3.0, 0.5, 4.0),
                                              (10, 1.2, 2.0, 81.0), (2, 1.4, 0.5, 1.0), (100, 3.0, 2.0, 81.0)])
def test_corrected_exceeds_paper_form_exactly_when_m_below_one(n, sigma, alpha, c2):
    m = appendix_b_constant(n, sigma, alpha, c2)
    corrected = smlq_sensitivity(n, sigma, alpha, c2, 3.0)
    paper = paper_smlq_sensitivity(n, sigma, alpha, c2, 3.0)
    assert corrected / paper == pytest.approx(1 / math.sqrt(m), rel=1e-12)
    assert (corrected > paper) == (m < 1)


def test_both_cases_of_m_occur_in_the_grid():
    assert appendix_b_constant(500, 5.0, 0.5, 81.0) < 1 < appendix_b_constant(10, 1.2, 2.0, 81.0)


# ----------------------------------------------------------------------------- (e) sanity
def test_sensitivity_is_linear_in_q_frobenius():
    base = smlq_sensitivity(50, 2.0, 0.5, 4.0, 1.0)
    for q in (0.5, 2.0, 37.0):
        assert smlq_sensitivity(50, 2.0, 0.5, 4.0, q) == pytest.approx(q * base, rel=1e-14)
        assert paper_smlq_sensitivity(50, 2.0, 0.5, 4.0, q) == pytest.approx(
            q * paper_smlq_sensitivity(50, 2.0, 0.5, 4.0, 1.0), rel=1e-14)
    assert base == pytest.approx(0.5 * math.sqrt(51 * appendix_b_constant(50, 2.0, 0.5, 4.0)), rel=1e-14)


@pytest.mark.parametrize("kwargs,err", [
    (dict(n=0), InvalidInputError), (dict(n=2.5), InvalidInputError), (dict(n=True), InvalidInputError),
    (dict(sigma=0.0), InvalidInputError), (dict(sigma=-1.0), InvalidInputError),
    (dict(sigma=math.nan), InvalidInputError),
    (dict(sigma=math.inf), InvalidInputError), (dict(alpha=-0.1), InvalidInputError),
    (dict(alpha=math.nan), InvalidInputError), (dict(label_diameter_sq=-1.0), InvalidInputError),
    (dict(q_frobenius=0.0), InvalidInputError), (dict(q_frobenius=math.nan), InvalidInputError),
])
def test_bad_parameters_are_refused(kwargs, err):
    args = dict(n=10, sigma=2.0, alpha=0.5, label_diameter_sq=4.0, q_frobenius=1.0)
    args.update(kwargs)
    with pytest.raises(err):
        smlq_sensitivity(**args)


def test_reference_query_rejects_bad_input():
    X = np.eye(3); Y = np.zeros((3, 1)); Q = np.ones((3, 2))
    with pytest.raises(InvalidInputError):
        smlq_first_iteration(X, Y, np.ones((4, 2)), 1.0, 0.5)
    with pytest.raises(InvalidInputError):
        smlq_first_iteration(np.where(X == 1, np.nan, X), Y, Q, 1.0, 0.5)
    with pytest.raises(InvalidInputError):
        smlq_first_iteration(X, Y, Q, 0.0, 0.5)
