"""The pm_vector release (one clipped, noised row per class): calibration, sensitivity over
arbitrary and adversarial query pairs, which-row and two-query attacks that see only what a
server sees (blind at infinite noise, within the release's bound), randomness and what a
request carries. ``pytest -s -k attack tests/privacy/test_class_rows_release.py`` prints the
attacks' rates beside their bounds."""

import inspect
import math

import numpy as np
import pytest

from pm_vector.client.query import PrivateKNN, ClassRowsRequest
from pm_vector.errors import InvalidInputError, PrivacyParameterError
from pm_vector.manifold.class_frames import ClassFrames
from pm_vector.privacy import gaussian_privacy_profile, secure_generator
from pm_vector.privacy.class_rows import (DEFAULT_GRID_STEPS, ROWS_CHANGED, ClassRowsGaussianMechanism,
                                          row_sensitivity, unit_noise_scale)
from pm_vector.privacy.discrete import zcdp_to_delta
from privacy_attacks import (distinguish_dp_bound, distinguish_gaussian_bound, distinguish_rate,  # tests/privacy
                             which_row_dp_bound, which_row_gaussian_bound, which_row_rate)


@pytest.fixture(autouse=True)
def _own_ledger(tmp_path, monkeypatch):
    """Unseeded requests charge the default ledger: keep it in this test's directory."""
    monkeypatch.setenv("PM_VECTOR_HOME", str(tmp_path))


@pytest.fixture(scope="module")
def setup(digits_split):
    Xa, ya = digits_split.anchor
    Xd, yd = digits_split.dummy
    frames = ClassFrames(4, 0.9).fit(Xa, ya)
    return frames, Xd, yd


def _normalised_request_mean(frames, x, label, dummies_per_class):
    """The noise-free request of query (x, label) with fixed dummies, rows divided by 2 r_c."""
    rows = []
    for j, c in enumerate(frames.classes_):
        v = x if c == label else dummies_per_class[j]
        rows.append(frames.clipped(v.reshape(1, -1), [c])[0] / (2 * frames.radii_[j]))
    return np.stack(rows)


def test_noise_is_the_discrete_gaussian_at_sqrt2_rounded_row_sensitivities(setup):
    frames, _, _ = setup
    d = frames.components_.shape[1]
    for eps in (0.5, 1.0, 4.0, 16.0):
        m = ClassRowsGaussianMechanism(eps, 1e-5, frames.radii_, d)
        s = m.noise_scale_
        np.testing.assert_allclose(m.sigmas_, s * 2 * frames.radii_)
        np.testing.assert_allclose(m.grid_, 2 * frames.radii_ / DEFAULT_GRID_STEPS)
        # in grid units: sensitivity sqrt(2) (G + sqrt d); the zCDP of the discrete Gaussian at
        # that sensitivity converts to delta, and 1 % less noise does not
        sig = m.sigmas_ / m.grid_
        assert np.allclose(sig, sig[0])  # the same noise in grid units on every row
        sens = math.sqrt(2) * row_sensitivity(d, DEFAULT_GRID_STEPS)
        assert zcdp_to_delta(sens ** 2 / (2 * sig.min() ** 2), eps) <= 1e-5
        assert zcdp_to_delta(sens ** 2 / (2 * (0.99 * sig.min()) ** 2), eps) > 1e-5
        # the price of the grid and the zCDP conversion over the continuous analytic Gaussian
        ratio = s / unit_noise_scale(eps, 1e-5)
        assert 1.0 < ratio < 1.12, ratio
        assert gaussian_privacy_profile(s, eps, math.sqrt(2)) <= 1e-5  # at least the continuous noise
    # more noise for a smaller eps, and the same s whatever the radii
    assert unit_noise_scale(1.0, 1e-5) > unit_noise_scale(4.0, 1e-5)


