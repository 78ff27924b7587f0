"""Exact discrete Laplace / Gaussian samplers (CKS 2020): pmf, mean, variance and chi-square
against the exact distributions; the zCDP -> (eps, delta) conversion; and a Mironov-style test
of the client release: the old float Gaussian's low bits rule a neighbour out, the grid release's
outputs never do and stay within (eps, delta)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from pm_vector.errors import InvalidInputError, PrivacyParameterError
from pm_vector.privacy import secure_generator
from pm_vector.privacy.class_rows import ClassRowsGaussianMechanism
from pm_vector.privacy.discrete import (
    discrete_gaussian_pmf,
    sample_bernoulli,
    sample_bernoulli_exp,
    sample_discrete_gaussian,
    sample_discrete_gaussian_var,
    sample_discrete_laplace,
    sample_uniform_integers,
    zcdp_rho_for,
    zcdp_to_delta,
)


def _chi_square(x, pmf, lo, hi):
    """Chi-square p-value of integer draws ``x`` against ``pmf`` on ``lo..hi`` (tails pooled)."""
    support = np.arange(lo, hi + 1)
    p = pmf(support)
    obs = np.array([np.sum(x < lo)] + [np.sum(x == v) for v in support] + [np.sum(x > hi)], dtype=float)
    tail = (1 - p.sum()) / 2
    exp = np.concatenate([[tail], p, [tail]]) * len(x)
    keep = exp >= 5  # pool sparse cells into the tails
    o = np.concatenate([obs[keep], [obs[~keep].sum()]]) if (~keep).any() else obs
    e = np.concatenate([exp[keep], [exp[~keep].sum()]]) if (~keep).any() else exp
    return stats.chisquare(o, e * o.sum() / e.sum()).pvalue


def _dlap_pmf(scale):
    a = math.exp(-1 / scale)
    return lambda v: (1 - a) / (1 + a) * a ** np.abs(v)


@pytest.mark.parametrize("scale", [0.4, 1.0, 3.7])
def test_discrete_laplace_matches_its_pmf(scale):
    n = 60_000
    x = sample_discrete_laplace(scale, n, secure_generator(1))
    assert x.dtype == np.int64 and x.shape == (n,)
    a = math.exp(-1 / scale)
    var = 2 * a / (1 - a) ** 2  # exact variance of the discrete Laplace
    assert abs(x.mean()) < 5 * math.sqrt(var / n)
    assert abs(x.var() / var - 1) < 5 * math.sqrt(5 / n)  # kurtosis ~ 6
    half = int(6 * scale) + 2
    assert _chi_square(x, _dlap_pmf(scale), -half, half) > 1e-4


@pytest.mark.parametrize("sigma", [0.6, 1.0, 2.5, 40.0])
def test_discrete_gaussian_matches_its_pmf(sigma):
    n = 60_000
    x = sample_discrete_gaussian(sigma, n, secure_generator(2))
    assert x.dtype == np.int64
    z = np.arange(-int(40 * sigma) - 5, int(40 * sigma) + 6)
    p = discrete_gaussian_pmf(z, sigma)
    var = float((p * z * z).sum())  # exact variance (slightly below sigma^2, CKS Prop. 5)
    assert var <= sigma ** 2 * (1 + 1e-12)
    assert abs(x.mean()) < 5 * math.sqrt(var / n)
    assert abs(x.var() / var - 1) < 5 * math.sqrt(2 / n)
    half = int(4 * sigma) + 2
    assert _chi_square(x, lambda v: discrete_gaussian_pmf(v, sigma), -half, half) > 1e-4


# the production generator: rng=None reads the OS CSPRNG (not reproducible, so a stricter p-value)
@pytest.mark.parametrize("scale", [0.4, 3.7])
def test_discrete_laplace_from_the_os_csprng_matches_its_pmf(scale):
    x = sample_discrete_laplace(scale, 60_000)
    half = int(6 * scale) + 2
    assert _chi_square(x, _dlap_pmf(scale), -half, half) > 1e-6


@pytest.mark.parametrize("sigma2", [Fraction(9, 4), 40 ** 2])
def test_discrete_gaussian_from_the_os_csprng_matches_its_pmf(sigma2):
    sigma = math.sqrt(sigma2)
    x = sample_discrete_gaussian_var(sigma2, 60_000)
    half = int(4 * sigma) + 2
    assert _chi_square(x, lambda v: discrete_gaussian_pmf(v, sigma), -half, half) > 1e-6


def _binomial_ok(hits: int, n: int, p: float) -> bool:
    return stats.binomtest(int(hits), n, p).pvalue > 1e-6


@pytest.mark.parametrize("rng", [None, 11])
@pytest.mark.slow
def test_public_uniform_and_bernoulli_draws_are_exact(rng):
    """The building blocks other exact mechanisms use: uniform integers, Bernoulli(p) and
    Bernoulli(exp(-x)) for rational p, x (from the OS CSPRNG by default)."""
    g = None if rng is None else secure_generator(rng)
    n = 60_000
    u = sample_uniform_integers(7, n, g)
    assert u.dtype == np.int64 and u.min() >= 0 and u.max() <= 6
    assert stats.chisquare(np.bincount(u, minlength=7)).pvalue > 1e-6
    big = sample_uniform_integers(3 * 2 ** 70, 2000, g)
    assert big.dtype == object and all(0 <= int(v) < 3 * 2 ** 70 for v in big)
    assert _binomial_ok(sum(int(v) >= 2 ** 71 for v in big), 2000, 1 / 3)
    for x in (Fraction(0), Fraction(1, 3), 1, Fraction(5, 2), 0.75, Fraction(10 ** 20 + 1, 10 ** 20)):
        b = sample_bernoulli_exp(x, n, g)
        assert b.dtype == bool and b.shape == (n,)
        assert _binomial_ok(b.sum(), n, math.exp(-float(x))), x
    for p in (0, 1, Fraction(1, 3), 0.1, Fraction(2 ** 70 - 1, 2 ** 70)):
        b = sample_bernoulli(p, n, g)
        assert _binomial_ok(b.sum(), n, float(p)), p
    assert sample_bernoulli_exp(Fraction(1, 2), (3, 4), g).shape == (3, 4)
    for bad in (-1, Fraction(-1, 2), float("nan"), True, "1"):
        with pytest.raises(PrivacyParameterError):
            sample_bernoulli_exp(bad, 3, g)
    with pytest.raises(PrivacyParameterError):
        sample_bernoulli(Fraction(3, 2), 3, g)
    with pytest.raises(InvalidInputError):
        sample_uniform_integers(0, 3, g)


def test_integer_and_rational_parameters_are_exact():
    """sigma^2 given as an int or a Fraction is used as such (the client release passes ints)."""
    n = 40_000
    x = sample_discrete_gaussian_var(Fraction(9, 4), n, secure_generator(3))
    assert _chi_square(x, lambda v: discrete_gaussian_pmf(v, 1.5), -6, 6) > 1e-4
    big = sample_discrete_gaussian_var(30_000 ** 2, n, secure_generator(4))  # a client-release size
    assert abs(big.std() / 30_000 - 1) < 5 * math.sqrt(0.5 / n)


def test_a_tests_seed_reproduces_and_bad_parameters_are_refused():
    a = sample_discrete_gaussian(3.0, 50, secure_generator(7))
    b = sample_discrete_gaussian(3.0, 50, secure_generator(7))
    assert np.array_equal(a, b)
    assert sample_discrete_laplace(2.0, (3, 4), secure_generator(1)).shape == (3, 4)
    for bad in (0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(PrivacyParameterError):
            sample_discrete_gaussian(bad, 3, secure_generator(0))
        with pytest.raises(PrivacyParameterError):
            sample_discrete_laplace(bad, 3, secure_generator(0))
    with pytest.raises(InvalidInputError):
        sample_discrete_gaussian(1.0, -1, secure_generator(0))
    with pytest.raises(InvalidInputError):
        sample_discrete_gaussian(1.0, 3, np.random.RandomState(0))


def test_zcdp_conversion():
    # Bun & Steinke's simple bound eps = rho + 2 sqrt(rho ln(1/delta)) is never beaten by much,
    # and our (tighter, CKS Cor. 13) delta at that eps is below the target delta
    for rho in (0.01, 0.1, 1.0, 5.0):
        d = 1e-6
        eps = rho + 2 * math.sqrt(rho * math.log(1 / d))
        assert zcdp_to_delta(rho, eps) <= d
    for eps, delta in ((1.0, 1e-5), (4.0, 1e-6), (16.0, 1e-5)):
        rho = zcdp_rho_for(eps, delta)
        assert zcdp_to_delta(rho, eps) <= delta < zcdp_to_delta(rho * 1.01, eps)
    with pytest.raises(PrivacyParameterError):
        zcdp_rho_for(1.0, 0.0)


# --------------------------------------------------------------------------- Mironov-style test
def _float_release(z, sigma, rng):
    """The client release before the grid: z + sigma * N(0, 1) in float64."""
    return z + rng.normal(0.0, 1.0, size=np.shape(z)) * sigma


def test_float_gaussian_low_bits_rule_the_neighbour_out():
    """Old release, one coordinate: true value 0 vs neighbour 1. For |y| < 1/2 every output of the
    neighbour is fl(1 + n) with n in [-3/2, -1/2], an exact multiple of 2^-53 (Sterbenz), so an
    output off that lattice is impossible under the neighbour: one draw rules it out."""
    sigma = ClassRowsGaussianMechanism(1.0, 1e-5, [0.5], 1).sigmas_[0]  # the eps-1 noise of a diameter-1 row
    rng = secure_generator(5)
    n = 4000
    y = _float_release(np.zeros(n), sigma, rng)
    lattice = 2.0 ** -53
    excluded = (np.abs(y) < 0.5) & (np.mod(y, lattice) != 0)
    # under the neighbour the same test never fires
    y1 = _float_release(np.ones(n), sigma, rng)
    assert not np.any((np.abs(y1) < 0.5) & (np.mod(y1, lattice) != 0))
    rate = excluded.mean()
    print(f"float Gaussian at eps 1: {excluded.sum()} of {n} outputs rule the neighbour out")
    assert rate > 1e-5 + 10 * math.sqrt(1e-5 / n) + 0.01  # far beyond delta: (eps, delta) is broken


def test_grid_release_never_rules_the_neighbour_out_and_stays_within_eps_delta():
    """New release, same pair (one class row of diameter 1, value 0 vs 1 along a coordinate):
    every output is gamma * integer, reachable from both inputs; the empirical likelihood ratio of
    every output bin stays within e^eps (plus sampling error)."""
    eps, delta = 1.0, 1e-5
    n = 40_000
    # n independent releases of the differing row at once: the calibration does not depend on
    # the number of rows (the sensitivity is that of two changed rows whatever C is)
    m = ClassRowsGaussianMechanism(eps, delta, [0.5] * n, 1, grid_steps=16)  # coarse grid: bins are visible
    a = m.release_grid(np.zeros((n, 1)), secure_generator(6))[:, 0]
    b = m.release_grid(np.full((n, 1), 0.5), secure_generator(7))[:, 0]
    ya = m.release(np.zeros((n, 1)), secure_generator(8))
    g = m.grid_[:, None]
    assert np.all(ya == np.rint(ya / g) * g)  # float outputs are grid points, bit for bit
    # no output excludes the neighbour: whatever the value, it is an integer (reachable from both)
    assert a.dtype == np.int64 and b.dtype == np.int64
    # likelihood ratio of the two worlds' outputs, in bins of one noise sigma
    sig = float(m.sigmas_[0] / m.grid_[0])
    edges = np.arange(-4, 5) * sig
    ha, _ = np.histogram(a, bins=edges)
    hb, _ = np.histogram(b, bins=edges)
    for ca, cb in zip(ha, hb):
        if ca + cb < 200:
            continue
        slack = 4 * math.sqrt(ca + cb)
        assert ca <= math.exp(eps) * cb + delta * n + slack, (ca, cb)
        assert cb <= math.exp(eps) * ca + delta * n + slack, (ca, cb)
    # and the test has teeth: the two worlds are distinguishable at all
    assert b.mean() - a.mean() > 3 * sig * math.sqrt(2 / n)
