"""``pm-vector kahm ...`` on a real embedded server: fit/models/classify/new items, the DP anchor
(+ embedding), federation, the membership audit, and bad input (clear message, exit != 0, no traceback).

On the session's embedded server (``pm_home``, tests/conftest.py), shared with tests/db and
tests/service.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
from typer.testing import CliRunner

from pm_vector.cli import app

runner = CliRunner()
N_COMP = ["--n-components", "8"]


@pytest.fixture(scope="module")
def home(pm_home):
    """The session's embedded server (tests/conftest.py)."""
    return str(pm_home)


@pytest.fixture(scope="module")
def digits():
    from pm_vector.datasets import load_dataset

    ds = load_dataset("digits", max_items=420, seed=0)
    return ds.features.astype(np.float32), ds.labels.astype(np.int64), [int(c) for c in ds.classes]


@pytest.fixture
def coll(home, digits):
    """A digits collection of 300 items (features in [0, 1], 10 classes), dropped afterwards."""
    import pm_vector.db as db

    X, y, classes = digits
    name = "kcli_" + uuid.uuid4().hex[:8]
    db.create_collection(name, X.shape[1], classes)
    db.ingest(name, X[:300], y[:300])
    yield name
    db.drop_collection(name, missing_ok=True)


def _ok(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return r


def _json(args):
    return json.loads(_ok(args).stdout)


def _refused(args, fragment, code=2):
    r = runner.invoke(app, args)
    assert r.exit_code == code, (r.exit_code, r.output)
    assert fragment.lower() in " ".join(r.output.split()).lower(), r.output  # rich wraps long lines
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)  # no crash
    return r


def test_fit_models_classify_and_new_items(coll, digits, tmp_path):
    from pm_vector.db.kahm import roles as kahm

    X, y, _ = digits
    fit = _json(["kahm", "fit", coll, *N_COMP, "--no-progress", "--json"])
    assert fit["collection"] == coll and fit["kind"] == "raw" and fit["n_items"] == 300
    assert fit["n_scored_items"] == 300 and fit["is_current"] and fit["training_accuracy"] > 0.9
    assert fit["params"]["n_components"] == 8 and fit["privacy"]["unit"] == "none"
    listed = _json(["kahm", "models", coll, "--json"])["models"]
    assert [m["model_id"] for m in listed] == [fit["model_id"]] and listed[0]["is_current"]
    assert any(m["model_id"] == fit["model_id"] for m in _json(["kahm", "models", "--json"])["models"])
    r = _ok(["kahm", "models", coll])
    assert "KAHM models" in r.stdout and "raw" in r.stdout

    # classify: the CLI's JSON is pm_vector.db.kahm.roles.class_scores, arrays as lists
    q = tmp_path / "q.npy"
    np.save(q, X[300:320])
    got = _json(["kahm", "classify", coll, "--features", str(q), "--json"])
    ref = kahm.class_scores(coll, X[300:320])
    assert got["model_id"] == ref["model_id"] == fit["model_id"] and got["classes"] == ref["classes"]
    assert got["predicted"] == ref["predicted"].tolist()
    np.testing.assert_allclose(np.asarray(got["scores"]), ref["scores"], rtol=1e-12)
    np.testing.assert_allclose(np.asarray(got["distances"], dtype=float), ref["distances"], rtol=1e-12)
    assert np.mean(np.asarray(got["predicted"]) == y[300:320]) > 0.6
    np.save(q, X[300])  # one row as a 1-D array
    assert len(_json(["kahm", "classify", coll, "--features", str(q), "--json"])["predicted"]) == 1
    r = _ok(["kahm", "classify", coll, "--features", str(q)])
    assert "predicted" in r.stdout

    # new items: scored with the current model, no new fit
    import pm_vector.db as db

    db.ingest(coll, X[300:320], y[300:320])
    assert _json(["kahm", "fit", coll, "--new-items", "--json"]) == {"model_id": fit["model_id"], "scored": 20}
    assert _json(["kahm", "fit", coll, "--new-items", "--json"])["scored"] == 0
    assert _json(["kahm", "models", coll, "--json"])["models"][0]["n_scored_items"] == 320
    _refused(["kahm", "fit", coll, "--new-items", "--kind", "noisy"], "--kind applies to a new fit only")


