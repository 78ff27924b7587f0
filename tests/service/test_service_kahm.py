"""KAHM over HTTP: class scores with resolved rows, /kahm/models, /kahm/distances (auth, bad input)
and a remote party in federated classification giving the same answer as a local one."""

from __future__ import annotations

import json
import uuid

import httpx
import numpy as np
import pytest

from pm_vector.client.http import Client, ServiceError


@pytest.fixture(scope="module")
def split():
    from pm_vector.datasets import load_dataset, split_dataset

    return split_dataset(load_dataset("digits", max_items=600, seed=1), 300, 120, 60, 20, seed=0)


@pytest.fixture(scope="module")
def embedded(pm_home, split):
    """A small embedded digits collection (raw features allowed), no KAHM model yet."""
    from pm_vector import db
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.bench.demo import prepare_collection

    name = "svk_" + uuid.uuid4().hex[:8]
    prepare_collection(name, split, allow_raw_features=True)
    db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
    yield name
    db.drop_collection(name, missing_ok=True)


@pytest.fixture(scope="module")
def parties(pm_home, split):
    """Two collections holding different items of the same feature space, each with a KAHM model."""
    from pm_vector import db
    from pm_vector.db.kahm.roles import fit_kahm_models

    X, y = split.server
    classes = [int(c) for c in split.dataset.classes]
    names = ["svp_" + uuid.uuid4().hex[:8], "svq_" + uuid.uuid4().hex[:8]]
    for name, sl in zip(names, (slice(0, 150), slice(150, 300))):
        # raw models whose distances are served: the parties opt in (a membership oracle otherwise)
        db.create_collection(name, X.shape[1], classes, settings={"kahm": {"raw_distances": True}})
        db.ingest(name, X[sl], y[sl])
        fit_kahm_models(name, n_components=6)
    yield names
    for name in names:
        db.drop_collection(name, missing_ok=True)


def _headers(svc_key):
    return {"Authorization": f"Bearer {svc_key['key']}"}


def _raw_outputs(name: str, allowed: bool) -> None:
    """Set the collection's opt-in to serving a raw model's outputs (settings['kahm']['raw_distances'])."""
    from pm_vector import db

    with db.connect() as conn:
        conn.execute("UPDATE pm_vector.collections SET settings = jsonb_set(coalesce(settings, '{}'::jsonb), "
                     "'{kahm}', jsonb_build_object('raw_distances', %s::boolean)) WHERE name = %s", [allowed, name])
        conn.commit()


def test_resolve_rows_carry_class_scores(service, svc_key, svc_admin_key, embedded, split):
    from pm_vector.db.kahm.roles import class_scores, fit_kahm_models

    Xq, yq = split.query
    with Client(service.url, svc_key["key"]) as c:
        req, secret = c.build_request(embedded, Xq[0], int(yq[0]), epsilon=1.0, protocol="privatemail_paper")
        before = c.resolve(embedded, req, k=5)
        assert before.get("kahm") is None
        assert all(row.get("class_scores") is None for row in before["rows"])
        fit = fit_kahm_models(embedded, n_components=8)
        assert c.kahm_models(embedded)[0]["model_id"] == fit["model_id"]
        # a raw model's outputs leave the database only where the collection opted in
        # (the policy of /kahm/distances)
        withheld = c.resolve(embedded, req, k=5)
        assert withheld.get("kahm") is None
        assert all(row.get("class_scores") is None and row.get("predicted") is None for row in withheld["rows"])
        _raw_outputs(embedded, True)
        res = c.resolve(embedded, req, k=5)
        assert res["kahm"] == {"model_id": fit["model_id"], "classes": list(range(10))}
        assert len(res["rows"]) == len(before["rows"])
        for row in res["rows"]:
            assert len(row["predicted"]) == len(row["class_scores"]) == len(row["item_ids"]) == 5
            S = np.asarray(row["class_scores"])
            assert S.shape == (5, 10) and np.all((S >= 0) & (S <= 1 + 1e-6))
            assert [int(np.argmax(s)) for s in S] == row["predicted"]  # Definition 8 peaks at the predicted class
        # the stored scores are the model's scores of the items' own features
        row = secret.pick(res["rows"])
        with Client(service.url, svc_admin_key["key"]) as admin:  # items by id: an admin key
            F = np.asarray(admin.items(embedded, row["item_ids"], include_features=True)["features"])
        ref = class_scores(embedded, F)
        np.testing.assert_allclose(np.asarray(row["class_scores"]), ref["scores"], rtol=1e-4, atol=1e-6)
        assert row["predicted"] == ref["predicted"].tolist()
        # the client's private query keeps them with its row
        hit = c.query(embedded, Xq[1], int(yq[1]), epsilon=1.0, k=5, protocol="privatemail_paper")
        assert len(hit["class_scores"]) == 5 and len(hit["predicted"]) == 5


