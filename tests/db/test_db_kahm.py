"""KAHM roles in the database (pm_vector.db.kahm.roles): the DP fabricated anchor, stored class models with
item scores (resolve, pm_class_scores, new items), kill safety, federation, membership audits and
migration 0004."""

from __future__ import annotations

import os
import signal
import time
import uuid

import numpy as np
import pytest
from dbtest_helpers import start_child, wait_ready

from pm_vector.errors import InvalidInputError, PrivacyParameterError

K = 8
N_COMP = 5  # KAHM subspace dimension of the small models here
N_LAYERS = 2


# ----------------------------------------------------------------------------- helpers

@pytest.fixture(scope="module")
def digits():
    """Digits (unit-norm rows, pixels >= 0 so every element is in [0, 1]), shuffled per class."""
    from pm_vector.datasets import load_dataset

    ds = load_dataset("digits")
    X = np.asarray(ds.features, dtype=np.float64)
    y = np.asarray(ds.labels, dtype=np.int64)
    assert X.min() >= 0 and X.max() <= 1
    return X, y


def _take(X, y, per_class: int, skip: int = 0, classes=range(10)):
    """``per_class`` items of every class (after skipping ``skip`` of each): disjoint slices."""
    idx = np.concatenate([np.flatnonzero(y == c)[skip:skip + per_class] for c in classes])
    return X[idx], y[idx]


def _new_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _count(conn, table: str, name: str) -> int:
    return conn.execute(f"SELECT count(*) FROM pm_vector.{table} t JOIN pm_vector.collections c "
                        "ON c.id = t.collection_id WHERE c.name = %s", [name]).fetchone()[0]


def _score_count(conn, name: str) -> int:
    return conn.execute("SELECT count(*) FROM pm_vector.kahm_item_scores s JOIN pm_vector.kahm_models m "
                        "ON m.id = s.model_id JOIN pm_vector.collections c ON c.id = m.collection_id "
                        "WHERE c.name = %s", [name]).fetchone()[0]


def _stored_scores(conn, model_id: int) -> dict[int, tuple[int, np.ndarray]]:
    rows = conn.execute("SELECT item_id, predicted, scores FROM pm_vector.kahm_item_scores WHERE model_id = %s",
                        [model_id]).fetchall()
    return {int(i): (int(p), np.asarray(s, dtype=np.float64)) for i, p, s in rows}


def _items(conn, name: str):
    """(ids, features float64, labels) of a collection, by id."""
    rows = conn.execute("SELECT i.id, i.features, i.label FROM pm_vector.items i JOIN pm_vector.collections c "
                        "ON c.id = i.collection_id WHERE c.name = %s ORDER BY i.id", [name]).fetchall()
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    X = np.stack([r[1].to_numpy() for r in rows]).astype(np.float64)
    return ids, X, np.array([r[2] for r in rows], dtype=np.int64)


