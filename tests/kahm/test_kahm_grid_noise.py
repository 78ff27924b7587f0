"""Floating-point-safe KAHM noise (issue #11 item 2): Mironov-style tests of every noise the KAHM
tools release, against the paper's float construction, which fails them."""

import math

import numpy as np
import pytest

from pm_vector.errors import InvalidInputError, PrivacyParameterError
from pm_vector.kahm import FabricatedKAHMClassifier, NoisyKAHMClassifier, OptimalNoise, privatize
from pm_vector.kahm.grid import (GridOptimalNoise, RowGaussianNoise, continuous_can_produce, default_grid,
                                 grid_pmf_ratio_excess)
from pm_vector.kahm.plugin import anchor_noise
from pm_vector.privacy import secure_generator

X_TRUE, X_NEIGHBOUR = 3 / 16, 7 / 16   # Mironov's pair, |s| = 1/4 <= d
EPS, D = 1.0, 1.0
DRAWS = 4000


def test_old_float_construction_rules_the_neighbour_out():
    """The paper's eq 76 on 53-bit uniforms: one output excludes the neighbour far more often than
    (eps, delta) allows (an excluding output has P'(o) = 0, so P(o) <= e^eps P'(o) + delta needs the
    mass of such outputs to be <= delta)."""
    noise = OptimalNoise(EPS, 1e-5, D)
    out = X_TRUE + noise.sample(DRAWS, secure_generator(11))
    assert continuous_can_produce(out, X_TRUE, noise).all()      # the checker is sound on the truth
    excluded = int((~continuous_can_produce(out, X_NEIGHBOUR, noise)).sum())
    assert excluded > 0.5 * DRAWS                                 # measured: ~3,050 of 4,000
    assert excluded / DRAWS > noise.delta                         # the guarantee is broken