def test_a_private_models_class_scores_need_no_opt_in(service, svc_key, split):
    """The policy withholds raw models' outputs only: a DP (noisy) model's scores come back without
    the opt-in, a raw model's do not, on the same collection and request."""
    from pm_vector import db
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.db.kahm.roles import fit_kahm_models
    from pm_vector.bench.demo import prepare_collection

    name = "svn_" + uuid.uuid4().hex[:8]
    prepare_collection(name, split)
    try:
        db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
        Xq, yq = split.query
        with Client(service.url, svc_key["key"]) as c:
            req, _ = c.build_request(name, Xq[0], int(yq[0]), epsilon=1.0, shortlist=5, release="gaussian")
            noisy = fit_kahm_models(name, kind="noisy", epsilon=4.0, value_range=(-1.0, 1.0), n_components=6)
            assert c.resolve(name, req).get("kahm") is None  # the default compact answer carries ids and codes only
            res = c.resolve(name, req, answer="full")  # class scores come with full answers
            assert res["kahm"] == {"model_id": noisy["model_id"], "classes": list(range(10))}
            assert all(len(row["class_scores"]) == len(row["item_ids"]) for row in res["rows"])
            raw = fit_kahm_models(name, n_components=6)  # now the current model: withheld
            res = c.resolve(name, req, answer="full")  # class scores come with full answers
            assert res.get("kahm") is None and all(row.get("class_scores") is None for row in res["rows"])
            r = httpx.post(f"{service.url}/collections/{name}/kahm/distances", json={"features": Xq[:2].tolist()},
                           headers=_headers(svc_key))
            assert r.status_code == 403  # the same policy, one home
            _raw_outputs(name, True)
            res = c.resolve(name, req, answer="full")  # class scores come with full answers
            assert res["kahm"]["model_id"] == raw["model_id"]
            assert all(len(row["predicted"]) == len(row["item_ids"]) for row in res["rows"])
    finally:
        db.drop_collection(name, missing_ok=True)


