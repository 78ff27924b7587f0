import json

import numpy as np
import pytest

from pm_vector.client import PrivateMail, PrivateMailRequest, PublicAnchor
from pm_vector.errors import (AlignmentError, BudgetExceededError, DomainError, InvalidInputError,
                              PrivacyParameterError)
from pm_vector.manifold import AnchorFrame
from pm_vector.privacy import PrivacyAccountant
from pm_vector.alignment import align_request
from pm_vector.neighbors import knn_search


@pytest.fixture(autouse=True)
def _own_ledger(tmp_path, monkeypatch):
    """Unseeded requests charge the default ledger: keep it in this test's directory."""
    monkeypatch.setenv("PM_VECTOR_HOME", str(tmp_path))
    monkeypatch.delenv("PM_VECTOR_EPSILON_BUDGET", raising=False)
    monkeypatch.delenv("PM_VECTOR_DELTA_BUDGET", raising=False)


@pytest.fixture(scope="module")
def small(digits_split):
    """A small anchor (6 per class) so hundreds of requests stay fast."""
    Xa, ya = digits_split.anchor
    keep = np.concatenate([np.flatnonzero(ya == c)[:6] for c in range(10)])
    Xd, yd = digits_split.dummy
    anchor = PublicAnchor([f"a{i}" for i in keep], Xa[keep], ya[keep], Xd, yd)
    frame = AnchorFrame(4, seed=0).fit(Xa[keep], ya[keep])
    return frame, anchor


def test_request_layout_and_secret(small, digits_split):
    frame, anchor = small
    Xq, yq = digits_split.query
    req, secret = PrivateMail(frame, epsilon=1.0, _rng=1).request(Xq[0], yq[0], anchor, collection="digits")
    assert req.n_query_rows == 10 and req.embedding.shape == (10 + 60, 4)
    assert req.anchor_ids == anchor.ids
    assert sorted(secret.row_labels) == list(range(10))  # one row per class, whatever the real class
    assert secret.row_labels[secret.real_row] == yq[0]
    assert req.sensitivity > 0 and req.noise_sigma > req.sensitivity  # eps = 1, delta = 1e-5
    # the noise actually added by the mechanism is recorded, and only released data is present
    d = req.to_dict()
    assert set(d) >= {"anchor_ids", "embedding", "epsilon", "delta", "noise_sigma", "params"}
    assert "real_row" not in json.dumps(d) and "label" not in d


def test_request_json_round_trip(small, digits_split):
    frame, anchor = small
    Xq, yq = digits_split.query
    req, _ = PrivateMail(frame, epsilon=0.5, _rng=2).request(Xq[1], yq[1], anchor)
    back = PrivateMailRequest.from_json(req.to_json())
    np.testing.assert_array_equal(back.embedding, req.embedding)
    assert back.anchor_ids == req.anchor_ids and back.epsilon == 0.5 and back.params == req.params
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        PrivateMailRequest.from_json("{bad")
    with pytest.raises(InvalidInputError, match="missing"):
        PrivateMailRequest.from_json('{"embedding": [[1.0]]}')
    d = req.to_dict()
    d["embedding"] = d["embedding"][:-1]
    with pytest.raises(InvalidInputError, match="rows"):
        PrivateMailRequest.from_dict(d)


def test_same_seed_same_request_and_default_is_not_reproducible(small, digits_split):
    frame, anchor = small
    Xq, yq = digits_split.query
    a, _ = PrivateMail(frame, epsilon=1.0, _rng=5).request(Xq[2], yq[2], anchor)
    b, _ = PrivateMail(frame, epsilon=1.0, _rng=5).request(Xq[2], yq[2], anchor)
    c, _ = PrivateMail(frame, epsilon=1.0).request(Xq[2], yq[2], anchor)
    d, _ = PrivateMail(frame, epsilon=1.0).request(Xq[2], yq[2], anchor)
    np.testing.assert_array_equal(a.embedding, b.embedding)
    assert not np.array_equal(c.embedding, d.embedding)


class _NoisierPrivateMail(PrivateMail):
    """The same protocol with ``factor`` times the calibrated noise (the blindness check)."""

    factor = 1.0

    def _mechanism(self, sensitivity):
        mech = super()._mechanism(sensitivity)
        mech.sigma *= self.factor
        return mech


