"""Bad input through the API: each a clear 4xx with a message, nothing written, the service keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from pm_vector.client.budget import MemoryBudget
from pm_vector.client.http import Client


@pytest.fixture(scope="module")
def valid(service, svc_collection, svc_key, svc_split):
    with Client(service.url, svc_key["key"], budget=MemoryBudget()) as c:
        req, _ = c.build_request(svc_collection, svc_split.query[0][0], int(svc_split.query[1][0]), epsilon=1.0,
                                 protocol="privatemail_paper")
    return req.to_dict()


@pytest.fixture(scope="module")
def valid_rows(service, svc_collection, svc_key, svc_split):
    with Client(service.url, svc_key["key"], budget=MemoryBudget()) as c:
        req, _ = c.build_request(svc_collection, svc_split.query[0][0], int(svc_split.query[1][0]), epsilon=1.0,
                                 shortlist=16, release="gaussian")
    return req.to_dict()


def _post(service, svc_key, name, content, headers=None):
    h = {"Authorization": f"Bearer {svc_key['key']}", "Content-Type": "application/json", **(headers or {})}
    return httpx.post(f"{service.url}/collections/{name}/resolve", content=content, headers=h, timeout=60)


def _body(req, **over):
    return json.dumps({"request": req, "k": 8, **over})


def _mutated(valid, **changes):
    d = json.loads(json.dumps(valid))
    d.update(changes)
    return d


CASES = {
    "malformed_json": (lambda v: b'{"request": {"embedding": [[1, 2', 400, "not valid JSON"),
    "empty_body": (lambda v: b"", 400, "empty"),
    "not_utf8": (lambda v: b"\xff\xfe{}", 400, "JSON"),
    "nan_literal": (lambda v: _body(v).replace("]", ", NaN]", 1).encode(), 400, "NaN"),
    "infinity_literal": (lambda v: _body(v).replace("]", ", Infinity]", 1).encode(), 400, "Infinity"),
    "body_not_object": (lambda v: b"[1, 2, 3]", 422, "JSON object"),
    "unknown_field": (lambda v: _body(v, extra=1).encode(), 422, "unknown field"),
    "request_missing": (lambda v: b'{"k": 8}', 422, "'request'"),
    "ragged_rows": (lambda v: _body(_mutated(v, embedding=[r[:-1] if i == 3 else r for i, r in
                                                           enumerate(v["embedding"])])).encode(), 422, "row 3"),
    "string_in_embedding": (lambda v: _body(_mutated(v, embedding=[["x"] * 8] + v["embedding"][1:])).encode(), 422,
                            "only numbers"),
    "wrong_dimension": (lambda v: _body(_mutated(v, embedding=[r[:5] for r in v["embedding"]])).encode(), 422,
                        "dimension"),
    "row_count_mismatch": (lambda v: _body(_mutated(v, embedding=v["embedding"][:-1])).encode(), 422, "rows"),
    "missing_fields": (lambda v: _body({"embedding": v["embedding"], "n_query_rows": 10}).encode(), 422,
                       "missing"),
    "n_query_rows_bad": (lambda v: _body(_mutated(v, n_query_rows=-1)).encode(), 422, "n_query_rows"),
    "k_zero": (lambda v: _body(v, k=0).encode(), 422, "k must be"),
    "k_huge": (lambda v: _body(v, k=10**6).encode(), 422, "k must be"),
    "anchor_ids_mismatch": (lambda v: _body(_mutated(v, anchor_ids=["9999:" + str(i) for i in
                                                                    range(len(v["anchor_ids"]))])).encode(), 422,
                            "anchor"),
    "foreign_frame": (lambda v: _body(_mutated(v, embedding=[[float((i * 7 + j * 13) % 11) for j in range(8)]
                                                             for i in range(len(v["embedding"]))])).encode(), 422,
                      "frame"),
    "too_many_rows": (lambda v: _body(_mutated(v, embedding=[[0.0] * 8] * 2001)).encode(), 413, "at most 2,000"),
    "too_many_dims": (lambda v: _body(_mutated(v, embedding=[[0.0] * 65] * 10)).encode(), 413, "at most 64"),
    "huge_payload": (lambda v: b'{"request": "' + b"x" * (3 * 1024 * 1024) + b'"}', 413, "limit"),
    # strict wire types and bounds (pm_vector.protocol.bounds): a boolean is not a number, and finite
    # but absurd values are refused
    "epsilon_true": (lambda v: _body(_mutated(v, epsilon=True)).encode(), 422, "epsilon"),
    "epsilon_subnormal": (lambda v: _body(_mutated(v, epsilon=1e-320)).encode(), 422, "epsilon"),
    "delta_subnormal": (lambda v: _body(_mutated(v, delta=1e-320)).encode(), 422, "delta"),
    "noise_sigma_1e308": (lambda v: _body(_mutated(v, noise_sigma=1e308)).encode(), 422, "noise_sigma"),
    "embedding_1e308": (lambda v: _body(_mutated(v, embedding=[[1e308] * len(v["embedding"][0])] +
                                                 v["embedding"][1:])).encode(), 422, "beyond"),
    "classical_at_eps_4": (lambda v: _body(_mutated(v, mechanism="classical", epsilon=4.0)).encode(), 422,
                           "classical"),
    "params_invented_field": (lambda v: _body(_mutated(v, params={**v["params"], "note": "n" * 7000})).encode(), 422,
                              "unknown params"),
    "params_unbounded_value": (lambda v: _body(_mutated(v, params={**v["params"], "dp_sigma": 1e308})).encode(), 422,
                               "dp_sigma"),
    "params_frame_invented": (lambda v: _body(_mutated(v, params={**v["params"], "frame": {
        **v["params"]["frame"], "x": 1}})).encode(), 422, "params.frame"),
    "params_seeded_string": (lambda v: _body(_mutated(v, params={**v["params"], "seeded": "no"})).encode(), 422,
                             "seeded"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_refused(case, service, svc_collection, svc_key, valid, requests_logged):
    make, status, fragment = CASES[case]
    before = requests_logged(svc_collection)
    r = _post(service, svc_key, svc_collection, make(valid))
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "message"} and fragment.lower() in body["message"].lower(), body
    assert requests_logged(svc_collection) == before


def test_chunked_huge_payload_refused(service, svc_key, svc_collection, requests_logged):
    before = requests_logged(svc_collection)

    def gen():
        for _ in range(40):
            yield b"x" * (128 * 1024)

    r = httpx.post(f"{service.url}/collections/{svc_collection}/resolve", content=gen(),
                   headers={"Authorization": f"Bearer {svc_key['key']}", "Content-Type": "application/json"},
                   timeout=60)
    assert r.status_code == 413 and "limit" in r.json()["message"]
    assert requests_logged(svc_collection) == before


@pytest.fixture(scope="module")
def admin_key(pm_home):
    from pm_vector.service.auth import create_key

    return create_key("bad-input admin", role="admin")


def test_unknown_collection_and_paths(service, svc_key, admin_key, valid):
    r = _post(service, svc_key, "no_such_collection", _body(valid).encode())
    assert r.status_code in (404, 422) and "no_such_collection" in r.json()["message"]
    h = {"Authorization": f"Bearer {svc_key['key']}"}
    r = httpx.get(f"{service.url}/collections/no_such_collection", headers=h)
    assert r.status_code == 404 and "unknown collection" in r.json()["message"]
    r = httpx.get(f"{service.url}/collections/no_such_collection/anchor", headers=h)
    assert r.status_code == 404
    r = httpx.get(f"{service.url}/nowhere", headers=h)
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    h = {"Authorization": f"Bearer {admin_key['key']}"}  # jobs need an admin key
    r = httpx.post(f"{service.url}/collections/x/jobs", headers={**h, "Content-Type": "application/json"},
                   content=b"{bad")
    assert r.status_code == 400 and r.json()["error"] == "malformed_json" and "not valid JSON" in r.json()["message"]
    r = httpx.post(f"{service.url}/collections/x/jobs", headers=h, json={"params": [1], "seed": "x"})
    assert r.status_code == 422 and "params" in r.json()["message"]


def test_service_keeps_serving_after_bad_input(service, svc_collection, svc_key, svc_split, requests_logged):
    for case in ("malformed_json", "huge_payload", "nan_literal"):
        _post(service, svc_key, svc_collection, CASES[case][0]({"embedding": [[0.0]], "anchor_ids": []}))
    assert httpx.get(service.url + "/health").json()["status"] == "ok"
    before = requests_logged(svc_collection)
    with Client(service.url, svc_key["key"]) as c:
        r = c.query(svc_collection, svc_split.query[0][2], int(svc_split.query[1][2]), epsilon=1.0)
    assert len(r["item_ids"]) == 8 and requests_logged(svc_collection) == before + 1


ROW_CASES = {
    "wrong_digest": (lambda v: _mutated(v, frames_digest="0" * 32), "public anchor"),
    "row_missing": (lambda v: _mutated(v, rows=v["rows"][:-1], sigmas=v["sigmas"][:-1], classes=v["classes"][:-1]),
                    "row"),
    "wrong_row_dim": (lambda v: _mutated(v, rows=[r[:3] for r in v["rows"]]), "coordinates"),
    "shortlist_zero": (lambda v: _mutated(v, shortlist=0), "shortlist"),
    "shortlist_huge": (lambda v: _mutated(v, shortlist=10**6), "shortlist"),
    "sigma_negative": (lambda v: _mutated(v, sigmas=[-1.0] * len(v["sigmas"])), "sigmas"),
    "strings_in_rows": (lambda v: _mutated(v, rows=[["x"] * 4] + v["rows"][1:]), "only numbers"),
    "other_collection": (lambda v: _mutated(v, collection="elsewhere"), "collection"),
    "unknown_field": (lambda v: _mutated(v, params="x" * 1000), "unknown request field"),
    "delta_one": (lambda v: _mutated(v, delta=1.0), "delta"),
    "epsilon_true": (lambda v: _mutated(v, epsilon=True), "epsilon"),
    "seeded_string": (lambda v: _mutated(v, seeded="yes"), "seeded"),
    "epsilon_subnormal": (lambda v: _mutated(v, epsilon=1e-320), "epsilon"),
    "delta_subnormal": (lambda v: _mutated(v, delta=1e-320), "delta"),
    "noise_scale_1e308": (lambda v: _mutated(v, noise_scale=1e308), "noise_scale"),
    "rows_1e308": (lambda v: _mutated(v, rows=[[1e308] * len(v["rows"][0])] + v["rows"][1:]), "beyond"),
    "grid_nested": (lambda v: _mutated(v, grid=[[g] for g in v["grid"]]), "grid"),
    "sigmas_nested": (lambda v: _mutated(v, sigmas=[[s] for s in v["sigmas"]]), "sigmas"),
}


@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_bad_pm_vector_request_refused(case, service, svc_collection, svc_key, valid_rows, requests_logged):
    make, needle = ROW_CASES[case]
    before = requests_logged(svc_collection)
    r = _post(service, svc_key, svc_collection, _body(make(valid_rows)))
    assert r.status_code == 422, (case, r.status_code, r.text)
    assert needle in r.json()["message"], (case, r.json())
    assert requests_logged(svc_collection) == before
    ok = _post(service, svc_key, svc_collection, _body(valid_rows))  # the service keeps serving
    assert ok.status_code == 200 and len(ok.json()["rows"]) == len(valid_rows["rows"])


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                   "application/jsonx", "text/json"])
def test_body_of_another_media_type_refused(ctype, service, svc_collection, svc_key, svc_admin_key, valid_rows,
                                            requests_logged):
    """Only ``application/json`` bodies are read: any other Content-Type (or none) is 415 on every
    endpoint with a body, and nothing is logged."""
    before = requests_logged(svc_collection)
    body = _body(valid_rows).encode()
    posts = [(f"/collections/{svc_collection}/resolve", svc_key, body),
             (f"/collections/{svc_collection}/kahm/distances", svc_key, b'{"features": [[0.0]]}'),
             (f"/collections/{svc_collection}/items", svc_admin_key, b'{"ids": [1]}'),
             (f"/collections/{svc_collection}/jobs", svc_admin_key, b'{"params": {"n_components": 8}}')]
    for path, key, content in posts:
        h = {"Authorization": f"Bearer {key['key']}"}
        if ctype is not None:
            h["Content-Type"] = ctype
        r = httpx.post(service.url + path, content=content, headers=h, timeout=60)
        assert r.status_code == 415, (path, r.status_code, r.text)
        assert r.json()["error"] == "unsupported_media_type" and "application/json" in r.json()["message"]
    assert requests_logged(svc_collection) == before
    ok = _post(service, svc_key, svc_collection, body, {"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200, ok.text


def test_paper_log_stores_the_validated_params(service, svc_collection, svc_key, valid, requests_logged):
    """The request log keeps the paper request's known params, as validated, and nothing else."""
    from pm_vector import db
    from pm_vector.protocol import bounds as wire

    r = _post(service, svc_key, svc_collection, _body(valid))
    assert r.status_code == 200, r.text
    logged = db.list_requests(svc_collection, limit=1)[0]
    req = logged["request"] if "request" in logged else logged["request_json"]
    req = json.loads(req) if isinstance(req, str) else req
    assert set(req["params"]) <= set(wire.PAPER_PARAMS) and set(req["params"]["frame"]) <= set(wire.FRAME_PARAMS)
    assert req["params"] == wire.paper_params(valid["params"])