def test_released_rows_lie_on_the_public_grid_stated_in_the_request(setup, digits_split):
    frames, Xd, yd = setup
    Xq, yq = digits_split.query
    req, _ = PrivateKNN(frames, Xd, yd, 4.0).request(Xq[0], int(yq[0]))
    d = req.to_dict()
    assert d["noise"] == "discrete_gaussian" and len(d["grid"]) == len(frames.classes_)
    g = np.asarray(d["grid"])[:, None]
    k = np.asarray(d["rows"]) / g
    assert np.all(np.abs(k - np.rint(k)) < 1e-6)  # integer multiples of the row's step
    assert np.all(np.asarray(d["rows"]) == np.rint(k) * g)  # bit for bit: gamma * integer
    back = ClassRowsRequest.from_dict(d)
    assert back.grid == d["grid"] and back.noise == "discrete_gaussian"
    with pytest.raises(InvalidInputError, match="grid"):
        ClassRowsRequest.from_dict({**d, "grid": [1.0]})
    with pytest.raises(InvalidInputError, match="noise"):
        ClassRowsRequest.from_dict({**d, "noise": "laplace"})


def test_sensitivity_over_arbitrary_and_adversarial_query_pairs(setup, digits_split):
    """>= 1000 pairs of queries (any labels, points far outside the data, points on and just
    beyond the clip sphere, antipodal points): the normalised requests never differ by more
    than the calibrated sqrt(2)."""
    frames, Xd, yd = setup
    rng = np.random.default_rng(0)
    p = frames.n_features_in_
    classes = frames.classes_
    Xs, _ = digits_split.server
    worst = 0.0
    n_pairs = 0

    def adversarial(c):
        kind = rng.integers(5)
        j = int(frames.class_index([c])[0])
        mu, U, r = frames.means_[j], frames.components_[j], frames.radii_[j]
        u = rng.normal(size=U.shape[0])
        u /= np.linalg.norm(u)
        if kind == 0:
            return Xs[rng.integers(len(Xs))]
        if kind == 1:
            return rng.normal(size=p) * 1e6          # far outside the data
        if kind == 2:
            return mu + (u * r) @ U                  # exactly on the clip sphere
        if kind == 3:
            return mu + (u * r * (1 + 1e-9)) @ U     # just beyond it
        return mu - (u * r * 50) @ U                 # far along the frame, antipodal side

    for _ in range(1200):
        dummies = [Xd[rng.choice(np.flatnonzero(yd == c))] for c in classes]
        c1, c2 = rng.choice(classes, 2)
        x1, x2 = adversarial(c1), adversarial(c2)
        a = _normalised_request_mean(frames, x1, c1, dummies)
        b = _normalised_request_mean(frames, x2, c2, dummies)
        worst = max(worst, float(np.linalg.norm(a - b)))
        n_pairs += 1
    assert n_pairs >= 1000
    assert worst <= math.sqrt(2) * (1 + 1e-9)
    assert worst > 1.2  # the adversarial pairs do approach the bound (the test has teeth)


def test_release_refuses_rows_outside_their_ball_and_bad_parameters(setup):
    frames, _, _ = setup
    m = ClassRowsGaussianMechanism(1.0, 1e-5, frames.radii_, 4)
    rows = np.zeros((len(frames.classes_), 4))
    rows[3, 0] = frames.radii_[3] * 1.01
    with pytest.raises(InvalidInputError, match="clip"):
        m.release(rows, secure_generator(0))
    with pytest.raises(InvalidInputError):
        m.release(np.zeros((2, 4)), secure_generator(0))
    with pytest.raises(InvalidInputError):
        m.release(np.full((len(frames.classes_), 4), np.nan), secure_generator(0))
    for eps in (0, -1, float("inf"), float("nan")):
        with pytest.raises(PrivacyParameterError):
            ClassRowsGaussianMechanism(eps, 1e-5, frames.radii_, 4)
    for delta in (0, 1, -0.1):
        with pytest.raises(PrivacyParameterError):
            ClassRowsGaussianMechanism(1.0, delta, frames.radii_, 4)
    for steps in (0, 8, 2.5, 2**21):
        with pytest.raises(InvalidInputError, match="grid_steps"):
            ClassRowsGaussianMechanism(1.0, 1e-5, frames.radii_, 4, grid_steps=steps)