def _attack_rates(frame, anchor, Xq, yq, eps, n=250, noise_factor=1.0):
    """Three attacks that try to name the real row from what the server sees (the request and
    the public anchor and frame; never the secret); each returns its success rate."""
    client = type("M", (_NoisierPrivateMail,), {"factor": noise_factor})(frame, epsilon=eps, _rng=123)
    E = frame.anchor_embedding_
    classes = list(frame.classes_)
    centroids = np.stack([E[anchor.labels == c].mean(0) for c in classes])
    hits = np.zeros(3)
    for i in range(n):
        j = i % len(yq)
        req, secret = client.request(Xq[j], yq[j], anchor)
        req = PrivateMailRequest.from_json(req.to_json())  # what the server receives
        rows = req.query_rows
        # each row's label as the server reads it: the nearest class centroid of the public frame
        to_centroid = np.linalg.norm(rows[:, None] - centroids[None], axis=-1)
        guesses = [
            0,  # position: the real row is always first
            int(np.argmax(np.min(np.linalg.norm(rows[:, None] - req.anchor_rows[None], axis=-1), axis=1))),
            # duplication: the row least like any anchor row is not a public item
            int(np.argmax(to_centroid.min(1))),
            # atypicality: the row farthest from the centroid of its (read) class
        ]
        hits += [g == secret.real_row for g in guesses]
    return hits / n


@pytest.mark.parametrize("eps", [1.0, 1e6])
@pytest.mark.slow
def test_the_real_row_cannot_be_picked_out(small, digits_split, eps):
    from pm_vector.client.privatemail import paper_protocol_guarantee

    frame, anchor = small
    Xq, yq = digits_split.query
    n = 250
    rates = _attack_rates(frame, anchor, Xq, yq, eps, n)
    # the attacks are blind when the release is pure noise (checked once: it does not depend on eps)
    blind = _attack_rates(frame, anchor, Xq, yq, eps, n, noise_factor=1e6) if eps == 1.0 else np.full(3, 0.1)
    real_eps = paper_protocol_guarantee(eps, 1e-5, same_class=False)[0]
    bound = (np.exp(min(real_eps, 700.0)) + 9e-5) / (9 + np.exp(min(real_eps, 700.0)))
    print(f"paper protocol at eps {eps:g}: which-row rates {np.round(rates, 3)} (chance 0.1), with 1e6 x the "
          f"noise {np.round(blind, 3) if eps == 1.0 else '(not run)'}; its (eps, delta) between real queries, "
          f"({real_eps:.3g}, 1e-5), allows {bound:.3f}")
    # 1/C within 3 binomial standard deviations
    assert (np.abs(blind - 0.1) <= 3 * np.sqrt(0.09 / n)).all(), blind
    # chance is 1/10; 250 trials: sd 0.019, so 0.19 is > 4.5 sd above chance
    assert (rates < 0.19).all(), rates
    assert (rates <= bound + 3 * np.sqrt(0.25 / n)).all()


def test_paper_protocol_guarantee_between_real_queries():
    """Two real queries of the same class are two null-record steps apart, of different classes
    four; the Gaussian's exact profile at 2 Delta / 4 Delta gives the (eps, delta)."""
    from scipy.stats import norm

    from pm_vector.client.privatemail import paper_protocol_guarantee
    from pm_vector.privacy import AnalyticGaussianMechanism

    def profile(sigma, eps, D):  # Balle & Wang (2018), Thm 8, written out directly
        return norm.cdf(D / (2 * sigma) - eps * sigma / D) - np.exp(eps) * norm.cdf(-D / (2 * sigma) - eps * sigma / D)

    same, d1 = paper_protocol_guarantee(1.0, 1e-5, same_class=True)
    diff, d2 = paper_protocol_guarantee(1.0, 1e-5, same_class=False)
    assert d1 == d2 == 1e-5
    assert same == pytest.approx(2.15, abs=0.01) and diff == pytest.approx(4.75, abs=0.01)
    for eps in (0.1, 1.0, 4.0):
        sigma = AnalyticGaussianMechanism(eps, 1e-5, 1.0).sigma
        for same_class, k in ((True, 2.0), (False, 4.0)):
            e = paper_protocol_guarantee(eps, 1e-5, same_class=same_class)[0]
            assert profile(sigma, e, k) <= 1e-5 * (1 + 1e-9)       # it holds at k Delta
            assert profile(sigma, 0.999 * e, k) > 1e-5               # and is the smallest that does
            assert k / 2 * eps < e                                   # worse than the nominal eps
    # the classical calibration (eps < 1) has its own sigma; the relation is the same
    c = paper_protocol_guarantee(0.5, 1e-5, same_class=False, mechanism="classical")[0]
    assert 0.5 < c < paper_protocol_guarantee(0.5, 1e-5, same_class=False)[0]
    with pytest.raises(InvalidInputError):
        paper_protocol_guarantee(1.0, 1e-5, same_class=True, mechanism="laplace")