def _serve(db, name):
    """AnchorFrame run on the collection's current anchor set; (public anchor, info, client frame)."""
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.db.resolve.resolution import client_frame, public_anchor

    run = db.run_embedding_job(name, {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn)
    pa, info = public_anchor(name)
    return run, pa, info, client_frame(name, pa, info)


def _resolve_queries(name, pa, frame, Xq, yq, *, epsilon=1.0, seed=0, **kw):
    """PrivateMail requests for every query row, resolved; [(secret, result)]."""
    from pm_vector.client import PrivateMail
    from pm_vector.db.resolve.resolution import resolve

    pm = PrivateMail(frame, epsilon=epsilon, _rng=seed)
    out = []
    for x, c in zip(Xq, yq):
        req, secret = pm.request(x, int(c), pa, collection=name)
        out.append((secret, resolve(name, req, k=K, **kw)))
    return out


# ----------------------------------------------------------------------------- DP anchor

@pytest.fixture(scope="module")
def dp_served(pm_home, digits):
    """A digits collection whose anchor + dummy pool are fabricated under DP (eps 10 per element), served."""
    import pm_vector.db as db
    from pm_vector.db.kahm.roles import fabricate_anchor_set

    X, y = digits
    Xs, ys = _take(X, y, 40)
    Xq, yq = _take(X, y, 2, skip=60)
    name = _new_name("kahm_dp")
    db.create_collection(name, X.shape[1], list(range(10)))
    ids = db.ingest(name, Xs, ys)["item_ids"]
    stages = []
    fab = fabricate_anchor_set(name, 10.0, unit="element", value_range=(0.0, 1.0), anchors_per_class=15,
                               dummies_per_class=5,
                               source_per_class=30, n_components=N_COMP, smoothing_steps=3, noise_seed=7,
                               progress=lambda s, d, n: stages.append((s, d)))
    run, pa, info, frame = _serve(db, name)
    yield {"name": name, "X": Xs, "y": ys, "ids": ids, "fab": fab, "stages": stages, "run": run, "pa": pa,
           "info": info, "frame": frame, "Xq": Xq, "yq": yq}
    db.drop_collection(name, missing_ok=True)


def test_fabricated_anchor_is_registered_with_provenance(dp_served, db, conn):
    name, fab = dp_served["name"], dp_served["fab"]
    assert [s for s, d in dp_served["stages"] if d == 1] == ["load", "fabricate", "register"]
    a, d = fab["anchor"], fab["dummy"]
    assert a["role"] == "anchor" and a["n_rows"] == 150 and d["role"] == "dummy" and d["n_rows"] == 50
    # both sets in one transaction: same now()
    rows = conn.execute("SELECT s.id, s.role, s.created_at, s.provenance FROM pm_vector.anchor_sets s "
                        "JOIN pm_vector.collections c ON c.id = s.collection_id WHERE c.name = %s ORDER BY s.id",
                        [name]).fetchall()
    assert [(r[0], r[1]) for r in rows] == [(a["anchor_set_id"], "anchor"), (d["anchor_set_id"], "dummy")]
    assert rows[0][2] == rows[1][2]
    p = 64
    for r in rows:
        prov = r[3]
        assert prov["epsilon"] == 10.0 and prov["delta"] == 1e-5 and prov["sensitivity"] == 1.0
        assert prov["value_range"] == [0.0, 1.0] and prov["row_epsilon"] == pytest.approx(10.0 * p)
        # per-item figures lead the record; unit, grid and what lies outside are stated
        assert prov["per_item_epsilon"] == pytest.approx(10.0 * p)  # jsonb sorts keys: the returned dict leads
        assert prov["unit"] == "element" and prov["grid"] == 2.0 ** -8 and "labels" in prov["outside_guarantee"]
        assert prov["smoothing"] == "fixed 3 steps (public)" and prov["n_components"] == N_COMP
        assert prov["anchors_per_class"] == 15 and prov["dummies_per_class"] == 5 and prov["source_per_class"] == 30
        assert prov["source_items"] == 300 and prov["classes"] == list(range(10))
        assert "NOT private" in prov["noise_seed"]
    assert rows[0][3] == fab["provenance"] and next(iter(fab["provenance"])) == "per_item_epsilon"
    # the view shows it, and the current sets are these
    view = conn.execute("SELECT anchor_set_id, is_current, provenance FROM pm_vector.pm_anchor_sets "
                        "WHERE collection = %s ORDER BY anchor_set_id", [name]).fetchall()
    assert [(v[0], v[1]) for v in view] == [(a["anchor_set_id"], True), (d["anchor_set_id"], True)]
    assert view[0][2]["row_epsilon"] == pytest.approx(640.0)
    A = db.get_anchor_set(name)
    D = db.get_anchor_set(name, role="dummy")
    assert A.anchor_set_id == a["anchor_set_id"] and A.provenance["epsilon"] == 10.0
    for s, per in ((A, 15), (D, 5)):
        np.testing.assert_allclose(np.linalg.norm(s.features, axis=1), 1.0, atol=1e-5)
        cls, cnt = np.unique(s.labels, return_counts=True)
        assert cls.tolist() == list(range(10)) and cnt.tolist() == [per] * 10
    # not a copy of the data: no fabricated row is (close to) a source item
    F = np.vstack([A.features, D.features]).astype(np.float64)
    dist = np.sqrt(((F[:, None, :] - dp_served["X"][None, :, :]) ** 2).sum(-1))
    assert dist.min() > 1e-3
    # anchor and dummy rows are distinct fabricated rows
    assert np.sqrt(((A.features[:, None] - D.features[None]) ** 2).sum(-1)).min() > 1e-6


def test_fabricated_anchor_serves_the_protocol(dp_served):
    name = dp_served["name"]
    info = dp_served["info"]
    assert info["anchor_set_id"] == dp_served["fab"]["anchor"]["anchor_set_id"]
    assert info["dummy_set_id"] == dp_served["fab"]["dummy"]["anchor_set_id"]
    assert dp_served["frame"].reproduction_error_ <= 1e-6
    res = _resolve_queries(name, dp_served["pa"], dp_served["frame"], dp_served["Xq"], dp_served["yq"], epsilon=10.0)
    prec = []
    for secret, r in res:
        real = secret.pick(r["rows"])
        assert len(real["labels"]) == K
        prec.append(np.mean(np.asarray(real["labels"]) == secret.label))
        # no KAHM model: no class scores anywhere
        assert r["kahm"] is None
        assert all("class_scores" not in row and "predicted" not in row for row in r["rows"])
    assert np.mean(prec) >= 0.6, prec  # chance is 0.1 (0.99 with these seeds)


def test_fabricated_anchor_noise(db, cname, digits, conn):
    from pm_vector.db.kahm.roles import fabricate_anchor_set

    X, y = digits
    Xs, ys = _take(X, y, 12)
    db.create_collection(cname, 64, list(range(10)))
    db.ingest(cname, Xs, ys)
    kw = dict(unit="element", value_range=(0, 1), anchors_per_class=4, dummies_per_class=0, n_components=3,
              smoothing_steps=2)
    f1 = fabricate_anchor_set(cname, 2.0, noise_seed=None, **kw)
    f2 = fabricate_anchor_set(cname, 2.0, noise_seed=None, **kw)
    f3 = fabricate_anchor_set(cname, 2.0, noise_seed=5, **kw)
    f4 = fabricate_anchor_set(cname, 2.0, noise_seed=5, **kw)
    assert f1["dummy"] is None and _count(conn, "anchor_sets", cname) == 4  # no dummy set when dummies_per_class=0
    assert f1["provenance"]["noise_seed"] == "cryptographically seeded"
    sets = [db.get_anchor_set(cname, anchor_set_id=f["anchor"]["anchor_set_id"]) for f in (f1, f2, f3, f4)]
    for s in sets:
        assert s.features.shape == (40, 64)
        np.testing.assert_array_equal(np.unique(s.labels, return_counts=True)[1], [4] * 10)
    assert not np.allclose(sets[0].features, sets[1].features, atol=1e-3)  # fresh noise every run
    np.testing.assert_allclose(sets[2].features, sets[3].features, atol=1e-6)  # fixed test seed: reproducible
    assert not np.allclose(sets[0].features, sets[2].features, atol=1e-3)
    assert db.get_anchor_set(cname).anchor_set_id == f4["anchor"]["anchor_set_id"]  # newest is current
    # smoothing: a fixed public number of steps by default, the paper's stopping rule on request
    kw.pop("smoothing_steps")
    assert fabricate_anchor_set(cname, 2.0, noise_seed=1, **kw)["provenance"]["smoothing"] == "fixed 5 steps (public)"
    rule = fabricate_anchor_set(cname, 2.0, noise_seed=1, smoothing_steps=None, **kw)
    assert rule["provenance"]["smoothing"].startswith("paper's stopping rule (eq 92)")
    assert db.get_anchor_set(cname).features.shape == (40, 64)


def test_fabricated_anchor_bad_input_registers_nothing(db, cname, digits, conn):
    from pm_vector.db.kahm.roles import fabricate_anchor_set

    X, y = digits
    Xs, ys = _take(X, y, 12)
    keep = ~((ys == 9) & (np.cumsum(ys == 9) > 5))  # class 9 keeps 5 items
    Xs, ys = Xs[keep], ys[keep]
    assert np.sum(ys == 9) == 5 and np.sum(ys == 8) == 12
    db.create_collection(cname, 64, list(range(10)))
    db.ingest(cname, Xs, ys)
    before = _count(conn, "anchor_sets", cname)
    assert before == 0
    kw = dict(unit="element", anchors_per_class=3, dummies_per_class=1, n_components=2, smoothing_steps=1,
              noise_seed=1)
    cases = [
        (dict(epsilon=1.0, value_range=None), "value_range=\\(lo, hi\\) is required"),
        (dict(epsilon=1.0, value_range=(1.0, 0.0)), "lo < hi"),
        (dict(epsilon=1.0, value_range=(0.5, 0.5)), "lo < hi"),
        (dict(epsilon=1.0, value_range=(float("nan"), 1.0)), "finite"),
        (dict(epsilon=1.0, value_range=(0.0, float("inf"))), "finite"),
        (dict(epsilon=1.0, value_range="01"), "value_range"),
        (dict(epsilon=0.0, value_range=(0, 1)), "epsilon must be positive and finite"),
        (dict(epsilon=-1.0, value_range=(0, 1)), "epsilon must be positive and finite"),
        (dict(epsilon=float("nan"), value_range=(0, 1)), "epsilon must be positive and finite"),
        (dict(epsilon=1.0, value_range=(0, 1), source_per_class=3), "source_per_class=3 is below"),
        (dict(epsilon=1.0, value_range=(0, 1), source_per_class=8), "class 9 .* has 5 item"),
    ]
    for extra, match in cases:
        exc = PrivacyParameterError if match.startswith("epsilon") else InvalidInputError
        with pytest.raises(exc, match=match):
            fabricate_anchor_set(cname, **extra, **kw)
        assert _count(conn, "anchor_sets", cname) == 0, extra
    with pytest.raises(InvalidInputError, match="anchors_per_class"):
        fabricate_anchor_set(cname, 1.0, value_range=(0, 1), anchors_per_class=0)
    with pytest.raises(InvalidInputError, match="n_components=4 needs at least"):
        fabricate_anchor_set(cname, 1.0, value_range=(0, 1), **{**kw, "n_components": 4})
    with pytest.raises(db.CollectionNotFoundError):
        fabricate_anchor_set("no_such_kahm_coll", 1.0, value_range=(0, 1), **kw)
    assert _count(conn, "anchor_sets", cname) == 0
    # the control: the same call with valid input registers both sets
    out = fabricate_anchor_set(cname, 1.0, value_range=(0, 1), **kw)
    assert out["anchor"]["n_rows"] == 30 and out["dummy"]["n_rows"] == 10
    assert _count(conn, "anchor_sets", cname) == 2


# ----------------------------------------------------------------------------- class models

@pytest.fixture(scope="module")
def modeled(pm_home, digits):
    """A served digits collection (plain anchor) with a raw KAHM model whose outputs it serves (opt-in)."""
    import pm_vector.db as db
    from pm_vector.db.kahm.roles import fit_kahm_models

    X, y = digits
    Xs, ys = _take(X, y, 30)
    Xa, ya = _take(X, y, 12, skip=30)
    Xd, yd = _take(X, y, 4, skip=42)
    Xq, yq = _take(X, y, 1, skip=50)
    name = _new_name("kahm_m")
    db.create_collection(name, 64, list(range(10)), settings={"kahm": {"raw_distances": True}})
    db.ingest(name, Xs, ys)
    db.register_anchor_set(name, Xa, ya)
    db.register_anchor_set(name, Xd, yd, role="dummy")
    run, pa, info, frame = _serve(db, name)
    stages = []
    model = fit_kahm_models(name, n_components=N_COMP, n_layers=N_LAYERS, progress=lambda s, d, n: stages.append(s))
    yield {"name": name, "model": model, "stages": stages, "pa": pa, "frame": frame, "Xq": Xq, "yq": yq}
    db.drop_collection(name, missing_ok=True)


def test_stored_scores_are_the_models_scores(modeled, conn):
    from pm_vector.db.kahm.roles import class_scores, list_kahm_models, load_kahm_model
    from pm_vector.kahm import KAHMClassifier

    name, m = modeled["name"], modeled["model"]
    assert modeled["stages"][0] == "load" and {"fit", "score", "write"} <= set(modeled["stages"])
    assert m["kind"] == "raw" and m["privacy"]["unit"] == "none" and m["is_current"] is True
    assert "everything" in m["privacy"]["outside_guarantee"]
    assert m["classes"] == list(range(10)) and m["n_features"] == 64 and m["n_items"] == 300
    assert m["n_scored_items"] == 300 and m["params"] == {"n_components": N_COMP, "n_layers": N_LAYERS,
                                                           "branch_size": 1000, "dtype": "float32"}
    assert m["model_bytes"] > 0 and 0.5 < m["training_accuracy"] <= 1.0
    assert list_kahm_models(name)[0]["model_id"] == m["model_id"]
    ids, X, y = _items(conn, name)
    stored = _stored_scores(conn, m["model_id"])
    assert sorted(stored) == ids.tolist()
    S = np.stack([stored[int(i)][1] for i in ids])
    P = np.array([stored[int(i)][0] for i in ids])
    model = load_kahm_model(name)
    assert model.model_id_ == m["model_id"] and model.classes_.tolist() == list(range(10))
    np.testing.assert_allclose(S, model.class_scores(X), rtol=1e-5, atol=1e-6)
    # the same model fitted in memory, the same way
    ref = KAHMClassifier(n_components=N_COMP, n_layers=N_LAYERS, dtype="float32").fit(X, y)
    np.testing.assert_allclose(S, ref.class_scores(X), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(P, ref.predict(X))
    # stored in float32 (the default): the float64 model scores the items the same to ~1e-4
    ref64 = KAHMClassifier(n_components=N_COMP, n_layers=N_LAYERS).fit(X, y)
    np.testing.assert_allclose(S, ref64.class_scores(X), atol=1e-4)
    assert model.dtype == "float32"
    np.testing.assert_array_equal(P, np.argmax(S, axis=1))
    # a model read back from its bytes (not the cache) is the same model
    from pm_vector.db.kahm import roles as dbk

    dbk._models.clear()
    fresh = load_kahm_model(name)
    assert fresh is not model
    np.testing.assert_allclose(fresh.class_scores(X[:20]), S[:20], rtol=1e-5, atol=1e-6)
    # class_scores() on given rows
    cs = class_scores(name, X[:7])
    assert cs["model_id"] == m["model_id"] and cs["classes"] == list(range(10))
    np.testing.assert_allclose(cs["scores"], S[:7], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(cs["predicted"], P[:7])
    with pytest.raises(InvalidInputError):
        class_scores(name, X[:3, :10])


def test_pm_class_scores_sql_function(modeled, conn):
    name, mid = modeled["name"], modeled["model"]["model_id"]
    ids, X, y = _items(conn, name)
    stored = _stored_scores(conn, mid)
    ask = [int(ids[5]), int(ids[0]), 10**12, int(ids[99])]  # order kept, unknown id skipped
    rows = conn.execute("SELECT item_id, label, predicted, scores, classes, model_id "
                        "FROM pm_vector.pm_class_scores(%s, %s)", [name, ask]).fetchall()
    assert [r[0] for r in rows] == [ask[0], ask[1], ask[3]]
    pos = {int(v): j for j, v in enumerate(ids)}
    for r in rows:
        assert r[1] == y[pos[r[0]]] and r[2] == stored[r[0]][0] and r[4] == list(range(10)) and r[5] == mid
        np.testing.assert_allclose(r[3], stored[r[0]][1], rtol=1e-7)
    assert conn.execute("SELECT count(*) FROM pm_vector.pm_class_scores('no_such_coll', %s)",
                        [ask]).fetchone()[0] == 0


def test_resolved_rows_carry_class_scores(modeled, conn):
    name, mid = modeled["name"], modeled["model"]["model_id"]
    stored = _stored_scores(conn, mid)
    res = _resolve_queries(name, modeled["pa"], modeled["frame"], modeled["Xq"][:3], modeled["yq"][:3])
    for _, r in res:
        assert r["kahm"] == {"model_id": mid, "classes": list(range(10))}
        for row in r["rows"]:
            assert len(row["class_scores"]) == len(row["predicted"]) == len(row["item_ids"]) == K
            for iid, sc, p in zip(row["item_ids"], row["class_scores"], row["predicted"]):
                assert p == stored[iid][0]
                np.testing.assert_allclose(sc, stored[iid][1], rtol=1e-7)
    # switched off: no scores, no kahm, the same items
    from pm_vector.client import PrivateMail
    from pm_vector.db.resolve.resolution import resolve

    req, _ = PrivateMail(modeled["frame"], epsilon=1.0, _rng=3).request(modeled["Xq"][4], int(modeled["yq"][4]),
                                                                       modeled["pa"], collection=name)
    off = resolve(name, req, k=K, class_scores=False)
    assert off["kahm"] is None
    assert all("class_scores" not in row and "predicted" not in row for row in off["rows"])
    on = resolve(name, req, k=K)
    assert [r["item_ids"] for r in on["rows"]] == [r["item_ids"] for r in off["rows"]]
    for row in on["rows"]:
        assert [stored[i][0] for i in row["item_ids"]] == row["predicted"]


def test_resolve_with_features_and_class_scores(db, cname, digits, conn):
    """include_features shifts the columns of resolve's statement: the scores must still be the item's."""
    from pm_vector.db.kahm.roles import fit_kahm_models

    X, y = digits
    Xs, ys = _take(X, y, 8)
    Xa, ya = _take(X, y, 6, skip=8)
    Xd, yd = _take(X, y, 2, skip=14)
    db.create_collection(cname, 64, list(range(10)), allow_raw_features=True,
                         settings={"kahm": {"raw_distances": True}})  # a raw model's outputs served: opt-in
    db.ingest(cname, Xs, ys)
    db.register_anchor_set(cname, Xa, ya)
    db.register_anchor_set(cname, Xd, yd, role="dummy")
    _, pa, _, frame = _serve(db, cname)
    mid = fit_kahm_models(cname, n_components=3, n_layers=1)["model_id"]
    stored = _stored_scores(conn, mid)
    ids, Xi, _ = _items(conn, cname)
    feat = {int(i): x for i, x in zip(ids, Xi)}
    Xq, yq = _take(X, y, 1, skip=20)
    [(_, r)] = _resolve_queries(cname, pa, frame, Xq[:1], yq[:1], include_features=True)
    assert r["kahm"]["model_id"] == mid
    for row in r["rows"]:
        np.testing.assert_allclose(row["features"], np.stack([feat[i] for i in row["item_ids"]]), atol=1e-6)
        assert row["predicted"] == [stored[i][0] for i in row["item_ids"]]
        for iid, sc in zip(row["item_ids"], row["class_scores"]):
            np.testing.assert_allclose(sc, stored[iid][1], rtol=1e-7)


def test_new_items_have_no_scores_until_scored(db, cname, digits, conn):
    from pm_vector.db.runs.jobs import anchor_frame_extend_fn
    from pm_vector.db.kahm.roles import fit_kahm_models, list_kahm_models, load_kahm_model, score_new_items

    X, y = digits
    Xs, ys = _take(X, y, 8)
    Xn, yn = _take(X, y, 12, skip=8)  # more new items than old ones: results will contain them
    Xa, ya = _take(X, y, 6, skip=30)
    Xd, yd = _take(X, y, 2, skip=36)
    db.create_collection(cname, 64, list(range(10)), settings={"kahm": {"raw_distances": True}})  # raw: opt-in
    old = db.ingest(cname, Xs, ys)["item_ids"]
    db.register_anchor_set(cname, Xa, ya)
    db.register_anchor_set(cname, Xd, yd, role="dummy")
    _, pa, _, frame = _serve(db, cname)
    mid = fit_kahm_models(cname, n_components=3, n_layers=1)["model_id"]
    new = db.ingest(cname, Xn, yn)["item_ids"]
    assert db.embed_new_items(cname, anchor_frame_extend_fn)["n_new"] == len(new)
    new_set, old_set = set(int(i) for i in new), set(int(i) for i in old)
    assert list_kahm_models(cname)[0]["n_scored_items"] == len(old)
    sql = "SELECT item_id FROM pm_vector.pm_class_scores(%s, %s)"
    assert {r[0] for r in conn.execute(sql, [cname, list(new_set | old_set)]).fetchall()} == old_set
    Xq, yq = _take(X, y, 1, skip=40)
    seen_new = 0
    for _, r in _resolve_queries(cname, pa, frame, Xq[:3], yq[:3], seed=1):
        for row in r["rows"]:
            for iid, sc, p in zip(row["item_ids"], row["class_scores"], row["predicted"]):
                if iid in new_set:
                    seen_new += 1
                    assert sc is None and p is None
                else:
                    assert sc is not None and p is not None
    assert seen_new > 0
    out = score_new_items(cname)
    assert out == {"model_id": mid, "scored": len(new)}
    assert score_new_items(cname) == {"model_id": mid, "scored": 0}
    assert list_kahm_models(cname)[0]["n_scored_items"] == len(old) + len(new)
    stored = _stored_scores(conn, mid)
    model = load_kahm_model(cname)
    np.testing.assert_allclose(np.stack([stored[int(i)][1] for i in new]), model.class_scores(Xn.astype(np.float32)),
                               rtol=1e-5, atol=1e-6)
    for _, r in _resolve_queries(cname, pa, frame, Xq[:3], yq[:3], seed=1):
        for row in r["rows"]:
            assert all(sc is not None for sc in row["class_scores"])
            for iid, sc in zip(row["item_ids"], row["class_scores"]):
                np.testing.assert_allclose(sc, stored[iid][1], rtol=1e-7)
    # a refit serves at once (nothing cached per collection): every item scored by the new model
    mid2 = fit_kahm_models(cname, n_components=2, n_layers=1, keep_previous=0)["model_id"]
    assert mid2 > mid and _stored_scores(conn, mid) == {}
    stored2 = _stored_scores(conn, mid2)
    for _, r in _resolve_queries(cname, pa, frame, Xq[:2], yq[:2], seed=2):
        assert r["kahm"]["model_id"] == mid2
        for row in r["rows"]:
            assert row["predicted"] == [stored2[i][0] for i in row["item_ids"]]


def test_keep_previous_prunes_older_models(db, cname, digits, conn):
    from pm_vector.db.kahm.roles import (NoKAHMModelError, class_scores, federated_classify, fit_kahm_models,
                                         list_kahm_models, load_kahm_model, party_distances, score_new_items)

    X, y = digits
    Xs, ys = _take(X, y, 6)
    db.create_collection(cname, 64, list(range(10)))
    db.ingest(cname, Xs, ys)
    for call in (lambda: load_kahm_model(cname), lambda: class_scores(cname, Xs[:2]),
                 lambda: party_distances(cname, Xs[:2]), lambda: federated_classify([cname], Xs[:2]),
                 lambda: score_new_items(cname)):
        with pytest.raises(NoKAHMModelError, match="has no KAHM model"):
            call()
    assert list_kahm_models(cname) == []
    fit = dict(n_components=3, n_layers=1)
    m1 = fit_kahm_models(cname, **fit)["model_id"]
    m2 = fit_kahm_models(cname, **fit)["model_id"]
    m3 = fit_kahm_models(cname, **fit)["model_id"]  # keep_previous=1: m1 goes
    ls = list_kahm_models(cname)
    assert [r["model_id"] for r in ls] == [m3, m2] and [r["is_current"] for r in ls] == [True, False]
    assert _score_count(conn, cname) == 2 * 60
    m4 = fit_kahm_models(cname, keep_previous=2, **fit)["model_id"]
    assert [r["model_id"] for r in list_kahm_models(cname)] == [m4, m3, m2]
    m5 = fit_kahm_models(cname, keep_previous=0, **fit)["model_id"]
    assert [r["model_id"] for r in list_kahm_models(cname)] == [m5]
    assert _score_count(conn, cname) == 60  # the pruned models' scores went with them
    assert conn.execute("SELECT count(*) FROM pm_vector.kahm_item_scores WHERE model_id = ANY(%s)",
                        [[m1, m2, m3, m4]]).fetchone()[0] == 0
    assert load_kahm_model(cname).model_id_ == m5
    with pytest.raises(NoKAHMModelError, match=f"no KAHM model {m2}"):
        load_kahm_model(cname, m2)
    with pytest.raises(InvalidInputError, match="keep_previous"):
        fit_kahm_models(cname, keep_previous=-1, **fit)
    # dropping the collection drops its models and their scores
    cid = db.collection_info(cname)["id"]
    db.drop_collection(cname)
    assert conn.execute("SELECT count(*) FROM pm_vector.kahm_models WHERE collection_id = %s", [cid]).fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM pm_vector.kahm_item_scores WHERE model_id = %s", [m5]).fetchone()[0] == 0


def test_private_kinds_and_bad_input(db, cname, digits, conn):
    from pm_vector.db.kahm.roles import fit_kahm_models, list_kahm_models

    X, y = digits
    Xs, ys = _take(X, y, 8)
    db.create_collection(cname, 64, list(range(10)))
    db.ingest(cname, Xs, ys)
    fit = dict(n_components=3, n_layers=1)

    def refused(match, **kw):
        with pytest.raises(InvalidInputError, match=match):
            fit_kahm_models(cname, **{**fit, **kw})
        assert _count(conn, "kahm_models", cname) == 0 and _score_count(conn, cname) == 0

    refused("kind must be one of", kind="bogus")
    refused("give epsilon", kind="noisy")
    refused("give epsilon", kind="fabricated", value_range=(0, 1))
    refused("value_range=\\(lo, hi\\) is required", kind="noisy", epsilon=1.0)
    refused("value_range=\\(lo, hi\\) is required", kind="fabricated", epsilon=1.0)
    refused("lo < hi", kind="noisy", epsilon=1.0, value_range=(1, 0))
    with pytest.raises(PrivacyParameterError, match="epsilon must be positive"):
        fit_kahm_models(cname, kind="noisy", epsilon=0.0, value_range=(0, 1), **fit)
    refused("kind='raw' adds no noise", epsilon=1.0)
    refused("kind='raw' adds no noise", kind="raw", epsilon=1.0, value_range=(0, 1))
    refused("smoothing_steps must be an integer", kind="fabricated", epsilon=1.0, value_range=(0, 1),
            smoothing_steps=-1)
    refused("n_components=65 exceeds", n_components=65, n_layers=1)
    refused("n_components", n_components=0)
    refused("class 0 .* has 8 item.*n_components=8", n_components=8, n_layers=1)
    # the private kinds work and record their privacy parameters
    for kind, extra in (("noisy", {}), ("fabricated", {"smoothing_steps": 2})):
        m = fit_kahm_models(cname, kind=kind, epsilon=5.0, value_range=(0, 1), noise_seed=3, **fit, **extra)
        assert m["kind"] == kind and m["n_scored_items"] == 80
        pr = m["privacy"]
        assert pr["epsilon"] == 5.0 and pr["sensitivity"] == 1.0 and pr["value_range"] == [0.0, 1.0]
        assert pr["row_epsilon"] == pytest.approx(5.0 * 64) and pr["delta"] == 1e-5
    assert [r["kind"] for r in list_kahm_models(cname)] == ["fabricated", "noisy"]
    assert list_kahm_models(cname)[0]["params"]["smoothing_steps"] == 2


def test_small_class_refused_nothing_written(db, cname, digits, conn):
    from pm_vector.db.kahm.roles import fit_kahm_models

    X, y = digits
    Xs, ys = _take(X, y, 10)
    keep = ~((ys == 4) & (np.cumsum(ys == 4) > 3))  # class 4 keeps 3 items
    Xs, ys = Xs[keep], ys[keep]
    assert np.sum(ys == 4) == 3
    db.create_collection(cname, 64, list(range(10)))
    db.ingest(cname, Xs, ys)
    fit_kahm_models(cname, n_components=2, n_layers=1)  # 3 items = n+1: fine
    before = (_count(conn, "kahm_models", cname), _score_count(conn, cname))
    with pytest.raises(InvalidInputError, match="class 4 .* has 3 item"):
        fit_kahm_models(cname, n_components=3, n_layers=1)
    assert (_count(conn, "kahm_models", cname), _score_count(conn, cname)) == before
    # a class of the collection without any item is refused the same way
    db.create_collection(cname + "x", 64, list(range(11)))
    try:
        db.ingest(cname + "x", Xs, ys)
        with pytest.raises(InvalidInputError, match="class 10 .* has 0 item"):
            fit_kahm_models(cname + "x", n_components=2, n_layers=1)
        assert _count(conn, "kahm_models", cname + "x") == 0
    finally:
        db.drop_collection(cname + "x", missing_ok=True)


# ----------------------------------------------------------------------------- kill safety

FIT_CHILD = """
import sys, time
import pm_vector.db as db
from pm_vector.db.kahm import roles as kahm

name, stage = sys.argv[1], sys.argv[2]

def progress(s, done, total):
    if s == stage and done == 0:
        print("READY", s, flush=True)
        time.sleep(300)

if stage == "in_transaction":
    # the model row and every score are written but not committed
    real = kahm._write_scores
    def write_then_sleep(conn, *a):
        real(conn, *a)
        print("READY", "in_transaction", flush=True)
        time.sleep(300)
    kahm._write_scores = write_then_sleep

kahm.fit_kahm_models(name, n_components=3, n_layers=1, keep_previous=0, progress=progress)
print("FINISHED", flush=True)
"""


@pytest.mark.parametrize("stage", ["fit", "in_transaction"])
def test_sigkilled_fit_leaves_previous_model(db, cname, digits, conn, stage):
    from pm_vector.db.kahm.roles import fit_kahm_models, list_kahm_models, load_kahm_model

    X, y = digits
    Xs, ys = _take(X, y, 6)
    db.create_collection(cname, 64, list(range(10)))
    db.ingest(cname, Xs, ys)
    first = fit_kahm_models(cname, n_components=3, n_layers=1)["model_id"]
    n_scores = _score_count(conn, cname)
    assert n_scores == 60
    child = start_child(FIT_CHILD, cname, stage)
    try:
        assert wait_ready(child).split()[1] == stage
        if stage == "in_transaction":  # the uncommitted rows are there, but invisible
            assert conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                                "state = 'idle in transaction' AND pid <> pg_backend_pid()").fetchone()[0] >= 1
            assert conn.execute("SELECT count(*) FROM pm_vector.kahm_item_scores s WHERE s.model_id > %s",
                                [first]).fetchone()[0] == 0
        assert [r["model_id"] for r in list_kahm_models(cname)] == [first]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        assert child.returncode == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # the server notices the dead client and rolls back its transaction
    deadline = time.monotonic() + 20
    while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()").fetchone()[0] \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [r["model_id"] for r in list_kahm_models(cname)] == [first]
    assert _count(conn, "kahm_models", cname) == 1
    assert _score_count(conn, cname) == n_scores
    assert conn.execute("SELECT count(*) FROM pm_vector.kahm_item_scores WHERE model_id > %s",
                        [first]).fetchone()[0] == 0
    assert load_kahm_model(cname).model_id_ == first
    # the next fit works (no lock left behind) and replaces it
    nxt = fit_kahm_models(cname, n_components=3, n_layers=1, keep_previous=0)["model_id"]
    assert nxt > first and [r["model_id"] for r in list_kahm_models(cname)] == [nxt]
    assert _score_count(conn, cname) == 60


# ----------------------------------------------------------------------------- federation

@pytest.fixture(scope="module")
def parties(pm_home, digits):
    """Scenario 1: party a holds classes 0-4, party b classes 5-9 (disjoint), each with a raw model."""
    import pm_vector.db as db
    from pm_vector.db.kahm.roles import fit_kahm_models

    X, y = digits
    names = {"a": _new_name("kahm_pa"), "b": _new_name("kahm_pb")}
    held = {"a": range(5), "b": range(5, 10)}
    for key, name in names.items():
        Xp, yp = _take(X, y, 25, classes=held[key])
        db.create_collection(name, 64, list(held[key]), settings={"kahm": {"raw_distances": True}})  # opt-in
        db.ingest(name, Xp, yp)
        fit_kahm_models(name, n_components=N_COMP, n_layers=N_LAYERS)
    Xq, yq = _take(X, y, 4, skip=100)
    yield {"names": names, "Xq": Xq, "yq": yq}
    for name in names.values():
        db.drop_collection(name, missing_ok=True)


def test_federated_equals_centralised(parties, conn):
    from pm_vector.db.kahm.roles import federated_classify, party_distances
    from pm_vector.kahm import KAHMClassifier

    a, b = parties["names"]["a"], parties["names"]["b"]
    Xq = parties["Xq"]
    _, Xa, ya = _items(conn, a)
    _, Xb, yb = _items(conn, b)
    central = KAHMClassifier(n_components=N_COMP, n_layers=N_LAYERS, dtype="float32").fit(
        np.vstack([Xa, Xb]), np.concatenate([ya, yb]))  # the stored models' precision
    res = federated_classify([a, b], Xq)
    np.testing.assert_array_equal(res["predicted"], central.predict(Xq))
    assert res["classes"] == list(range(10))
    np.testing.assert_allclose(res["distances"], central.class_distances(Xq), rtol=1e-6)
    np.testing.assert_allclose(res["scores"], central.class_scores(Xq), rtol=1e-6, atol=1e-9)
    assert np.mean(res["predicted"] == parties["yq"]) >= 0.6
    assert res["party"] == [a if p < 5 else b for p in res["predicted"]]
    assert {p < 5 for p in res["predicted"]} == {True, False}  # both parties win some rows
    assert [p["party"] for p in res["parties"]] == [a, b] and res["parties"][1]["classes"] == [5, 6, 7, 8, 9]
    assert res["predicted_column"] == [int(p) for p in res["predicted"]]
    # what a party sends: distances per class it holds, nothing else
    pd_ = party_distances(a, Xq)
    assert sorted(pd_["distances"]) == [0, 1, 2, 3, 4] and pd_["n_features"] == 64
    assert set(pd_) == {"party", "model_id", "n_features", "classes", "distances"}
    # a single row (1-d) works too
    one = federated_classify([a, b], Xq[3])
    assert one["predicted"].tolist() == [res["predicted"][3]]


def test_federated_with_a_callable_party(parties):
    from pm_vector.db.kahm.roles import federated_classify, party_distances

    a, b = parties["names"]["a"], parties["names"]["b"]
    Xq = parties["Xq"]
    calls = []

    def remote(Q):
        calls.append(Q.shape)
        return {**party_distances(b, Q), "party": "remote-b"}

    res = federated_classify([a, remote], Xq)
    ref = federated_classify([a, b], Xq)
    assert calls == [Xq.shape]
    np.testing.assert_array_equal(res["predicted"], ref["predicted"])
    assert res["party"] == [a if p < 5 else "remote-b" for p in res["predicted"]]
    with pytest.raises(InvalidInputError, match="party callable must return a mapping"):
        federated_classify([a, lambda Q: [1, 2]], Xq)
    for bad in ([], "abc", None):
        with pytest.raises(InvalidInputError, match="non-empty list"):
            federated_classify(bad, Xq)


def test_federated_dimension_mismatch(parties, db, cname, conn):
    from pm_vector.db.errors import DimensionMismatchError
    from pm_vector.db.kahm.roles import federated_classify, fit_kahm_models, party_distances

    a, b = parties["names"]["a"], parties["names"]["b"]
    Xq = parties["Xq"]
    rng = np.random.default_rng(0)
    db.create_collection(cname, 10, [0, 1])
    db.ingest(cname, rng.random((30, 10)), np.repeat([0, 1], 15))
    fit_kahm_models(cname, n_components=3, n_layers=1)
    calls = []

    def recorder(Q):
        calls.append(1)
        return party_distances(b, Q)

    with pytest.raises(DimensionMismatchError, match="different feature dimensions"):
        federated_classify([recorder, a, cname], Xq)
    assert calls == []  # refused before any party was asked
    # remote parties announcing different dimensions
    with pytest.raises(DimensionMismatchError, match="different feature dimensions"):
        federated_classify([a, lambda Q: {"party": "r", "n_features": 10, "classes": [9],
                                          "distances": {9: np.ones(Q.shape[0])}}], Xq)
    # a query of the wrong width
    with pytest.raises(DimensionMismatchError, match="the query has 10 features but party"):
        federated_classify([a, b], Xq[:, :10])
    with pytest.raises(DimensionMismatchError, match="the query has 10 features"):
        party_distances(a, Xq[:, :10])


# ----------------------------------------------------------------------------- membership audit

def test_membership_audit_is_stored(db, cname, digits, conn):
    from pm_vector.db.kahm.roles import list_audits, run_membership_audit

    X, y = digits
    Xs, ys = _take(X, y, 20)
    db.create_collection(cname, 64, list(range(10)))
    db.ingest(cname, Xs, ys)
    kw = dict(value_range=(0, 1), n_components=3, n_layers=1, smoothing_steps=2, noise_seed=2, n_repeats=2)
    for bad in (0.0, 1.0, 1.5, -0.1, "x", None):
        with pytest.raises(InvalidInputError, match="holdout_fraction must be in"):
            run_membership_audit(cname, 2.0, holdout_fraction=bad, **kw)
    with pytest.raises(InvalidInputError, match="value_range"):
        run_membership_audit(cname, 2.0, **{**kw, "value_range": None})
    with pytest.raises(InvalidInputError, match="each class needs at least"):
        run_membership_audit(cname, 2.0, **{**kw, "n_components": 15})
    with pytest.raises(InvalidInputError, match="n_repeats"):
        run_membership_audit(cname, 2.0, **{**kw, "n_repeats": 0})
    from pm_vector.db.kahm.roles import NoKAHMModelError
    with pytest.raises(NoKAHMModelError):  # the deployed configuration needs a deployed model
        run_membership_audit(cname, n_repeats=1)
    assert _count(conn, "kahm_audits", cname) == 0
    stages = []
    rep = run_membership_audit(cname, 2.0, holdout_fraction=0.3, progress=lambda s, d, n: stages.append((s, d)), **kw)
    assert ("fit", 6) in stages  # 2 repeats x 3 kinds
    assert rep["n_train"] + rep["n_holdout"] == 200 and rep["n_holdout"] == 60 and rep["n_repeats"] == 2
    for key in ("mis_raw", "mis_noisy", "mis_fab", "auc_raw", "auc_noisy", "auc_fab", "accuracy_raw",
                "accuracy_noisy", "accuracy_fab"):
        assert rep[key] is not None and np.isfinite(rep[key]), key
    for tag in ("raw", "noisy", "fab"):
        assert 0 <= rep[f"auc_{tag}"] <= 1 and 0 <= rep[f"accuracy_{tag}"] <= 1 and rep[f"mis_{tag}"] >= 0
        lo, hi = rep[f"auc_{tag}_range"]
        assert lo <= rep[f"auc_{tag}"] <= hi
        for f in ("0.01", "0.001"):
            t = rep[f"tpr_at_fpr_{f}_{tag}"]
            assert t["members"] == 2 * 140 and t["non_members"] == 2 * 60
            assert t["tpr"] == t["true_positives"] / t["members"]
            assert t["ci95"][0] <= t["tpr"] <= t["ci95"][1] and t["ci95"][1] - t["ci95"][0] > 0
            assert t["false_positives"] <= float(f) * t["non_members"]
    # the raw model memorises: its attack finds members at FPR 1 %; scores share one unit now
    assert rep["tpr_at_fpr_0.01_raw"]["tpr"] > 0.05
    assert rep["accuracy_raw"] > 0.5
    assert rep["params"]["epsilon"] == 2.0 and rep["params"]["value_range"] == [0.0, 1.0]
    assert rep["params"]["unit"] == "element" and "raw items" in rep["params"]["report_privacy"]["outside_guarantee"]
    assert rep["configuration"] == {"source": "given"}
    ls = list_audits(cname)
    assert len(ls) == 1 and ls[0]["audit_id"] == rep["audit_id"]
    assert ls[0]["report"]["mis_raw"] == pytest.approx(rep["mis_raw"])
    row = conn.execute("SELECT epsilon, mis_raw, mis_fabricated, auc_raw, auc_fabricated, accuracy_raw, "
                       "accuracy_fabricated, report FROM pm_vector.pm_kahm_audits WHERE audit_id = %s",
                       [rep["audit_id"]]).fetchone()
    assert row[0] == 2.0
    assert row[1:7] == pytest.approx((rep["mis_raw"], rep["mis_fab"], rep["auc_raw"], rep["auc_fab"],
                                      rep["accuracy_raw"], rep["accuracy_fab"]))
    assert all(np.isfinite(v) for v in row[1:7])
    assert {"mis_raw", "mis_noisy", "mis_fab", "auc_raw", "accuracy_raw"} <= set(row[7])
    assert any(a["audit_id"] == rep["audit_id"] for a in list_audits())
    # the deployed configuration: the current model's kind and parameters, beside a raw baseline
    from pm_vector.db.kahm.roles import fit_kahm_models
    mid = fit_kahm_models(cname, kind="noisy", epsilon=3.0, value_range=(0, 1), n_components=3, n_layers=1,
                          noise_seed=1)["model_id"]
    dep = run_membership_audit(cname, n_repeats=1, noise_seed=4)
    assert dep["configuration"] == {"source": "deployed", "model_id": mid, "kind": "noisy"}
    assert dep["kinds"] == ["raw", "noisy"] and dep["params"]["epsilon"] == 3.0
    assert dep["params"]["n_components"] == 3 and dep["params"]["n_layers"] == 1 and "auc_fab" not in dep


# ----------------------------------------------------------------------------- migration 0004


def _schema_state(c):
    cols = {r[0] for r in c.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = "
                                    "'pm_vector' AND table_name = 'anchor_sets'").fetchall()}
    vcols = [r[0] for r in c.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = "
                                     "'pm_vector' AND table_name = 'pm_anchor_sets' ORDER BY ordinal_position")]
    tables = {r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'pm_vector'").fetchall()}
    funcs = {r[0] for r in c.execute("SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                                     "WHERE n.nspname = 'pm_vector'").fetchall()}
    views = {r[0] for r in c.execute("SELECT viewname FROM pg_views WHERE schemaname = 'pm_vector'").fetchall()}
    version = c.execute("SELECT version_num FROM pm_vector.alembic_version").fetchone()[0] \
        if "alembic_version" in tables else None
    return {"cols": cols, "vcols": vcols, "tables": tables, "funcs": funcs, "views": views, "version": version}


def test_migration_0004_down_and_up(fresh_url):
    import psycopg
    from alembic import command

    from pm_vector.db import postgres
    from pm_vector.db.postgres.migrate import alembic_config, head_revision, upgrade_to_head

    kahm_tables = {"kahm_models", "kahm_item_scores", "kahm_audits"}
    with psycopg.connect(fresh_url, autocommit=True) as c:
        postgres.ensure_pgvector(c)
    upgrade_to_head(fresh_url)
    with psycopg.connect(fresh_url, autocommit=True) as c:
        up = _schema_state(c)
        # an anchor set with provenance and a model row: the downgrade must drop them cleanly
        c.execute("INSERT INTO pm_vector.collections (name, feature_dim, feature_type, metric, labels) "
                  "VALUES ('m', 2, 'vector', 'l2', '{0}')")
        c.execute("INSERT INTO pm_vector.anchor_sets (collection_id, role, n_rows, provenance) "
                  "SELECT id, 'anchor', 0, '{\"epsilon\": 1}' FROM pm_vector.collections")
        c.execute("INSERT INTO pm_vector.kahm_models (collection_id, kind, classes, n_features, n_items, model) "
                  "SELECT id, 'raw', '{0}', 2, 0, '\\x00' FROM pm_vector.collections")
    assert up["version"] == head_revision()
    assert "provenance" in up["cols"] and up["vcols"][-1] == "provenance"
    assert kahm_tables <= up["tables"] and "pm_class_scores" in up["funcs"]
    assert {"pm_kahm_models", "pm_kahm_audits", "pm_anchor_sets"} <= up["views"]

    command.downgrade(alembic_config(fresh_url), "0003_request_log_storage")
    with psycopg.connect(fresh_url, autocommit=True) as c:
        down = _schema_state(c)
        assert c.execute("SELECT count(*) FROM pm_vector.pm_anchor_sets").fetchone()[0] == 1  # data kept
    assert down["version"] == "0003_request_log_storage"
    assert "provenance" not in down["cols"] and "provenance" not in down["vcols"]
    assert down["vcols"] == up["vcols"][:-1]  # the 0001 view again
    assert not (kahm_tables & down["tables"]) and "pm_class_scores" not in down["funcs"]
    assert "pm_anchor_sets" in down["views"] and not ({"pm_kahm_models", "pm_kahm_audits"} & down["views"])
    # later migrations' tables go too; nothing else of 0001-0003 is touched
    assert down["tables"] <= up["tables"] - kahm_tables and {"collections", "items", "anchor_sets"} <= down["tables"]

    assert upgrade_to_head(fresh_url)["to_revision"] == head_revision()
    with psycopg.connect(fresh_url, autocommit=True) as c:
        again = _schema_state(c)
        assert c.execute("SELECT provenance FROM pm_vector.pm_anchor_sets").fetchall() == [(None,)]
    assert again == up
