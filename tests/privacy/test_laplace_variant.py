"""The earlier paper's Laplace variant: constants, beta range, and an honest statement of the guarantee."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pm_vector.errors import DomainError, InvalidInputError, PrivacyParameterError
from pm_vector.privacy import (LaplaceVariantMechanism, laplace_variant_constants, laplace_variant_sensitivity,
                               secure_generator, smlq_first_iteration)
from pm_vector.privacy.laplace_variant import max_log_beta

SIGMA_HALF = 1 / math.sqrt(math.log(2))  # e^{-1/sigma^2} = 1/2


def test_one_hot_constants_at_hand_evaluated_point():
    # n = 10, alpha = 1, e^{-k/sigma^2} = 2^-k, e^{-1/(2 sigma^2)} = r = 2^-1/2. Eqs (32), (33), (37), (38):
    r = 2 ** -0.5
    a, b, u = 10 / 4 + r - 1, 11 / 4 - 1, 10 + r - 1
    ly, lyt = 10 / 2 + r - 1, 11 / 2 - 1           # one-hot label-degree lower bounds, eq (31)
    z_ii_max = (u / a) ** 2 + (10 / b) ** 2 - 2 * ly * lyt / (10 * u)
    z_ii_min = (ly / u) ** 2 + (lyt / 10) ** 2 - 2 * 10 * u / (a * lyt)
    z_ij_max = 2 / a - 2 / 8 / u + 2 / b - 2 / 8 / 10 - 2 * (1 / 4 + 1 / 16) / (10 * u) + 4 / (a * b)
    z_ij_min = (1 / 4 + 1 / 16) / u - 2 / a + (1 / 4 + 1 / 16) / 10 - 2 / b - 4 / (a * b) + 4 / 8 / (10 * u)
    # calculator: u/a = 4.398113, z_ii_max = 51.56004, z_ij_max = 3.027444
    assert z_ii_max == pytest.approx(51.56004, rel=1e-6) and z_ij_max == pytest.approx(3.027444, rel=1e-6)
    got = laplace_variant_constants(10, SIGMA_HALF, 1.0)
    for key, want in [("z_ii_max", z_ii_max), ("z_ii_min", z_ii_min), ("z_ij_max", z_ij_max), ("z_ij_min", z_ij_min),
                      ("phi_max", 10 * z_ij_max + z_ii_max), ("phi_min", 10 * z_ij_min + z_ii_min)]:
        assert got[key] == pytest.approx(want, rel=1e-12), key


def test_integer_constants_at_hand_evaluated_point():
    # n = 10, alpha = 1, c = 1 (c^2 = 1): e^{-c^2/(2 s^2)} = r, e^{-(c^2+4)/(2 s^2)} = 2^-5/2, e^{-c^2/s^2} = 1/2,
    # e^{-(c^2+4)/s^2} = 1/32. Eqs (35), (36), (39), (40) as printed.
    r = 2 ** -0.5
    a, b, u = 10 / 4 + r - 1, 11 / 4 - 1, 10 + r - 1
    li = 11 * r - 1
    z_ii_max = (10 / a) ** 2 + (10 / b) ** 2 - 2 * li ** 2 / (10 * u)
    z_ii_min = (li / u) ** 2 + (li / 10) ** 2 - 2 * 100 / (a * (11 / 2 - 1))
    e52 = 2 ** -2.5
    z_ij_max = 2 / a - 2 * e52 / u + 2 / b - 2 * e52 / 10 - 2 * (1 / 2 + 1 / 16) / (10 * u) + 4 / (a * b)
    z_ij_min = (1 / 2 + 1 / 16) / u - 2 / a + (1 / 2 + 1 / 16) / 10 - 2 / b - 4 / (a * b) + 4 / 32 / (10 * u)
    got = laplace_variant_constants(10, SIGMA_HALF, 1.0, "integer", 1)
    for key, want in [("z_ii_max", z_ii_max), ("z_ii_min", z_ii_min), ("z_ij_max", z_ij_max), ("z_ij_min", z_ij_min)]:
        assert got[key] == pytest.approx(want, rel=1e-12), key


def test_corollary_formula_at_a_point():
    c = laplace_variant_constants(500, 20.0, 0.5)
    pmin, pmax = c["phi_min"], c["phi_max"]
    assert 0 < pmin < pmax
    lb = -4 * 2 * 500
    want = 0.5 * 3.0 * math.sqrt(-lb * pmax ** 4 / pmin ** 2 - 2 * math.sqrt(-2 * 500 * lb * pmin ** 4))
    assert laplace_variant_sensitivity(500, 20.0, 0.5, 2, 3.0, log_beta=lb) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("kwargs", [
    dict(beta=0.5), dict(beta=1e-3), dict(log_beta=-79.9),      # outside ln(beta) <= -4 k n = -80 (n = 10, k = 2)
    dict(beta=0.0), dict(beta=1.0), dict(beta=-1e-9), dict(beta=math.nan), dict(log_beta=math.inf),
    dict(log_beta=math.nan), dict(), dict(beta=1e-40, log_beta=-92.1),
])
def test_beta_outside_the_paper_range_is_refused(kwargs):
    with pytest.raises(PrivacyParameterError):
        LaplaceVariantMechanism(1.0, 10, 20.0, 0.5, 2, 1.0, **kwargs)


def test_beta_at_the_limit_is_accepted():
    assert max_log_beta(10, 2) == -80.0
    m = LaplaceVariantMechanism(1.0, 10, 20.0, 0.5, 2, 1.0, log_beta=-80.0)
    assert m.log_beta == -80.0 and m.beta == pytest.approx(math.exp(-80))
    LaplaceVariantMechanism(1.0, 10, 20.0, 0.5, 2, 1.0, beta=1e-40)


def test_guarantee_is_stated_as_probabilistic():
    m = LaplaceVariantMechanism(1.0, 500, 20.0, 0.5, 2, 1.0, log_beta=-4000.0)
    assert "probabilistic" in m.guarantee and "NOT pure" in m.guarantee
    assert m.is_pure_dp is False
    assert m.failure_probability == 1.0                       # no finite union: no guarantee
    m2 = LaplaceVariantMechanism(1.0, 10, 20.0, 0.5, 2, 1.0, log_beta=-100.0, union_size=10 ** 6)
    assert m2.failure_probability == pytest.approx(1e6 * math.exp(-100), rel=1e-12)
    assert str(m2.failure_probability)[:4] in m2.guarantee or f"{m2.failure_probability:.3g}" in m2.guarantee


def test_noise_scale_l1_by_default_and_paper_on_request():
    kw = dict(log_beta=-80.0)
    l1 = LaplaceVariantMechanism(2.0, 10, 20.0, 0.5, 2, 1.0, **kw)
    paper = LaplaceVariantMechanism(2.0, 10, 20.0, 0.5, 2, 1.0, calibration="paper", **kw)
    assert paper.scale == pytest.approx(paper.sensitivity / 2.0)
    assert l1.scale == pytest.approx(math.sqrt(11 * 2) * l1.sensitivity / 2.0)
    out = l1.release(np.zeros((11, 2)), secure_generator(seed=3))
    assert out.shape == (11, 2)
    with pytest.raises(InvalidInputError):
        l1.release(np.zeros((10, 2)), secure_generator(seed=3))


def test_paper_defaults_are_outside_the_formula_domain():
    # n = 500, sigma = 5, alpha = 0.5, one-hot: Appendix E gives phi_min < 0.
    assert laplace_variant_constants(500, 5.0, 0.5)["phi_min"] < 0
    with pytest.raises(DomainError, match="phi_min"):
        LaplaceVariantMechanism(0.1, 500, 5.0, 0.5, 2, 1.0, log_beta=-4000.0)
    with pytest.raises(DomainError):
        laplace_variant_constants(100, 0.5, 0.5)


def test_phi_min_is_not_a_valid_lower_bound():
    # alpha = 0, all rows equal x, new record v at 60 degrees from x: ||v - x|| = 1 = ||0 - x||, so the zero row and
    # v are indistinguishable to the kernel and the difference matrix vanishes, yet phi_min > 0.
    n, sigma = 20, 20.0
    x = np.array([1.0, 0.0, 0.0]); v = np.array([0.5, math.sqrt(3) / 2, 0.0])
    X = np.tile(x, (n, 1)); Y = np.zeros((n, 1))
    Xp, Xt = np.vstack([X, np.zeros(3)]), np.vstack([X, v])
    Yp = Yt = np.vstack([Y, [[0.0]]])
    eye = np.eye(n + 1)
    M = 2 * (smlq_first_iteration(Xp, Yp, eye, sigma, 0.0) - smlq_first_iteration(Xt, Yt, eye, sigma, 0.0))
    assert np.max(np.abs(M)) < 1e-12
    assert laplace_variant_constants(n, sigma, 0.0, "integer", 3)["phi_min"] > 1.5
    assert laplace_variant_constants(n, sigma, 0.0)["phi_min"] > 1.5


@pytest.mark.parametrize("kwargs,err", [
    (dict(epsilon=0.0), PrivacyParameterError), (dict(n=0), InvalidInputError), (dict(k=0), InvalidInputError),
    (dict(sigma=-1.0), InvalidInputError), (dict(alpha=-0.5), InvalidInputError),
    (dict(sigma_q=0.0), InvalidInputError),
    (dict(label_encoding="ordinal"), InvalidInputError), (dict(label_encoding="integer"), InvalidInputError),
    (dict(union_size=0), InvalidInputError), (dict(calibration="l2"), InvalidInputError),
])
def test_bad_parameters(kwargs, err):
    args = dict(epsilon=1.0, n=10, sigma=20.0, alpha=0.5, k=2, sigma_q=1.0, log_beta=-80.0)
    args.update(kwargs)
    with pytest.raises(err):
        LaplaceVariantMechanism(**args)
