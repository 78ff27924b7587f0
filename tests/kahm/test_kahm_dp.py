"""Result 1's noise (eqs 74-76), Algorithm 1, the smoother (Def 13, Thm 6) and fabricated data
(Def 14, eq 92, Remark 4)."""

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from pm_vector.errors import InvalidInputError, PrivacyParameterError
from pm_vector.kahm import FabricationWarning, OptimalNoise, fabricate, fabricate_subsets, modelling_error, privatize, smooth
from pm_vector.privacy import secure_generator


# ---------------------------------------------------------------- Result 1
@pytest.mark.parametrize("eps,delta,d", [(1.0, 0.2, 1.0), (0.5, 0.05, 2.0), (8.0, 0.3, 0.25)])
def test_sampled_noise_matches_result1(eps, delta, d):
    noise = OptimalNoise(eps, delta, d)
    n = 200_000
    v = noise.sample(n, secure_generator(7))
    # atom of mass delta at exactly 0 (the inverse CDF maps [(1-delta)/2, (1+delta)/2] to 0)
    zero = v == 0.0
    se = math.sqrt(delta * (1 - delta) / n)
    assert abs(zero.mean() - delta) < 5 * se
    # the rest is Laplace(0, d/eps): |v| ~ Exp(scale d/eps), symmetric signs
    nz = v[~zero]
    ks = stats.kstest(np.abs(nz), "expon", args=(0, d / eps))
    assert ks.pvalue > 1e-3
    assert abs((nz > 0).mean() - 0.5) < 5 * math.sqrt(0.25 / nz.size)
    # tails: P(|v| > x) = (1 - delta) exp(-eps x / d)
    for x in (0.5 * d / eps, 2 * d / eps, 5 * d / eps):
        p = (1 - delta) * math.exp(-eps * x / d)
        assert abs((np.abs(v) > x).mean() - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-4
    # E|v| = (1 - delta) d / eps (eq 2)
    assert np.abs(v).mean() == pytest.approx(noise.expected_magnitude(), rel=0.02)


def test_inverse_cdf_is_eq76_and_inverts_eq75():
    noise = OptimalNoise(2.0, 0.1, 1.0)
    a = (1 - 0.1) / 2
    t = np.array([1e-9, 0.1, a - 1e-9, a, 0.5, 1 - a, 1 - a + 1e-9, 0.9, 1 - 1e-9])
    v = noise.inverse_cdf(t)
    assert np.all(v[3:6] == 0.0)
    assert v[0] < v[1] < v[2] < 0 < v[6] < v[7] < v[8]
    np.testing.assert_allclose(noise.inverse_cdf(np.array([0.1]))[0], 0.5 * math.log(0.2 / 0.9))
    np.testing.assert_allclose(noise.inverse_cdf(np.array([0.9]))[0], -0.5 * math.log(0.2 / 0.9))
    # F(F^-1(t)) = t off the atom; F jumps by delta at 0
    off = np.array([0.01, 0.2, 0.44, 0.56, 0.8, 0.99])
    np.testing.assert_allclose(noise.cdf(noise.inverse_cdf(off)), off, rtol=1e-12)
    assert noise.cdf(0.0) - noise.cdf(-1e-12) == pytest.approx(0.1, abs=1e-9)
    with pytest.raises(InvalidInputError):
        noise.inverse_cdf(np.array([0.0]))


@pytest.mark.parametrize("eps,delta,d", [(1.0, 1e-5, 1.0), (0.3, 0.01, 2.0), (4.0, 0.1, 0.5)])
def test_noise_is_eps_delta_dp_numerically(eps, delta, d):
    """sup_O P(O) - e^eps P'(O) <= delta for neighbours |s| <= d (both orders), computed on the
    output densities (atom exactly, Laplace part numerically)."""
    noise = OptimalNoise(eps, delta, d)
    for s in np.linspace(-d, d, 9):
        for shift in (s, -s):
            assert noise.hockey_stick(shift) <= delta + 1e-9
    # the check is not vacuous: a neighbour farther than d breaks the bound at this eps ...
    assert noise.hockey_stick(2 * d) > delta + 1e-4
    # ... and at the true sensitivity the atom alone already uses the whole delta
    assert noise.hockey_stick(d) == pytest.approx(delta, abs=1e-9)
    # and a smaller epsilon than the calibrated one is violated
    assert noise.hockey_stick(d, epsilon=0.5 * eps) > delta + 1e-4


def test_privacy_parameters_are_validated_and_default_noise_is_unpredictable():
    for bad in (dict(epsilon=0), dict(epsilon=-1), dict(epsilon=float("inf")), dict(epsilon=1, delta=1.0),
                dict(epsilon=1, delta=-0.1), dict(epsilon=1, sensitivity=0)):
        with pytest.raises(PrivacyParameterError):
            OptimalNoise(**{"delta": 1e-5, "sensitivity": 1.0, **bad})
    noise = OptimalNoise(1.0)
    a, b = noise.sample(50), noise.sample(50)         # fresh cryptographically seeded generators
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(noise.sample(50, secure_generator(3)), noise.sample(50, secure_generator(3)))
    with pytest.raises(InvalidInputError):
        noise.sample(5, np.random.RandomState(0))
    Y = np.zeros((4, 3))
    Yp = privatize(Y, 1.0, 1e-5, 1.0, secure_generator(1))
    assert Yp.shape == Y.shape and not np.array_equal(Yp, Y)


# ---------------------------------------------------------------- smoother and fabrication
def _clustered(seed=0, N=150, p=8):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(3, p)) * 2
    return centres[rng.integers(0, 3, N)] + 0.3 * rng.normal(size=(N, p))