# --------------------------------------------------------------------------- attacks (privacy_attacks.py)
# Every attack sees only what a server sees: the request as it arrives, the frames and the public
# dummy pool (and the candidates the adversary named); it is checked blind at (nearly) infinite
# noise and its rate is printed beside the bound the release implies (module doc of privacy_attacks).

def _binomial_sd(p, n):
    return math.sqrt(p * (1 - p) / n)


@pytest.mark.slow
def test_which_row_attack_is_blind_when_the_noise_is_infinite(setup):
    frames, Xd, yd = setup
    n, C = 2000, len(frames.classes_)
    rate, _ = which_row_rate(frames, Xd, yd, 1.0, n, secure_generator(13), noise_factor=1e3)
    print(f"which-row attack at 1000 x the noise of eps 1: {rate:.3f} of {n} requests (chance {1 / C:.3f})")
    assert abs(rate - 1 / C) <= 3 * _binomial_sd(1 / C, n), rate


@pytest.mark.parametrize("eps", [1.0, 4.0, 16.0])
@pytest.mark.slow
def test_which_row_attack_stays_within_what_the_release_allows(setup, eps):
    frames, Xd, yd = setup
    n, C = 2000, len(frames.classes_)
    rate, shift = which_row_rate(frames, Xd, yd, eps, n, secure_generator(11))
    gauss, dp = which_row_gaussian_bound(shift, C), which_row_dp_bound(eps, 1e-5, C)
    print(f"which-row attack at eps {eps:g}: {rate:.3f} of {n} requests (chance {1 / C:.3f}); the release allows "
          f"{gauss:.3f} (its Gaussian, exact), (eps, delta)-DP allows {dp:.3f}")
    assert gauss <= dp
    assert rate <= gauss + 3 * _binomial_sd(gauss, n), (rate, gauss)
    if eps >= 4:  # the attack is not blind where the release says something
        assert rate > 1 / C + 3 * _binomial_sd(1 / C, n)


def test_which_row_attack_catches_a_calibration_ten_times_too_small(setup):
    frames, Xd, yd = setup
    n, C = 500, len(frames.classes_)
    rate, shift = which_row_rate(frames, Xd, yd, 1.0, n, secure_generator(12), noise_factor=0.1)
    gauss = which_row_gaussian_bound(shift, C)
    print(f"which-row attack at eps 1 with a tenth of the noise: {rate:.3f} of {n} requests (eps 1 allows {gauss:.3f})")
    assert rate > gauss + 3 * _binomial_sd(gauss, n)


@pytest.mark.parametrize("same_class", [True, False])
@pytest.mark.slow
def test_two_query_attack_is_blind_when_the_noise_is_infinite(setup, same_class):
    frames, Xd, yd = setup
    n = 1000
    rate, _ = distinguish_rate(frames, Xd, yd, 1.0, n, secure_generator(14), same_class=same_class, noise_factor=1e3)
    print(f"two-query attack ({'same' if same_class else 'different'} classes) at 1000 x the noise of eps 1: "
          f"{rate:.3f} of {n} requests (chance 0.5)")
    assert abs(rate - 0.5) <= 3 * _binomial_sd(0.5, n), rate