def test_bad_input_gets_clear_errors(small, digits_split):
    frame, anchor = small
    Xq, yq = digits_split.query
    pm = PrivateMail(frame, epsilon=1.0, _rng=0)
    q = Xq[0].copy()
    q[5] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        pm.request(q, yq[0], anchor)
    with pytest.raises(InvalidInputError, match="features"):
        pm.request(Xq[0][:10], yq[0], anchor)
    with pytest.raises(InvalidInputError, match="not one of"):
        pm.request(Xq[0], 42, anchor)
    with pytest.raises(InvalidInputError, match="zero row"):
        pm.request(np.zeros_like(Xq[0]), yq[0], anchor)
    no_three = PublicAnchor(anchor.ids, anchor.features, anchor.labels,
                            anchor.dummy_features[anchor.dummy_labels != 3], anchor.dummy_labels[anchor.dummy_labels != 3])
    with pytest.raises(InvalidInputError, match="class 3 has no item in the public dummy pool"):
        pm.request(Xq[0], 0, no_three)
    with pytest.raises(InvalidInputError, match="unit-norm"):
        PublicAnchor(anchor.ids, anchor.features * 2, anchor.labels, anchor.dummy_features, anchor.dummy_labels)
    for eps in (0.0, -1.0, float("nan")):
        with pytest.raises(PrivacyParameterError):
            PrivateMail(frame, epsilon=eps, _rng=0).request(Xq[0], yq[0], anchor)
    for delta in (0.0, 1.0, 2.0):
        with pytest.raises(PrivacyParameterError):
            PrivateMail(frame, epsilon=1.0, delta=delta, _rng=0).request(Xq[0], yq[0], anchor)
    with pytest.raises(DomainError):  # sigma outside the domain of the appendix-B bound
        PrivateMail(frame, epsilon=1.0, dp_sigma=0.3, _rng=0).request(Xq[0], yq[0], anchor)
    with pytest.raises(PrivacyParameterError, match="Analytic"):
        PrivateMail(frame, epsilon=2.0, mechanism="classical", _rng=0).request(Xq[0], yq[0], anchor)


def test_budget_is_checked_before_anything_is_released(small, digits_split):
    frame, anchor = small
    Xq, yq = digits_split.query
    from pm_vector.client.privatemail import paper_charge, paper_protocol_guarantee

    acc = PrivacyAccountant(epsilon_budget=6.0, delta_budget=1e-3)
    pm = PrivateMail(frame, epsilon=1.0, _rng=0, accountant=acc)
    pm.request(Xq[0], yq[0], anchor)
    with pytest.raises(BudgetExceededError):
        pm.request(Xq[1], yq[1], anchor)
    # charged what it costs between two real queries whose class may change (4.75 at nominal eps 1), not 1
    assert acc.total() == pytest.approx(paper_charge(1.0, 1e-5))
    assert paper_charge(1.0, 1e-5) == paper_protocol_guarantee(1.0, 1e-5, same_class=False)
    assert 4.7 < acc.total()[0] < 4.8


def test_out_of_bounds_parameters_are_refused_before_the_budget_is_charged(small, digits_split):
    frame, anchor = small
    Xq, yq = digits_split.query
    acc = PrivacyAccountant(epsilon_budget=10.0, delta_budget=1e-3)
    for kw in ({"epsilon": 1e-4}, {"epsilon": 1.0, "delta": 1e-320}, {"epsilon": 4.0, "mechanism": "classical"}):
        with pytest.raises((InvalidInputError, PrivacyParameterError)):
            PrivateMail(frame, _rng=0, accountant=acc, **kw).request(Xq[0], yq[0], anchor)
    assert len(acc) == 0  # nothing charged for a request that was never released


