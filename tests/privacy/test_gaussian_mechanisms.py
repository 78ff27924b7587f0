"""Classical and analytic Gaussian mechanisms."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from pm_vector.errors import InvalidInputError, PrivacyParameterError
from pm_vector.privacy import AnalyticGaussianMechanism, GaussianMechanism, gaussian_privacy_profile, secure_generator

# (sensitivity, epsilon, delta) -> sigma published by independent implementations:
# microsoft/synthetic-data-showcase, packages/core/src/dp/analytic_gaussian.rs, test `validate_sigma`
# (Balle & Wang Algorithm 1 with binary search to tolerance 1e-8), and apple/pfl-research,
# tests/privacy/test_compute_parameters.py::test_specific ("from an implementation entirely independent of the
# paper": AnalyticGM_robust(2.25, 0.00040834087) == sqrt(2) at sensitivity 1).
PUBLISHED = [
    (math.sqrt(30.0), 6.0, 0.5, 1.4659731497780966),
    (math.sqrt(30.0), 6.0, 1e-5, 4.182602139814776),
    (math.sqrt(100.0), 0.1, 1e-5, 307.49566132862844),
    (math.sqrt(100.0), 0.1, 0.5, 7.016745810753165),
    (math.sqrt(0.1), 0.1, 0.5, 0.221888985244248),
    (math.sqrt(0.1), 0.1, 1.0 / 20000.0, 8.370597761781507),
    (1.0, 2.25, 0.00040834087, math.sqrt(2.0)),
]


@pytest.mark.parametrize("sens,eps,delta,sigma", PUBLISHED)
def test_analytic_matches_published_values(sens, eps, delta, sigma):
    assert AnalyticGaussianMechanism(eps, delta, sens).sigma == pytest.approx(sigma, rel=1e-7)


def _profile_mp(sigma, eps, sens):
    """Balle & Wang Theorem 8 in 60-digit arithmetic (independent of the implementation)."""
    with mpmath.workdps(60):
        s, e, d = mpmath.mpf(sigma), mpmath.mpf(eps), mpmath.mpf(sens)
        return mpmath.ncdf(d / (2 * s) - e * s / d) - mpmath.exp(e) * mpmath.ncdf(-d / (2 * s) - e * s / d)


GRID = [(e, d) for e in (0.01, 0.1, 0.5, 1.0, 3.0, 10.0, 100.0) for d in (1e-12, 1e-8, 1e-5, 0.1, 0.6)]


@pytest.mark.parametrize("eps,delta", GRID)
def test_analytic_sigma_is_tight_on_the_privacy_profile(eps, delta):
    sens = 2.5
    sigma = AnalyticGaussianMechanism(eps, delta, sens).sigma
    assert math.isfinite(sigma) and sigma > 0
    assert _profile_mp(sigma, eps, sens) <= delta                    # (eps, delta)-DP at the returned sigma
    assert _profile_mp(0.99 * sigma, eps, sens) > delta              # and not at 1 % less noise
    assert gaussian_privacy_profile(sigma, eps, sens) == pytest.approx(float(_profile_mp(sigma, eps, sens)), rel=1e-9)


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("delta", [1e-12, 1e-5, 0.1])
def test_analytic_never_needs_more_noise_than_classical(eps, delta):
    assert AnalyticGaussianMechanism(eps, delta, 3.0).sigma <= GaussianMechanism(eps, delta, 3.0).sigma


def test_classical_formula_and_refusal_at_eps_one():
    m = GaussianMechanism(0.5, 1e-5, 2.0)
    assert m.sigma == pytest.approx(math.sqrt(2 * math.log(1.25e5)) * 2.0 / 0.5, rel=1e-15)
    assert (m.epsilon, m.delta, m.sensitivity) == (0.5, 1e-5, 2.0)
    for eps in (1.0, 1.5, 10.0):
        with pytest.raises(PrivacyParameterError, match="AnalyticGaussianMechanism"):
            GaussianMechanism(eps, 1e-5, 1.0)


def test_sigma_scales_linearly_with_sensitivity():
    a = AnalyticGaussianMechanism(0.7, 1e-6, 1.0).sigma
    assert AnalyticGaussianMechanism(0.7, 1e-6, 123.0).sigma == pytest.approx(123.0 * a, rel=1e-9)


@pytest.mark.parametrize("cls", [GaussianMechanism, AnalyticGaussianMechanism])
@pytest.mark.parametrize("eps,delta,sens", [
    (0.0, 1e-5, 1.0), (-0.5, 1e-5, 1.0), (math.nan, 1e-5, 1.0), (math.inf, 1e-5, 1.0), ("0.5", 1e-5, 1.0),
    (True, 1e-5, 1.0), (0.5, 0.0, 1.0), (0.5, 1.0, 1.0), (0.5, -1e-5, 1.0), (0.5, math.nan, 1.0),
    (0.5, 1e-5, 0.0), (0.5, 1e-5, -1.0), (0.5, 1e-5, math.inf), (0.5, 1e-5, math.nan), (0.5, 1e-5, None),
])
def test_bad_parameters_are_refused(cls, eps, delta, sens):
    with pytest.raises(PrivacyParameterError):
        cls(eps, delta, sens)


@pytest.mark.parametrize("cls,eps", [(GaussianMechanism, 0.5), (AnalyticGaussianMechanism, 2.0)])
def test_release_adds_iid_gaussian_noise_of_the_stated_sigma(cls, eps):
    mech = cls(eps, 1e-5, 1.0)
    value = np.arange(12.0).reshape(3, 4)
    before = value.copy()
    out = mech.release(value, secure_generator(seed=1))
    assert out.shape == value.shape and out.dtype == np.float64
    np.testing.assert_array_equal(value, before)                       # input untouched
    np.testing.assert_array_equal(out, mech.release(value, secure_generator(seed=1)))  # seeded -> reproducible
    noise = mech.release(np.zeros(200_000), secure_generator(seed=2))
    assert np.std(noise) == pytest.approx(mech.sigma, rel=0.01)
    assert abs(np.mean(noise)) < 5 * mech.sigma / math.sqrt(noise.size)
    # no rng -> a fresh cryptographically seeded generator: two releases differ
    assert not np.array_equal(mech.release(value), mech.release(value))


def test_release_refuses_bad_values_and_generators():
    mech = AnalyticGaussianMechanism(1.0, 1e-5, 1.0)
    with pytest.raises(InvalidInputError):
        mech.release(np.array([1.0, np.nan]), secure_generator(0))
    with pytest.raises(InvalidInputError):
        mech.release(np.ones(3), np.random.RandomState(0))
    with pytest.raises(InvalidInputError):
        mech.release(["a", "b"], secure_generator(0))


@pytest.mark.parametrize("eps", [0.05, 1.0, 4.0, 16.0])
def test_gaussian_epsilon_inverts_the_profile(eps):
    from pm_vector.privacy import gaussian_epsilon

    sigma = AnalyticGaussianMechanism(eps, 1e-5, 2.0).sigma
    e = gaussian_epsilon(sigma, 1e-5, 2.0)
    assert e == pytest.approx(eps, rel=1e-8) and gaussian_privacy_profile(sigma, e, 2.0) <= 1e-5
    assert gaussian_privacy_profile(sigma, e * (1 - 1e-6), 2.0) > 1e-5
    with pytest.raises(PrivacyParameterError):
        gaussian_epsilon(sigma, 0.0, 2.0)