@pytest.mark.parametrize("eps", [1.0, 4.0, 16.0])
@pytest.mark.parametrize("same_class", [True, False])
def test_two_query_attack_stays_within_what_the_release_allows(setup, eps, same_class):
    """Given two candidate queries (same class: far apart on its clip sphere; different classes:
    each far from its class's dummies) and one request, guess which was used."""
    frames, Xd, yd = setup
    n = 1000
    rate, shift = distinguish_rate(frames, Xd, yd, eps, n, secure_generator(15), same_class=same_class)
    gauss = distinguish_gaussian_bound(shift, 1 if same_class else ROWS_CHANGED)
    dp = distinguish_dp_bound(eps, 1e-5)
    print(f"two-query attack ({'same' if same_class else 'different'} classes) at eps {eps:g}: {rate:.3f} of {n} "
          f"requests (chance 0.5); the release allows {gauss:.3f} (its Gaussian, exact), (eps, delta)-DP "
          f"allows {dp:.3f}")
    assert gauss <= dp
    assert rate <= gauss + 3 * _binomial_sd(gauss, n), (rate, gauss)
    if eps >= 4:
        assert rate > 0.5 + 3 * _binomial_sd(0.5, n)


def test_no_seed_on_the_client_api_and_seeded_requests_are_marked(setup, digits_split):
    frames, Xd, yd = setup
    for fn in (PrivateKNN.__init__, PrivateKNN.request):
        assert not [p for p in inspect.signature(fn).parameters if "seed" in p or p == "rng"]
    Xq, yq = digits_split.query
    plain, _ = PrivateKNN(frames, Xd, yd, 1.0).request(Xq[0], int(yq[0]))
    seeded, _ = PrivateKNN(frames, Xd, yd, 1.0)._inject_generator(secure_generator(0)).request(Xq[0], int(yq[0]))
    assert plain.to_dict()["seeded"] is False
    assert seeded.to_dict()["seeded"] is True
    # two unseeded clients draw different noise and dummies
    again, _ = PrivateKNN(frames, Xd, yd, 1.0).request(Xq[0], int(yq[0]))
    assert not np.allclose(plain.rows, again.rows)


def test_a_request_carries_nothing_query_dependent_but_its_noised_rows(setup, digits_split):
    frames, Xd, yd = setup
    Xq, yq = digits_split.query
    client = PrivateKNN(frames, Xd, yd, 2.0)
    a = client.request(Xq[0], int(yq[0]))[0].to_dict()
    i = int(np.flatnonzero(yq != yq[0])[0])
    b = client.request(Xq[i], int(yq[i]))[0].to_dict()
    a.pop("rows"), b.pop("rows")
    assert a == b
    assert ClassRowsRequest.from_dict(client.request(Xq[0], int(yq[0]))[0].to_dict()).n_rows == len(frames.classes_)


def test_label_free_client_uses_its_classifier(setup, digits_split):
    frames, Xd, yd = setup
    Xq, yq = digits_split.query

    class Fixed:
        def predict(self, X):
            return np.array([int(frames.classes_[2])] * len(X))

    _, secret = PrivateKNN(frames, Xd, yd, 1.0, classifier=Fixed()).request(Xq[0])
    assert secret.real_row == 2 and secret.predicted
    with pytest.raises(InvalidInputError, match="classifier"):
        PrivateKNN(frames, Xd, yd, 1.0).request(Xq[0])
    with pytest.raises(InvalidInputError, match="not a class"):
        PrivateKNN(frames, Xd, yd, 1.0).request(Xq[0], 99)
    with pytest.raises(InvalidInputError, match="features"):
        PrivateKNN(frames, Xd, yd, 1.0).request(Xq[0][:10], int(yq[0]))
    with pytest.raises(InvalidInputError):
        PrivateKNN(frames, Xd, yd, 1.0).request(np.full(Xq.shape[1], np.nan), int(yq[0]))


def test_frames_are_a_function_of_public_data_and_round_trip(setup, digits_split):
    frames, _, _ = setup
    Xa, ya = digits_split.anchor
    again = ClassFrames(4, 0.9).fit(Xa, ya)
    np.testing.assert_allclose(again.components_, frames.components_)
    back = ClassFrames.from_dict(frames.to_dict())
    np.testing.assert_allclose(back.radii_, frames.radii_)
    from pm_vector.client.query import frames_digest
    assert frames_digest(back) == frames_digest(frames)