def test_bad_input_is_refused_clearly(coll, tmp_path):
    _refused(["kahm", "fit", coll, "--kind", "noisy", "--epsilon", "1"], "value_range=(lo, hi) is required")
    _refused(["kahm", "fit", coll, "--kind", "fabricated"], "give epsilon")
    _refused(["kahm", "fit", coll, "--value-range", "0,1"], "for the private kinds")
    _refused(["kahm", "fit", coll, "--kind", "secret"], "--kind must be one of")
    _refused(["kahm", "fit", coll, "--n-components", "99"], "exceeds")
    _refused(["kahm", "fit", "no_such_collection_k"], "unknown collection")
    _refused(["kahm", "anchor", coll, "--epsilon", "1", "--unit", "element"], "value_range=(lo, hi) is required")
    _refused(["kahm", "anchor", coll, "--epsilon", "1", "--unit", "pixel"], "unit must be one of")
    _refused(["kahm", "anchor", coll, "--epsilon", "1", "--clip-norm", "0"], "clip_norm")
    _refused(["kahm", "fit", coll, "--stopping-rule"], "for --kind fabricated")
    _refused(["kahm", "anchor", coll, "--epsilon", "1", "--value-range", "1"], "two numbers")
    _refused(["kahm", "anchor", coll, "--epsilon", "-1", "--value-range", "0,1"], "epsilon")
    _refused(["kahm", "anchor", "no_such_collection_k", "--epsilon", "1", "--value-range", "0,1"],
             "unknown collection")
    _refused(["kahm", "audit", coll, "--epsilon", "1"], "value_range=(lo, hi) is required")
    _refused(["kahm", "models", "no_such_collection_k"], "unknown collection")
    q = tmp_path / "q.npy"
    _refused(["kahm", "classify", coll, "--features", str(q)], "no such file")
    np.save(q, np.zeros((2, 64)))
    _refused(["kahm", "classify", coll, "--features", str(q)], "no KAHM model")
    _refused(["kahm", "fit", coll, "--new-items"], "no KAHM model")
    _fit = _json(["kahm", "fit", coll, "--n-components", "4", "--no-progress", "--json"])
    np.save(q, np.zeros((2, 5)))
    _refused(["kahm", "classify", coll, "--features", str(q)], "5 features per row")
    np.save(q, np.full((2, 64), np.nan))
    _refused(["kahm", "classify", coll, "--features", str(q)], "NaN")
    assert _json(["kahm", "models", coll, "--json"])["models"][0]["model_id"] == _fit["model_id"]


def test_anchor_registers_sets_with_provenance_and_embeds(coll):
    import pm_vector.db as db

    res = _json(["kahm", "anchor", coll, "--epsilon", "2", "--unit", "element", "--value-range", "0,1",
                 "--anchors-per-class", "10",
                 "--dummies-per-class", "3", "--n-components", "5", "--smoothing-steps", "3", "--noise-seed", "0",
                 "--embed", "--json", "--no-progress"])
    a, d = db.get_anchor_set(coll), db.get_anchor_set(coll, "dummy")
    assert a.anchor_set_id == res["anchor"]["anchor_set_id"] and len(a) == 100
    assert d.anchor_set_id == res["dummy"]["anchor_set_id"] and len(d) == 30
    for s in (a, d):
        p = s.provenance
        assert p["epsilon"] == 2.0 and p["value_range"] == [0.0, 1.0] and p["sensitivity"] == 1.0
        assert p["row_epsilon"] == pytest.approx(2.0 * 64) and p["smoothing"] == "fixed 3 steps (public)"
        assert p["anchors_per_class"] == 10 and p["dummies_per_class"] == 3 and "NOT private" in p["noise_seed"]
        assert p["unit"] == "element" and p["per_item_epsilon"] == pytest.approx(2.0 * 64)
    assert res["provenance"] == a.provenance
    np.testing.assert_allclose(np.linalg.norm(a.features, axis=1), 1.0, atol=1e-5)  # unit-norm anchor rows
    assert sorted(np.bincount(a.labels).tolist()) == [10] * 10
    emb = res["embedding"]  # the embedding job of `pm-vector embed`, on the new anchor
    assert emb["status"] == "succeeded" and emb["is_active"] and emb["anchor_set_id"] == a.anchor_set_id
    assert emb["n_items"] == 300 and emb["n_anchors"] == 100
    # table output, no embedding, the defaults: row level (epsilon per item), fixed public steps
    r = _ok(["kahm", "anchor", coll, "--epsilon", "4", "--anchors-per-class", "10",
             "--dummies-per-class", "0", "--n-components", "5", "--no-progress"])
    assert "DP fabricated anchor" in r.stdout and "anchor_set_id" in r.stdout and "epsilon per item" in r.stdout
    a2 = db.get_anchor_set(coll)
    assert a2.anchor_set_id > a.anchor_set_id and a2.provenance["smoothing"].startswith("fixed")
    assert a2.provenance["noise_seed"] == "cryptographically seeded"
    assert a2.provenance["unit"] == "row" and a2.provenance["per_item_epsilon"] == 4.0
    assert a2.provenance["clip_norm"] == 1.0 and a2.provenance["value_range"] is None
    r = _ok(["kahm", "anchor", coll, "--epsilon", "1", "--value-range", "0,1", "--anchors-per-class", "10",
             "--dummies-per-class", "0", "--n-components", "5", "--stopping-rule", "--json"])
    assert json.loads(r.stdout)["provenance"]["smoothing"].startswith("paper's stopping rule")
    _refused(["kahm", "anchor", coll, "--epsilon", "1", "--value-range", "0,1", "--stopping-rule",
              "--smoothing-steps", "3"], "exclude each other")
    assert db.get_anchor_set(coll, "dummy").anchor_set_id == d.anchor_set_id  # no dummy pool this time