def test_kahm_endpoints_auth_and_bad_input(service, svc_key, parties, embedded):
    a = parties[0]
    url = f"{service.url}/collections/{a}/kahm/distances"
    good = {"features": [[0.0] * 64, [0.1] * 64]}
    assert httpx.post(url, json=good).status_code == 401
    assert httpx.post(url, json=good, headers={"Authorization": "Bearer pmv_nope"}).status_code == 401
    assert httpx.get(f"{service.url}/collections/{a}/kahm/models").status_code == 401
    r = httpx.post(url, json=good, headers=_headers(svc_key))
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["party"] == a and d["n_features"] == 64 and d["classes"] == list(range(10))
    assert sorted(d["distances"], key=int) == [str(c) for c in range(10)]  # JSON keys: the classes as strings
    assert all(len(v) == 2 for v in d["distances"].values())

    def refused(body, status, fragment, name=a):
        h = {**_headers(svc_key), "Content-Type": "application/json"}
        r = httpx.post(f"{service.url}/collections/{name}/kahm/distances", content=body, headers=h)
        assert r.status_code == status, r.text
        assert set(r.json()) == {"error", "message"} and fragment.lower() in r.json()["message"].lower(), r.json()

    refused(json.dumps({"features": [[0.0] * 5]}), 422, "the query has 5 features")
    refused(json.dumps(good).replace("0.1", "NaN", 1), 400, "NaN")
    refused('{"features": [[' + ", ".join(["1e400"] * 64) + "]]}", 422, "NaN or infinite")  # parses to inf
    refused(json.dumps({"features": [[0.0] * 64, [0.0] * 63]}), 422, "row 1 has 63 values")
    refused(json.dumps({"features": [["x"] * 64]}), 422, "only numbers")
    refused('{"features": [[' + ", ".join(["1" + "0" * 400] * 64) + "]]}", 422, "too large")
    refused(json.dumps({"features": []}), 422, "non-empty list")
    refused(json.dumps({"features": [[0.0] * 64], "model_id": "one"}), 422, "model_id")
    refused(json.dumps({"features": [[0.0] * 64], "model_id": 10**9}), 409, "no KAHM model 1000000000")
    refused(json.dumps({"features": [[0.0] * 64], "k": 3}), 422, "unknown field")
    refused(json.dumps({"features": [[0.0] * 64]}), 404, "unknown collection", name="no_such_collection_k")
    refused(b"{not json", 400, "not valid JSON")
    refused(json.dumps({"features": [[0.0] * 64] * 2001}), 413, "at most 2,000")
    with Client(service.url, svc_key["key"]) as c:
        models = c.kahm_models(a)
        assert len(models) == 1 and models[0]["is_current"] and models[0]["n_items"] == 150
        with pytest.raises(ServiceError, match="404"):
            c.kahm_models("no_such_collection_k")
    spec = httpx.get(service.url + "/openapi.json").json()
    assert "/collections/{name}/kahm/distances" in spec["paths"] and "/collections/{name}/kahm/models" in spec["paths"]
    row = spec["components"]["schemas"]["ResultRow"]["properties"]
    assert "class_scores" in row and "predicted" in row


def test_federated_with_a_remote_party_equals_local(service, svc_key, parties, split):
    from pm_vector.db.kahm.roles import federated_classify, party_distances

    a, b = parties
    Q = split.query[0]
    local = federated_classify([a, b], Q)
    with Client(service.url, svc_key["key"]) as c:
        remote_b = c.kahm_distances(b, Q)
        ref = party_distances(b, Q)
        assert remote_b["party"] == b and remote_b["classes"] == ref["classes"]
        assert remote_b["model_id"] == ref["model_id"] and set(remote_b["distances"]) == set(ref["distances"])
        for cls, v in ref["distances"].items():
            assert isinstance(remote_b["distances"][cls], np.ndarray)
            np.testing.assert_allclose(remote_b["distances"][cls], v, rtol=1e-12)
        mixed = federated_classify([a, lambda X: c.kahm_distances(b, X)], Q)
        with pytest.raises(ServiceError, match="422"):
            c.kahm_distances(b, Q[:, :10])
    assert mixed["predicted"].tolist() == local["predicted"].tolist() and mixed["party"] == local["party"]
    assert mixed["classes"] == local["classes"]
    np.testing.assert_allclose(mixed["distances"], local["distances"], rtol=1e-12)
    np.testing.assert_allclose(mixed["scores"], local["scores"], rtol=1e-12)
    assert [p["party"] for p in mixed["parties"]] == [a, b]
    assert np.mean(local["predicted"] == split.query[1]) > 0.5


def test_raw_distances_are_refused_without_the_opt_in(service, svc_key, split):
    """A raw model's distances separate members from non-members: 403 unless the collection opts in."""
    from pm_vector import db
    from pm_vector.db.kahm.roles import fit_kahm_models

    X, y = split.server
    name = "svr_" + uuid.uuid4().hex[:8]
    db.create_collection(name, X.shape[1], [int(c) for c in split.dataset.classes])
    try:
        db.ingest(name, X[:150], y[:150])
        fit_kahm_models(name, n_components=6)
        r = httpx.post(f"{service.url}/collections/{name}/kahm/distances", json={"features": X[:2].tolist()},
                       headers=_headers(svc_key))
        assert r.status_code == 403 and r.json()["error"] == "raw_distances_not_allowed", r.text
    finally:
        db.drop_collection(name, missing_ok=True)
