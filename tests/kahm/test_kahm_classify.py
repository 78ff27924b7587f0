"""Classifiers (Defs 7-8, 12, 15), federated rule (eqs 101-104, Remark 5), membership score
(eq 69), persistence, bad input, and the plugin functions."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import train_test_split

from pm_vector.errors import InvalidInputError, PrivacyParameterError
from pm_vector.kahm import (KAHM, DeepKAHM, FabricatedKAHMClassifier, KAHMClassifier, NoisyKAHMClassifier, WideKAHM,
                            fabricate_anchor, federated_predict, fit_class_models, global_kahm_image, load_model,
                            lsdd, matching_scores, membership_audit, membership_auc, party_distances)


@pytest.fixture(scope="module")
def digits_split():
    b = load_digits()
    X, y = b.data / 16.0, b.target
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, stratify=y, random_state=0)
    return Xtr, Xte, ytr, yte


@pytest.fixture(scope="module")
def digits_model(digits_split):
    Xtr, Xte, ytr, yte = digits_split
    return KAHMClassifier(10, 3).fit(Xtr, ytr)


def test_classifier_accuracy_and_matching_scores(digits_split, digits_model):
    Xtr, Xte, ytr, yte = digits_split
    m = digits_model
    assert m.score(Xte, yte) > 0.95
    D = m.class_distances(Xte[:20])
    assert D.shape == (20, 10) and np.all(D >= 0)
    np.testing.assert_array_equal(m.predict(Xte[:20]), m.classes_[D.argmin(1)])
    S = m.class_scores(Xte[:20])
    np.testing.assert_allclose(S, np.exp(-D ** 2 / (D ** 2).sum(1, keepdims=True)))      # eq 63
    np.testing.assert_array_equal(S.argmax(1), D.argmin(1))
    assert np.all((S > 0) & (S <= 1))
    np.testing.assert_allclose(m.min_distance(Xte[:20]), D.min(1))
    assert matching_scores(np.array([[1.0, np.inf]]))[0, 1] == 0.0
    # estimator conventions
    assert clone(m).get_params()["n_components"] == 10
    with pytest.raises(NotFittedError):
        KAHMClassifier().predict(Xte)


def test_persistence_round_trip(tmp_path, digits_split, digits_model):
    Xtr, Xte, ytr, yte = digits_split
    path = tmp_path / "m.pt"
    digits_model.save(path)
    back = KAHMClassifier.load(path)
    np.testing.assert_array_equal(back.classes_, digits_model.classes_)
    np.testing.assert_allclose(back.class_distances(Xte[:50]), digits_model.class_distances(Xte[:50]), rtol=1e-12)
    assert back.get_params() == digits_model.get_params()
    assert isinstance(load_model(path), KAHMClassifier)
    with pytest.raises(InvalidInputError, match="holds"):
        KAHM.load(path)
    for cls, kw in ((KAHM, dict(n_components=4)), (DeepKAHM, dict(n_components=4, n_layers=2)),
                    (WideKAHM, dict(n_components=4, n_layers=2, branch_size=60))):
        m = cls(**kw).fit(Xtr[:150])
        p = tmp_path / f"{cls.__name__}.pt"
        m.save(p)
        r = load_model(p)
        assert type(r) is cls
        np.testing.assert_allclose(r.distance(Xte[:30]), m.distance(Xte[:30]), rtol=1e-12)
        np.testing.assert_allclose(r.predict(Xte[:30]), m.predict(Xte[:30]), rtol=1e-12)
    # a file that is not a model, and a pickled object, are refused
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a model")
    with pytest.raises(InvalidInputError):
        load_model(bad)
    import fractions
    import torch
    torch.save({"format": "pm_vector.kahm", "version": "1", "payload": fractions.Fraction(1, 3)}, bad)
    with pytest.raises(InvalidInputError, match="not a pm_vector KAHM model"):
        load_model(bad)


def test_bad_input_gives_clear_errors():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 6))
    # too few points for the subspace dimension
    with pytest.raises(InvalidInputError, match="needs at least n\\+1"):
        KAHM(5).fit(X[:4])
    # n larger than p
    with pytest.raises(InvalidInputError, match="1 <= n <= p"):
        KAHM(7).fit(X)
    # constant features: all rows identical / too few varying directions
    with pytest.raises(InvalidInputError, match="zero variance"):
        KAHM(2).fit(np.ones((30, 6)))
    Xc = np.zeros((30, 6))
    Xc[:, :2] = rng.normal(size=(30, 2))
    with pytest.raises(InvalidInputError, match="varies in only 2"):
        KAHM(3).fit(Xc)
    assert np.all(np.isfinite(KAHM(2).fit(Xc).distance(Xc)))        # fine at n <= rank
    # NaN input
    Xn = X.copy()
    Xn[3, 2] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        KAHM(2).fit(Xn)
    # a class with one sample
    y = np.repeat([0, 1], 20)
    y[-1] = 2
    with pytest.raises(InvalidInputError, match="class 2 has 1 sample"):
        KAHMClassifier(3, 2).fit(X, y)
    # dimension mismatch at predict time
    m = KAHMClassifier(3, 2).fit(X, np.repeat([0, 1], 20))
    with pytest.raises(InvalidInputError, match="5 features but"):
        m.predict(X[:, :5])
    # bad hyper-parameters are caught in fit
    with pytest.raises(InvalidInputError, match="n_layers"):
        KAHMClassifier(3, 4).fit(X, np.repeat([0, 1], 20))
    with pytest.raises(PrivacyParameterError):
        NoisyKAHMClassifier(epsilon=0, n_components=3, n_layers=2).fit(X, np.repeat([0, 1], 20))


def test_federated_scenario1_equals_centralised_and_remark5(digits_split):
    Xtr, Xte, ytr, yte = digits_split
    central = KAHMClassifier(8, 2).fit(Xtr, ytr)
    # Scenario 1: every class sits in exactly one party (here 3 parties)
    groups = [(0, 1, 2), (3, 4, 5, 6), (7, 8, 9)]
    parties = [KAHMClassifier(8, 2).fit(Xtr[np.isin(ytr, g)], ytr[np.isin(ytr, g)]) for g in groups]
    pred, cls, D = federated_predict(parties, Xte, return_distances=True)
    np.testing.assert_array_equal(pred, central.predict(Xte))
    np.testing.assert_allclose(D, central.class_distances(Xte), rtol=1e-10)
    # the rule needs only the distances the parties send
    sent = [party_distances(p, Xte) for p in parties]
    np.testing.assert_array_equal(federated_predict(sent), pred)
    # Remark 5: classes a party lacks count as infinitely far; a class nobody holds never wins
    pred2, cls2, D2 = federated_predict(sent, classes=range(11), return_distances=True)
    assert np.all(np.isinf(D2[:, 10])) and np.all(pred2 == pred)
    # Scenario 2 flavour: two parties share a class -> min over parties
    half = ytr == 0
    idx0 = np.flatnonzero(half)
    a = KAHMClassifier(8, 2).fit(Xtr[idx0[: len(idx0) // 2]], ytr[idx0[: len(idx0) // 2]])
    b = KAHMClassifier(8, 2).fit(Xtr[idx0[len(idx0) // 2:]], ytr[idx0[len(idx0) // 2:]])
    _, _, Dab = federated_predict([a, b], Xte[:10], return_distances=True)
    np.testing.assert_allclose(Dab[:, 0], np.minimum(a.class_distances(Xte[:10])[:, 0],
                                                     b.class_distances(Xte[:10])[:, 0]))
    # mismatched dimensions between parties
    other = KAHMClassifier(8, 2).fit(Xtr[:, :40], ytr)
    with pytest.raises(InvalidInputError, match="disagree on the data dimension"):
        federated_predict([parties[0], other], Xte)
    with pytest.raises(InvalidInputError, match="queries have 40 features"):
        federated_predict(parties, Xte[:, :40])
    with pytest.raises(InvalidInputError, match="expected"):
        federated_predict([{0: np.ones(3)}, {1: np.ones(4)}])
    # global KAHM (eqs 101-102)
    w1 = WideKAHM(6, 2).fit(Xtr[ytr == 1])
    w2 = WideKAHM(6, 2).fit(Xtr[ytr == 2])
    img, dist, q = global_kahm_image([w1, w2], Xte[:20])
    np.testing.assert_allclose(dist, np.minimum(w1.distance(Xte[:20]), w2.distance(Xte[:20])))
    with pytest.raises(InvalidInputError):
        global_kahm_image([w1, WideKAHM(6, 2).fit(Xtr[ytr == 2][:, :30])], Xte[:5])


def test_lsdd_estimates_the_l2_distance_between_densities():
    rng = np.random.default_rng(0)
    for mu in (0.0, 1.0, 2.0):
        true = (1 / np.sqrt(np.pi)) * (1 - np.exp(-mu ** 2 / 4))
        est = lsdd(rng.normal(size=1500), rng.normal(mu, size=1500))
        assert abs(est - true) < 0.02 + 0.1 * true
    assert membership_auc([0.1, 0.2], [0.3, 0.4]) == 1.0
    with pytest.raises(InvalidInputError):
        lsdd([1.0], [1.0, 2.0])


def test_private_classifiers_and_audit_on_digits(tmp_path, digits_split):
    Xtr, Xte, ytr, yte = digits_split
    kw = dict(epsilon=16.0, n_components=10, n_layers=3, noise_seed=5)
    m12 = NoisyKAHMClassifier(**kw).fit(Xtr, ytr)
    m15 = FabricatedKAHMClassifier(**kw, smoothing_steps=None).fit(Xtr, ytr)  # the paper's rule (opt-in)
    a12, a15 = m12.score(Xte, yte), m15.score(Xte, yte)
    assert a12 > 0.8 and a15 > 0.8
    assert all(s["met_rule"] for subs in m15.fabrication_.values() for s in subs)
    audit = membership_audit(m12, m15, Xtr, Xte)
    assert set(audit) >= {"mis_raw", "mis_fab", "mis_reduction", "auc_raw", "auc_fab"}
    assert audit["mis_fab"] < audit["mis_raw"]
    p = tmp_path / "fab.pt"
    m15.save(p)
    back = load_model(p)
    assert isinstance(back, FabricatedKAHMClassifier)
    # only what is public is saved: the stopping rule's r, the steps it took, its errors and warning
    # text all depend on the original rows (issue #11)
    assert back.fabrication_ == {c: [{"size": sub["size"]} for sub in subs] for c, subs in m15.fabrication_.items()}
    assert back.privacy_["unit"] == "element" and back.privacy_["grid"] == 2.0 ** -8
    assert "threshold r" in back.privacy_["outside_guarantee"]
    np.testing.assert_array_equal(back.predict(Xte[:30]), m15.predict(Xte[:30]))


def test_fabricated_default_runs_fixed_public_steps():
    """The library's Definition 15 default is the database jobs' fixed public step count (one
    constant), so the model is a function of the noisy rows only; the stopping rule, whose
    threshold comes from the raw rows, runs only when asked for."""
    import pm_vector.db.kahm.roles as dbk
    from pm_vector.defaults import DEFAULT_SMOOTHING_STEPS
    from sklearn.datasets import load_digits

    assert dbk.DEFAULT_SMOOTHING_STEPS is DEFAULT_SMOOTHING_STEPS
    assert FabricatedKAHMClassifier().smoothing_steps == DEFAULT_SMOOTHING_STEPS
    b = load_digits()
    X, y = b.data[:200] / 16.0, b.target[:200]
    kw = dict(epsilon=4.0, n_components=5, n_layers=1, noise_seed=3)
    m = FabricatedKAHMClassifier(**kw).fit(X, y)
    subs = [s for v in m.fabrication_.values() for s in v]
    assert subs and all(s["r"] is None and s["met_rule"] is None for s in subs)
    assert all(s["M_tilde"] == DEFAULT_SMOOTHING_STEPS + 1 for s in subs)
    assert "threshold r" not in m.privacy_["outside_guarantee"]
    assert "NOT a private release" in m.privacy_["randomness"]  # a test seed says so in the record
    rule = FabricatedKAHMClassifier(**kw, smoothing_steps=None).fit(X, y)
    assert all(s["r"] is not None for v in rule.fabrication_.values() for s in v)
    assert "threshold r" in rule.privacy_["outside_guarantee"]
    with pytest.raises(InvalidInputError, match="smoothing_steps=None"):
        FabricatedKAHMClassifier(**kw, r=1.0).fit(X, y)


def test_plugin_functions(digits_split):
    Xtr, Xte, ytr, yte = digits_split
    Xf, yf = fabricate_anchor(Xtr, ytr, epsilon=8.0, n=10, seed=0, unit="element")
    assert Xf.shape == Xtr.shape and np.array_equal(np.sort(yf), np.sort(ytr))
    assert not np.allclose(Xf, Xtr[np.argsort(ytr, kind="stable")])
    model = fit_class_models(Xf, yf, n_components=10, n_layers=3)
    S = model.class_scores(Xte)
    assert S.shape == (len(Xte), 10)
    assert (model.classes_[S.argmax(1)] == yte).mean() > 0.8
    with pytest.raises(InvalidInputError, match="class"):
        fabricate_anchor(Xtr[:30], np.arange(30) % 10, epsilon=1.0, n=10)