def test_federate_and_audit(home, digits, tmp_path):
    import pm_vector.db as db
    from pm_vector.db.kahm import roles as kahm

    X, y, classes = digits
    names = ["kfa_" + uuid.uuid4().hex[:8], "kfb_" + uuid.uuid4().hex[:8]]
    try:
        for name, sl in zip(names, (slice(0, 200), slice(200, 400))):
            db.create_collection(name, X.shape[1], classes, settings={"kahm": {"raw_distances": True}})
            db.ingest(name, X[sl], y[sl])
            _ok(["kahm", "fit", name, "--n-components", "6", "--no-progress"])
        q = tmp_path / "q.npy"
        np.save(q, X[400:420])
        got = _json(["kahm", "federate", *names, "--features", str(q), "--json"])
        ref = kahm.federated_classify(names, X[400:420])
        assert got["predicted"] == ref["predicted"].tolist() and got["party"] == ref["party"]
        assert got["classes"] == ref["classes"] and {p["party"] for p in got["parties"]} == set(names)
        np.testing.assert_allclose(np.asarray(got["scores"]), ref["scores"], rtol=1e-12)
        assert "party" in _ok(["kahm", "federate", *names, "--features", str(q)]).stdout
        _refused(["kahm", "federate", names[0], "no_such_collection_k", "--features", str(q)], "unknown collection")

        rep = _json(["kahm", "audit", names[0], "--epsilon", "1", "--value-range", "0,1", "--n-components", "5",
                     "--smoothing-steps", "3", "--noise-seed", "0", "--holdout", "0.3", "--repeats", "2",
                     "--no-progress", "--json"])
        assert rep["n_repeats"] == 2 and rep["tpr_at_fpr_0.01_raw"]["members"] == 2 * rep["n_train"]
        assert rep["collection"] == names[0] and rep["n_train"] + rep["n_holdout"] == 200
        assert rep["params"]["epsilon"] == 1.0 and rep["params"]["holdout_fraction"] == 0.3
        for tag in ("raw", "noisy", "fab"):
            assert 0.0 <= rep[f"accuracy_{tag}"] <= 1.0 and 0.0 <= rep[f"auc_{tag}"] <= 1.0
        r = _ok(["kahm", "audit", names[1], "--epsilon", "1", "--value-range", "0,1", "--n-components", "5",
                 "--smoothing-steps", "3", "--max-items", "150", "--repeats", "1", "--no-progress"])
        assert "membership-inference audit" in r.stdout and "fabricated" in r.stdout and "MIS reduction" in r.stdout
        assert "TPR" in r.stdout and "CI" in r.stdout
        # no --epsilon: the deployed model (the raw one fitted above) is audited
        dep = _json(["kahm", "audit", names[1], "--repeats", "1", "--no-progress", "--json"])
        assert dep["configuration"]["source"] == "deployed" and dep["kinds"] == ["raw"]
        listed = _json(["kahm", "audits", names[0], "--json"])["audits"]
        assert [a["audit_id"] for a in listed] == [rep["audit_id"]]
        assert listed[0]["epsilon"] == 1.0 and listed[0]["report"]["n_train"] == rep["n_train"]
        assert "membership-inference audits" in _ok(["kahm", "audits", names[0]]).stdout
        _refused(["kahm", "audit", names[0], "--epsilon", "1", "--value-range", "0,1", "--holdout", "0.99"],
                 "holdout_fraction")
        _refused(["kahm", "audit", names[0], "--epsilon", "1", "--value-range", "0,1", "--max-items", "5"],
                 "cannot split the audit sample")
    finally:
        for name in names:
            db.drop_collection(name, missing_ok=True)


def test_help_has_examples():
    for cmd in ("anchor", "fit", "models", "audits", "classify", "federate", "audit"):
        r = runner.invoke(app, ["kahm", cmd, "--help"])
        assert r.exit_code == 0 and "Example" in r.stdout, cmd