def test_smoother_modelling_error_falls_with_M_theorem6():
    Y = _clustered()
    Yp = privatize(Y, 2.0, 1e-5, 1.0, secure_generator(0))
    errs = []
    for M in (1, 2, 3, 5, 8):
        Yh, _, tr = smooth(Yp, 5, M)
        assert tr.steps == M - 1
        errs.append(modelling_error(Yh, 5))
    assert errs[0] == pytest.approx(smooth(Yp, 5, 1)[2].errors[0])          # T_{n,1} is the identity
    assert all(b < a for a, b in zip(errs, errs[1:]))
    assert errs[-1] < 0.2 * errs[0]
    # the trace of one long run is the same sequence
    _, _, tr = smooth(Yp, 5, 8)
    np.testing.assert_allclose([tr.errors[i] for i in (0, 1, 2, 4, 7)], errs, rtol=1e-9)


def test_fabricate_stops_at_the_first_step_meeting_eq92():
    Y = _clustered(1)
    Yp = privatize(Y, 1.0, 1e-5, 1.0, secure_generator(1))
    r = modelling_error(Y, 5)
    Yf, tr = fabricate(Yp, 5, r)
    assert tr.met_rule
    assert tr.errors[-1] <= r and all(e > r for e in tr.errors[:-1])
    # Y~ = A_{Y_{M~-1}}(Y_{M~-1}): the image of the last smoothed iterate under its own KAHM
    Yh, _, _ = smooth(Yp, 5, tr.steps + 1)
    from pm_vector.kahm import KAHM
    np.testing.assert_allclose(Yf, KAHM(5).fit(Yh.numpy()).predict(Yh.numpy()), rtol=1e-7, atol=1e-9)
    # fabricated rows depend on Y only through r (post-processing of Y+)
    Yf2, _ = fabricate(Yp.copy(), 5, r)
    np.testing.assert_array_equal(Yf, Yf2)
    # an unreachable threshold: warning, last iterate returned, flag set
    with pytest.warns(FabricationWarning):
        _, tr2 = fabricate(Yp, 5, 0.0, max_steps=2)
    assert tr2.met_rule is False and tr2.steps == 2


def test_fabricate_subsets_remark4():
    Y = _clustered(2, N=260)
    noise = OptimalNoise(4.0, 1e-5, 1.0)
    Yf, info = fabricate_subsets(Y, noise, 4, rng=secure_generator(2), branch_size=100)
    assert Yf.shape == Y.shape and len(info) == 3
    assert sum(i["size"] for i in info) == 260
    assert all(i["met_rule"] and i["final_error"] <= i["r"] for i in info)
    with pytest.raises(InvalidInputError, match="cluster_on"):
        fabricate_subsets(Y, noise, 4, rng=secure_generator(2), cluster_on="bogus")