def test_unseeded_requests_charge_the_default_ledger_and_stop_at_the_default_budget(small, digits_split, tmp_path):
    """No accountant is not unlimited: the default ledger (default budget eps 10) is charged
    before the noise is drawn, for PrivateMail and its release-only (paper) variant alike."""
    from pm_vector.client.budget import PrivacyBudget
    from pm_vector.client.release import ReleaseOnlyPrivateMail

    frame, anchor = small
    Xq, yq = digits_split.query
    from pm_vector.client.privatemail import paper_charge

    PrivateMail(frame, epsilon=1.0).request(Xq[0], yq[0], anchor, collection="digits")
    ReleaseOnlyPrivateMail(frame, epsilon=1.0).request_release(Xq[1], yq[1], anchor, collection="fashion")
    st = PrivacyBudget().status("local")  # one key for every collection: the caller's, not the server's
    assert st["releases"] == 2 and st["epsilon_budget"] == 10.0
    assert st["epsilon_spent"] == pytest.approx(2 * paper_charge(1.0, 1e-5)[0])  # 2 x 4.75 of 10
    assert PrivacyBudget().path.is_relative_to(tmp_path)
    with pytest.raises(BudgetExceededError):
        PrivateMail(frame, epsilon=1.0).request(Xq[2], yq[2], anchor, collection="another")
    assert PrivacyBudget().status("local")["releases"] == 2  # the refused one recorded nothing
    # a seeded request (tests, benchmarks: not a private release) is not charged
    PrivateMail(frame, epsilon=4.0, _rng=0).request(Xq[2], yq[2], anchor, collection="digits")
    assert PrivacyBudget().status("local")["releases"] == 2 and PrivacyBudget().keys() == ["local"]


def test_resolution_aligns_and_refuses_mismatches(small, digits_split):
    frame, anchor = small
    Xq, yq = digits_split.query
    Xs, ys = digits_split.server
    items = frame.extend(Xs, ys)
    req, secret = PrivateMail(frame, epsilon=1.0, _rng=3).request(Xq[0], yq[0], anchor)
    aligned = align_request(req, anchor.ids, frame.anchor_embedding_)
    idx = knn_search(aligned, items, 8)
    dist = np.linalg.norm(items[idx] - aligned[:, None, :], axis=2)
    assert idx.shape == (10, 8) and (np.diff(dist, axis=1) >= -1e-12).all()
    # a client in a rotated/scaled frame is mapped back by Kabsch-Umeyama
    from scipy.stats import special_ortho_group
    R = special_ortho_group.rvs(4, random_state=0)
    moved = PrivateMailRequest(**{**req.__dict__, "embedding": 3 * req.embedding @ R.T + 1.0})
    np.testing.assert_allclose(align_request(moved, anchor.ids, frame.anchor_embedding_), aligned, atol=1e-8)
    with pytest.raises(InvalidInputError, match="anchor ids"):
        align_request(req, anchor.ids[::-1], frame.anchor_embedding_)
    with pytest.raises(InvalidInputError, match="dimension"):
        align_request(req, anchor.ids, frame.anchor_embedding_[:, :3])
    broken = PrivateMailRequest(**{**req.__dict__, "embedding": np.random.default_rng(0).standard_normal(req.embedding.shape)})
    with pytest.raises(AlignmentError, match="anchor frame"):
        align_request(broken, anchor.ids, frame.anchor_embedding_)


def test_private_query_retrieves_its_class_on_digits(digits_split, frame, public_anchor):
    """End to end in memory: the real row's neighbours share its class far above chance."""
    Xs, ys = digits_split.server
    Xq, yq = digits_split.query
    items = frame.extend(Xs, ys)
    pm = PrivateMail(frame, epsilon=1.0, _rng=9)
    prec = []
    for i in range(30):
        req, secret = pm.request(Xq[i], yq[i], public_anchor)
        idx = knn_search(align_request(req, public_anchor.ids, frame.anchor_embedding_), items, 8)
        prec.append((ys[secret.pick(idx)] == yq[i]).mean())
    assert np.mean(prec) > 0.6  # chance is 0.1