@pytest.mark.parametrize("x2", [X_NEIGHBOUR, X_TRUE + D, X_TRUE - D])
def test_grid_element_noise_passes(x2):
    noise = GridOptimalNoise(EPS, 1e-5, D)
    assert noise.grid == 2.0 ** -8 and noise.sensitivity_units == 257
    rng = secure_generator(12)
    out = np.concatenate([noise.release(np.full((1, DRAWS // 4), X_TRUE), rng).ravel() for _ in range(4)])
    units = out / noise.grid
    # every output is on the grid: a value the neighbour can produce too (no exclusion at all)
    assert np.array_equal(units, np.rint(units))
    q, q2 = round(X_TRUE / noise.grid), round(x2 / noise.grid)
    P, P2 = noise.pmf_units(units - q), noise.pmf_units(units - q2)
    assert np.all(P2 > 0)
    # empirical hockey-stick divergence E_P[(1 - e^eps P'/P)_+] (what (eps, delta) bounds by delta)
    hs = np.maximum(0.0, 1.0 - math.exp(EPS) * P2 / P)
    assert hs.mean() <= noise.delta + 4 * hs.std() / math.sqrt(DRAWS) + 1e-12
    # exact: sup_O P(O) - e^eps P'(O) <= delta, both orders
    assert grid_pmf_ratio_excess(noise, X_TRUE, x2) <= noise.delta + 1e-15
    assert grid_pmf_ratio_excess(noise, x2, X_TRUE) <= noise.delta + 1e-15


def test_grid_element_noise_law():
    """The integer noise is Result 1 on the grid: atom delta at 0 + discrete Laplace of scale K/eps."""
    noise = GridOptimalNoise(2.0, 0.2, 1.0, grid=2.0 ** -4)
    z = noise.sample_units(200_000, secure_generator(3))
    assert z.dtype == np.int64
    for v in (0, 1, -3, 8):
        p = noise.pmf_units(v)
        assert abs(np.mean(z == v) - p) < 5 * math.sqrt(p * (1 - p) / z.size) + 1e-4
    # a tighter grid of the same mechanism is still within the guarantee at the worst shift
    assert grid_pmf_ratio_excess(noise, 0.0, 1.0) <= 0.2 + 1e-12
    assert grid_pmf_ratio_excess(noise, 0.0, 1.0, epsilon=1.0) > 0.2   # and the check can fail


def test_row_gaussian_noise_passes():
    """Row level: the empirical hockey-stick divergence E[(1 - e^(eps - L))_+] over outputs of the true
    row, L the exact privacy loss against a neighbour row at the full sensitivity, stays <= delta."""
    p, C = 16, 1.0
    mech = RowGaussianNoise(1.0, 0.05, C)   # a large delta so that the estimate is informative
    x = np.zeros((1, p))
    x[0, 0] = 3 / 16 * C
    x2 = np.zeros((1, p))
    x2[0, 0] = -C                            # a neighbour as far as the clip allows
    cal = mech.calibrate(p)
    s = cal["sigma_grid_units"]
    out = mech.release(np.repeat(x, DRAWS, axis=0), secure_generator(5))   # each row its own draw
    g = cal["grid"]
    units = out / g
    assert np.array_equal(units, np.rint(units))                       # on the grid
    q, q2 = np.rint(x / g), np.rint(x2 / g)
    assert np.linalg.norm(q - q2) <= cal["sensitivity_grid_units"]
    L = (((units - q2) ** 2).sum(1) - ((units - q) ** 2).sum(1)) / (2 * s * s)
    hs = np.maximum(0.0, 1.0 - np.exp(1.0 - L))
    assert hs.mean() <= 0.05 + 4 * hs.std() / math.sqrt(DRAWS)
    # the same check catches an under-calibrated sigma (half of it)
    L_bad = L * 4   # same outputs scored as if sigma were halved: the loss quadruples
    assert np.maximum(0.0, 1.0 - np.exp(1.0 - L_bad)).mean() > 0.05


def test_row_noise_clips_to_the_public_norm():
    mech = RowGaussianNoise(1.0, 1e-5, 2.0)
    X = np.array([[3.0, 4.0], [0.3, 0.4]])
    np.testing.assert_allclose(mech.clip(X), [[1.2, 1.6], [0.3, 0.4]])
    rec = mech.record(784)
    assert rec["unit"] == "row" and rec["epsilon"] == 1.0 and rec["clip_norm"] == 2.0
    # the default grid keeps rounding's sqrt(p) under 1/64 of the clip term, and is a power of two
    assert rec["grid"] == mech.grid_for(784) == 2.0 ** -9 and 28.0 <= 2 * 2.0 / rec["grid"] / 64
    assert rec["sensitivity_grid_units"] == pytest.approx(2 * 2.0 / rec["grid"] + 28.0)
    assert rec["sigma"] == pytest.approx(rec["sigma_grid_units"] * rec["grid"])
    # the sampler's sigma^2 is an integer at least the calibrated Delta^2 / (2 rho): never less noise
    s2, D, rho = rec["sigma2_grid_units"], rec["sensitivity_grid_units"], rec["rho"]
    assert isinstance(s2, int) and D * D / (2 * rho) <= s2 < D * D / (2 * rho) + 1
    assert RowGaussianNoise(1.0, 1e-5, 2.0, grid=2.0 ** -4).record(784)["grid"] == 2.0 ** -4


def test_bad_parameters_are_refused():
    with pytest.raises(InvalidInputError, match="power of two"):
        GridOptimalNoise(1.0, 1e-5, 1.0, grid=0.003)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        GridOptimalNoise(0.0)
    with pytest.raises(PrivacyParameterError, match="delta"):
        RowGaussianNoise(1.0, 0.0)
    with pytest.raises(PrivacyParameterError, match="clip_norm"):
        RowGaussianNoise(1.0, 1e-5, -1.0)
    with pytest.raises(InvalidInputError, match="unit must be one of"):
        anchor_noise(1.0, unit="pixel")
    with pytest.raises(InvalidInputError, match="grid only"):
        anchor_noise(1.0, unit="row", noise="continuous")
    with pytest.raises(InvalidInputError, match="noise must be one of"):
        privatize(np.zeros((2, 2)), 1.0, noise="float")
    assert default_grid(1.0) == 2.0 ** -8 and default_grid(2.0) == 2.0 ** -7 and default_grid(0.3) == 2.0 ** -10


def test_released_models_store_grid_values():
    """What the KAHM classifiers release (the noisy rows they keep, Definitions 12/15) is on the grid;
    the paper's float construction, kept as noise='continuous', is not."""
    from sklearn.datasets import load_digits

    b = load_digits()
    Xtr, ytr = b.data[:200] / 16.0, b.target[:200]
    kw = dict(epsilon=4.0, n_components=5, n_layers=1, noise_seed=1)
    m = NoisyKAHMClassifier(**kw).fit(Xtr, ytr)
    g = m.privacy_["grid"]
    tensors, _ = m._state()
    Y = np.concatenate([v.numpy().ravel() for k, v in tensors.items() if k.endswith(".Y") and ".l0" in k])
    assert Y.size and np.array_equal(Y / g, np.rint(Y / g))
    old = NoisyKAHMClassifier(**kw, noise="continuous").fit(Xtr, ytr)
    tensors, _ = old._state()
    Y = np.concatenate([v.numpy().ravel() for k, v in tensors.items() if k.endswith(".Y") and ".l0" in k])
    assert not np.array_equal(Y / g, np.rint(Y / g))
    assert "NOT safe" in old.privacy_["floating_point"]
    f = FabricatedKAHMClassifier(**kw, smoothing_steps=2).fit(Xtr, ytr)
    assert f.privacy_["unit"] == "element" and "threshold r" not in f.privacy_["outside_guarantee"]
    assert privatize(Xtr[:3], 1.0, rng=secure_generator(0)).ravel().tolist() != Xtr[:3].ravel().tolist()
