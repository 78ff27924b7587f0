"""Baseline retrieval methods: exactness, noise calibration, utility extremes, input checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from pm_vector.bench.baselines import DPPCA, DPRandomProjection, RawKNN, knn_search
from pm_vector.bench.metrics import chance_precision_at_k, chance_recall_at_k, precision_at_k, recall_at_k
from pm_vector.datasets import load_dataset, split_dataset
from pm_vector.errors import InvalidInputError, PrivacyParameterError
from pm_vector.privacy import AnalyticGaussianMechanism, secure_generator


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def digits_split():
    return split_dataset(load_dataset("digits"), 1000, 300, 197, 300, seed=0)


def brute_force(q, x, k):
    d = ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    return np.argsort(d, axis=1, kind="stable")[:, :k], np.sort(d, axis=1)[:, :k]


def balle_wang_delta(sigma, eps, sens):
    """Independent check of the analytic Gaussian mechanism (Balle & Wang 2018, Thm 8)."""
    a = sens / (2 * sigma) - eps * sigma / sens
    b = -sens / (2 * sigma) - eps * sigma / sens
    return norm.cdf(a) - math.exp(eps) * norm.cdf(b)


# ---------------------------------------------------------------------------- RawKNN

def test_rawknn_matches_brute_force_random():
    rng = np.random.default_rng(1)
    x = unit(rng.standard_normal((400, 16)))
    q = unit(rng.standard_normal((37, 16)))
    want, _ = brute_force(q, x, 10)
    m = RawKNN(batch_size=8).fit(x, np.zeros(400, int), rng)
    got = m.search(q, 10, rng)
    assert got.shape == (37, 10) and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    full = m.search(q, 400, rng)  # k = n: a full ranking
    np.testing.assert_array_equal(np.sort(full, axis=1), np.tile(np.arange(400), (37, 1)))


def test_rawknn_matches_brute_force_digits(digits_split):
    xs, ys = digits_split.server
    xq, _ = digits_split.query
    xs64, xq64 = xs.astype(np.float64), xq.astype(np.float64)
    got = RawKNN().fit(xs, ys).search(xq, 8)
    _, want_d = brute_force(xq64, xs64, 8)
    got_d = ((xq64[:, None, :] - xs64[got]) ** 2).sum(-1)
    np.testing.assert_allclose(got_d, want_d, atol=1e-12)  # same distances (digits has duplicate images)
    # a server item is its own nearest neighbour
    self_nn = RawKNN().fit(xs, ys).search(xs[:50], 1)[:, 0]
    np.testing.assert_allclose(((xs64[self_nn] - xs64[:50]) ** 2).sum(1), 0.0, atol=1e-12)


def test_knn_search_tie_break_by_index():
    items = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [-1.0, 0.0]])
    np.testing.assert_array_equal(knn_search(np.array([[1.0, 0.0]]), items, 3), [[0, 2, 1]])


# ---------------------------------------------------------------------------- DP calibration

@pytest.mark.parametrize("cls, m", [(DPRandomProjection, 16), (DPPCA, 16)])
@pytest.mark.parametrize("eps", [0.5, 4.0])
def test_noise_std_matches_mechanism_sigma(digits_split, cls, m, eps):
    xs, ys = digits_split.server
    delta = 1e-5
    method = cls(n_components=m, epsilon=eps, delta=delta).fit(xs, ys, secure_generator(7))
    # the sensitivity is 2 ||W||_2 of the actual projection, and sigma is the analytic calibration for it
    w = method.components_
    assert w.shape == (m, 64)
    assert method.spectral_norm_ == pytest.approx(np.linalg.norm(w, 2), rel=1e-12)
    assert method.sensitivity_ == pytest.approx(2 * np.linalg.norm(w, 2), rel=1e-12)
    assert method.noise_sigma_ == AnalyticGaussianMechanism(eps, delta, method.sensitivity_).sigma
    s = method.noise_sigma_
    assert balle_wang_delta(s, eps, method.sensitivity_) <= delta * (1 + 1e-6)
    assert balle_wang_delta(0.98 * s, eps, method.sensitivity_) > delta  # and not wastefully large

    q = np.repeat(digits_split.query[0][:5], 400, axis=0)  # 2000 releases of 5 queries
    noise = method.release(q, secure_generator(123)) - method.project(q)
    assert noise.shape == (2000, m)
    assert np.std(noise) == pytest.approx(s, rel=0.02)          # 32,000 draws: sd of the estimate ~0.4 %
    assert abs(np.mean(noise)) < 4 * s / math.sqrt(noise.size)
    corr = np.corrcoef(noise[:, :4].T)
    assert np.all(np.abs(corr - np.eye(4)) < 0.1)               # independent coordinates
    # injected seed reproduces the release; another seed does not
    np.testing.assert_array_equal(method.release(q[:3], secure_generator(5)), method.release(q[:3], secure_generator(5)))
    assert not np.allclose(method.release(q[:3], secure_generator(5)), method.release(q[:3], secure_generator(6)))


def test_random_projection_matrix_is_jl_scaled_and_seeded(digits_split):
    xs, ys = digits_split.server
    a = DPRandomProjection(512, 1.0, 1e-5).fit(xs, ys, secure_generator(0))
    b = DPRandomProjection(512, 1.0, 1e-5).fit(xs, ys, secure_generator(0))
    np.testing.assert_array_equal(a.components_, b.components_)
    assert np.var(a.components_) == pytest.approx(1 / 512, rel=0.05)
    # JL: norms approximately preserved
    ratio = np.linalg.norm(a.server_embedding_, axis=1)  # server rows are unit norm
    assert np.all(np.abs(ratio - 1) < 0.25)
    # spectral norm of an (m x d) N(0, 1/m) matrix is about 1 + sqrt(d/m)
    assert a.spectral_norm_ == pytest.approx(1 + math.sqrt(64 / 512), rel=0.1)


def test_dppca_basis_orthonormal_and_exact_geometry(digits_split):
    xs, ys = digits_split.server
    xq, _ = digits_split.query
    m = DPPCA(n_components=64, epsilon=1.0, delta=1e-5).fit(xs, ys, secure_generator(0))
    np.testing.assert_allclose(m.components_ @ m.components_.T, np.eye(64), atol=1e-10)
    assert m.sensitivity_ == pytest.approx(2.0, abs=1e-9)
    assert np.all(np.diff(m.explained_variance_ratio_) <= 1e-12)
    # a full-rank centred basis is a rotation: noiseless search in it is raw k-NN
    raw = RawKNN().fit(xs, ys).search(xq, 8)
    noiseless = knn_search(m.project(xq), m.server_embedding_, 8)
    xs64, xq64 = xs.astype(np.float64), xq.astype(np.float64)
    d_raw = ((xq64[:, None] - xs64[raw]) ** 2).sum(-1)
    d_pca = ((xq64[:, None] - xs64[noiseless]) ** 2).sum(-1)
    np.testing.assert_allclose(d_pca, d_raw, atol=1e-10)


# ---------------------------------------------------------------------------- utility extremes

def _retrieved_labels(method, split, k=8, seed=0):
    xs, ys = split.server
    method.fit(xs, ys, secure_generator(seed))
    return ys[method.search(split.query[0], k, secure_generator(seed + 1))]


@pytest.mark.parametrize("cls, m", [(DPRandomProjection, 32), (DPPCA, 32)])
def test_recall_extremes(digits_split, cls, m):
    yq = digits_split.query[1]
    raw = _retrieved_labels(RawKNN(), digits_split)
    raw_r, raw_p = recall_at_k(raw, yq), precision_at_k(raw, yq)
    assert raw_r > 0.97 and raw_p > 0.9
    hi = _retrieved_labels(cls(m, epsilon=1e7, delta=1e-5), digits_split)
    assert recall_at_k(hi, yq) >= raw_r - 0.03 and precision_at_k(hi, yq) >= raw_p - 0.1

    # tiny epsilon: the release is pure noise, so the retrieval is independent of the query.
    lo = _retrieved_labels(cls(m, epsilon=1e-3, delta=1e-5), digits_split)
    freq = np.bincount(digits_split.server[1])
    assert abs(precision_at_k(lo, yq) - chance_precision_at_k(freq)) < 0.04
    # Recall@k then equals that of the same retrieved lists scored against shuffled query labels.
    # It is NOT the iid chance level 1 - 0.9^8: a noise-dominated query retrieves the items most
    # extreme in a random direction, which mostly share a class, so recall falls far below it.
    g = np.random.default_rng(0)
    shuffled = np.mean([recall_at_k(lo, g.permutation(yq)) for _ in range(20)])
    assert abs(recall_at_k(lo, yq) - shuffled) < 0.1
    assert recall_at_k(lo, yq) < chance_recall_at_k(freq, 8)


# ---------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("eps, delta, match", [
    (0.0, 1e-5, "epsilon"), (-1.0, 1e-5, "epsilon"), (float("nan"), 1e-5, "epsilon"),
    (float("inf"), 1e-5, "epsilon"), (1.0, 0.0, "delta"), (1.0, 1.0, "delta"), (1.0, -1e-5, "delta"),
])
@pytest.mark.parametrize("cls", [DPRandomProjection, DPPCA])
def test_bad_privacy_parameters(cls, eps, delta, match):
    x = unit(np.random.default_rng(0).standard_normal((20, 5)))
    with pytest.raises(PrivacyParameterError, match=match):
        cls(3, eps, delta).fit(x, np.zeros(20, int), secure_generator(0))


@pytest.mark.parametrize("cls", [RawKNN, DPRandomProjection, DPPCA])
def test_bad_inputs(cls):
    rng = np.random.default_rng(0)
    x = unit(rng.standard_normal((20, 5)))
    y = np.arange(20) % 2
    method = cls() if cls is RawKNN else cls(3, 1.0, 1e-5)
    with pytest.raises(InvalidInputError, match="not fitted"):
        method.search(x[:2], 2, secure_generator(0))
    with pytest.raises(InvalidInputError, match="unit-norm"):
        method.fit(2 * x, y, secure_generator(0))
    with pytest.raises(InvalidInputError, match="one label per row"):
        method.fit(x, y[:-1], secure_generator(0))
    method.fit(x, y, secure_generator(0))
    with pytest.raises(InvalidInputError, match="4 features but the server items have 5"):
        method.search(unit(rng.standard_normal((2, 4))), 2, secure_generator(0))
    bad = x[:2].copy()
    bad[1, 2] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        method.search(bad, 2, secure_generator(0))
    with pytest.raises(InvalidInputError, match="unit-norm"):
        method.search(x[:2] * 1.1, 2, secure_generator(0))
    with pytest.raises(InvalidInputError, match="2-d"):
        method.search(x[0], 2, secure_generator(0))
    for k in (0, 21, 2.5):
        with pytest.raises(InvalidInputError, match="k must be"):
            method.search(x[:2], k, secure_generator(0))
    with pytest.raises(InvalidInputError, match="Generator"):
        method.search(x[:2], 2, np.random.RandomState(0))


def test_bad_n_components():
    x = unit(np.random.default_rng(0).standard_normal((20, 5)))
    for cls in (DPRandomProjection, DPPCA):
        with pytest.raises(InvalidInputError, match="n_components"):
            cls(0, 1.0, 1e-5).fit(x, np.zeros(20, int), secure_generator(0))
    with pytest.raises(InvalidInputError, match="n_components=6 exceeds"):
        DPPCA(6, 1.0, 1e-5).fit(x, np.zeros(20, int), secure_generator(0))


# ---------------------------------------------------------------------------- ReferenceClassLDP

from pm_vector.bench.baselines import ReferenceClassLDP  # noqa: E402
from pm_vector.manifold.class_frames import ClassFrames  # noqa: E402


@pytest.fixture(scope="module")
def frames(digits_split):
    return ClassFrames(4, 0.9).fit(*digits_split.anchor)


@pytest.mark.parametrize("eps", [1.0, 16.0])
def test_reference_ldp_calibration(digits_split, frames, eps):
    xs, ys = digits_split.server
    ref = ReferenceClassLDP(eps, 1e-5).fit(frames, xs, ys)
    for c, r in enumerate(frames.radii_):
        s = ref.sigmas_[c]
        assert s == AnalyticGaussianMechanism(eps / 2, 0.5e-5, 2 * r).sigma
        # each row is (eps/2, delta/2)-DP at its sensitivity 2 r_c (independent check)
        assert balle_wang_delta(s, eps / 2, 2 * r) <= 0.5e-5 * (1 + 1e-6)
    # empirical noise: the released rows scatter around the clipped coordinates with sigma_c
    xq = np.repeat(digits_split.query[0][:1], 4000, axis=0)
    lab = np.repeat(digits_split.query[1][:1], 4000)
    noise = ref.release(xq, lab, secure_generator(1)) - frames.clipped(xq, lab)
    assert noise.shape == (4000, 4)
    assert np.std(noise) == pytest.approx(ref.sigma_of(lab[:1])[0], rel=0.03)


def test_reference_ldp_noise_free_ranks_the_class_in_clipped_coordinates(digits_split, frames):
    xs, ys = digits_split.server
    xq, yq = digits_split.query
    ref = ReferenceClassLDP(float("inf"), 1e-5).fit(frames, xs, ys)
    assert np.all(ref.sigmas_ == 0)
    z = ref.release(xq[:20], yq[:20])
    np.testing.assert_array_equal(z, frames.clipped(xq[:20], yq[:20]))
    got = ref.shortlist(z, yq[:20], 10)
    for i in range(20):
        idx = np.flatnonzero(ys == yq[i])
        d2 = ((frames.clipped(xs[idx], ys[idx]) - z[i]) ** 2).sum(1)
        np.testing.assert_array_equal(got[i], idx[np.argsort(d2, kind="stable")[:10]])
        assert np.all(ys[got[i]] == yq[i])


def test_reference_ldp_bad_input(digits_split, frames):
    xs, ys = digits_split.server
    with pytest.raises(InvalidInputError, match="not fitted"):
        ReferenceClassLDP(1.0, 1e-5).release(xs[:1], ys[:1])
    with pytest.raises(InvalidInputError, match="fitted ClassFrames"):
        ReferenceClassLDP(1.0, 1e-5).fit(ClassFrames(4), xs, ys)
    for eps, delta in ((0.0, 1e-5), (-1.0, 1e-5), (1.0, 0.0)):
        with pytest.raises(PrivacyParameterError):
            ReferenceClassLDP(eps, delta).fit(frames, xs, ys)
    ref = ReferenceClassLDP(1.0, 1e-5).fit(frames, xs, ys)
    with pytest.raises(InvalidInputError, match="k must be"):
        ref.shortlist(np.zeros((1, 4)), ys[:1], 0)
    with pytest.raises(InvalidInputError, match="not a class"):
        ref.shortlist(np.zeros((1, 4)), [99], 3)
