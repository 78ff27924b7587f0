"""Every bad case of issue #11 through the real uvicorn server and one keep-alive client: a 4xx,
never a 5xx, and the next request on the same connection is served."""

from __future__ import annotations

import json

import httpx
import pytest


@pytest.fixture(scope="module")
def admin_key(pm_home):
    from pm_vector.service.auth import create_key

    return create_key("fuzz admin", role="admin")


@pytest.fixture(scope="module")
def paper_body(service, svc_collection, svc_key, svc_split):
    from pm_vector.client.budget import MemoryBudget
    from pm_vector.client.http import Client

    with Client(service.url, svc_key["key"], budget=MemoryBudget(default_epsilon=100.0)) as c:
        req, _ = c.build_request(svc_collection, svc_split.query[0][0], int(svc_split.query[1][0]), epsilon=1.0,
                                 protocol="privatemail_paper")
    return {"request": req.to_dict(), "k": 8}


@pytest.fixture(scope="module")
def rows_body(service, svc_collection, svc_key, svc_split):
    from pm_vector.client.budget import MemoryBudget
    from pm_vector.client.http import Client

    with Client(service.url, svc_key["key"], budget=MemoryBudget(default_epsilon=100.0)) as c:
        req, _ = c.build_request(svc_collection, svc_split.query[0][0], int(svc_split.query[1][0]), epsilon=1.0,
                                 shortlist=16, release="gaussian")
    return {"request": req.to_dict(), "k": 8}


def _with(body, **kw):
    b = json.loads(json.dumps(body))
    b["request"].update(kw)
    return b


def _cases(name, paper, rows, max_body):
    """(label, method, path, key kind, body bytes or None, extra headers)."""
    deep = b"[" * 100_000 + b"]" * 100_000
    J = lambda d: json.dumps(d).encode()  # noqa: E731
    return [
        ("nul in name", "GET", "/collections/a%00b", "query", None, {}),
        ("nul in name (anchor)", "GET", "/collections/a%00b/anchor", "query", None, {}),
        ("nul in name (resolve)", "POST", "/collections/a%00b/resolve", "query", J(paper), {}),
        ("newline in name", "GET", "/collections/abc%0A", "query", None, {}),
        ("ids >= 2**63", "POST", f"/collections/{name}/items", "admin", J({"ids": [2 ** 63, 1]}), {}),
        ("ids < -2**63", "POST", f"/collections/{name}/items", "admin", J({"ids": [-(2 ** 63) - 1]}), {}),
        ("items unknown field", "POST", f"/collections/{name}/items", "admin", J({"ids": [1], "x": 1}), {}),
        ("items deep json", "POST", f"/collections/{name}/items", "admin", deep, {}),
        ("model_id >= 2**63", "POST", f"/collections/{name}/kahm/distances", "query",
         J({"features": [[0.0] * 64], "model_id": 2 ** 63}), {}),
        ("deep json resolve", "POST", f"/collections/{name}/resolve", "query", deep, {}),
        ("deep json distances", "POST", f"/collections/{name}/kahm/distances", "query", deep, {}),
        ("huge body before auth", "POST", f"/collections/{name}/resolve", None, b"x" * (max_body + 1), {}),
        ("unknown body field", "POST", f"/collections/{name}/resolve", "query", J({**paper, "extra": 1}), {}),
        ("unknown request field", "POST", f"/collections/{name}/resolve", "query", J(_with(paper, hack="x")), {}),
        ("eps = 0", "POST", f"/collections/{name}/resolve", "query", J(_with(paper, epsilon=0)), {}),
        ("eps < 0", "POST", f"/collections/{name}/resolve", "query", J(_with(paper, epsilon=-1.0)), {}),
        ("delta = 1", "POST", f"/collections/{name}/resolve", "query", J(_with(paper, delta=1.0)), {}),
        ("delta = 0", "POST", f"/collections/{name}/resolve", "query", J(_with(paper, delta=0.0)), {}),
        ("negative sensitivity", "POST", f"/collections/{name}/resolve", "query", J(_with(paper, sensitivity=-2.0)),
         {}),
        ("mechanism not in enum", "POST", f"/collections/{name}/resolve", "query",
         J(_with(paper, mechanism="m" * 100_000)), {}),
        ("huge params", "POST", f"/collections/{name}/resolve", "query", J(_with(paper, params={"x": "p" * 50_000})),
         {}),
        ("anchor id >= 2**63", "POST", f"/collections/{name}/resolve", "query",
         J(_with(paper, anchor_ids=[2 ** 63] * len(paper["request"]["anchor_ids"]))), {}),
        ("rows x k over the cap", "POST", f"/collections/{name}/resolve", "query",
         J({**paper, "k": 100, "request": {**paper["request"], "embedding": paper["request"]["embedding"] * 2,
                                           "n_query_rows": 2 * len(paper["request"]["embedding"])}}),
         {}),
        ("job seed 2**64", "POST", f"/collections/{name}/jobs", "admin", J({"params": {"n_components": 8},
                                                                            "seed": 2 ** 64}), {}),
        ("job n_components 2", "POST", f"/collections/{name}/jobs", "admin", J({"params": {"n_components": 2}}), {}),
        ("job n_extend_iter 1e6", "POST", f"/collections/{name}/jobs", "admin",
         J({"params": {"n_components": 8, "n_extend_iter": 1_000_000}}), {}),
        ("job id with NUL", "GET", "/jobs/a%00b", "admin", None, {}),
        ("NUL in a logged string", "POST", f"/collections/{name}/resolve", "query",
         J(_with(rows, frames_digest="ab\x00cd")), {}),
        ("NUL in paper params", "POST", f"/collections/{name}/resolve", "query", J(_with(paper, params={"a": "\x00"})),
         {}),
        ("class rows eps < 0", "POST", f"/collections/{name}/resolve", "query", J(_with(rows, epsilon=-1.0)), {}),
        ("class rows delta 2", "POST", f"/collections/{name}/resolve", "query", J(_with(rows, delta=2.0)), {}),
        ("class rows unknown field", "POST", f"/collections/{name}/resolve", "query", J(_with(rows, extra=1)), {}),
        ("class rows shortlist 2**63", "POST", f"/collections/{name}/resolve", "query",
         J(_with(rows, shortlist=2 ** 63)), {}),
        ("not utf-8", "POST", f"/collections/{name}/resolve", "query", b"\xff\xfe{", {}),
        ("nan literal", "POST", f"/collections/{name}/resolve", "query", b'{"request": NaN}', {}),
        # issue 16, item 12: accepted with 200 before
        ("class rows eps true", "POST", f"/collections/{name}/resolve", "query", J(_with(rows, epsilon=True)), {}),
        ("class rows seeded 'yes'", "POST", f"/collections/{name}/resolve", "query", J(_with(rows, seeded="yes")),
         {}),
        ("class rows eps 1e-320", "POST", f"/collections/{name}/resolve", "query", J(_with(rows, epsilon=1e-320)),
         {}),
        ("class rows delta 1e-320", "POST", f"/collections/{name}/resolve", "query", J(_with(rows, delta=1e-320)), {}),
        ("paper eps 1e-320", "POST", f"/collections/{name}/resolve", "query", J(_with(paper, epsilon=1e-320)), {}),
        ("class rows noise_scale 1e308", "POST", f"/collections/{name}/resolve", "query",
         J(_with(rows, noise_scale=1e308)), {}),
        ("class rows rows 1e308", "POST", f"/collections/{name}/resolve", "query",
         J(_with(rows, rows=[[1e308] * len(r) for r in rows["request"]["rows"]])), {}),
        ("class rows nested grid", "POST", f"/collections/{name}/resolve", "query",
         J(_with(rows, grid=[[g] for g in rows["request"]["grid"]])), {}),
        ("paper classical at eps 4", "POST", f"/collections/{name}/resolve", "query",
         J(_with(paper, mechanism="classical", epsilon=4.0)), {}),
        ("text/plain body", "POST", f"/collections/{name}/resolve", "query", J(rows), {"Content-Type": "text/plain"}),
        ("paper params 7 KB invented", "POST", f"/collections/{name}/resolve", "query",
         J(_with(paper, params={**paper["request"]["params"], "invented": "i" * 7000})), {}),
    ]


def test_fuzz_no_5xx_and_connection_stays_usable(service, svc_collection, svc_key, admin_key, paper_body, rows_body,
                                                   requests_logged):
    keys = {"query": svc_key["key"], "admin": admin_key["key"]}
    before = requests_logged(svc_collection)
    cases = _cases(svc_collection, paper_body, rows_body, service.settings.max_body_bytes)
    seen, reused = {}, {}
    # one connection: every next request must reuse it
    with httpx.Client(base_url=service.url, timeout=60, limits=httpx.Limits(max_connections=1)) as c:
        for label, method, path, kind, body, extra in cases:
            h = {"Content-Type": "application/json", **extra}
            if kind:
                h["Authorization"] = f"Bearer {keys[kind]}"
            req = c.build_request(method, path, content=body, headers=h)
            r = c.send(req)
            assert 400 <= r.status_code < 500, (label, r.status_code, r.text[:300])
            assert set(r.json()) == {"error", "message"}, (label, r.text[:300])
            seen[label] = r.status_code
            ok = c.get(f"/collections/{svc_collection}", headers={"Authorization": f"Bearer {svc_key['key']}"})
            assert ok.status_code == 200, (label, ok.status_code, ok.text[:300])
            same = ok.extensions["network_stream"] is r.extensions["network_stream"]
            reused[label] = same
    assert requests_logged(svc_collection) == before  # nothing refused was logged
    # the same TCP connection answered the next request (not a silent reconnect)
    assert [k for k, v in reused.items() if not v] == []
    assert seen["huge body before auth"] == 401  # authentication comes before the body
    assert seen["eps = 0"] == seen["delta = 1"] == seen["negative sensitivity"] == 422
    assert seen["rows x k over the cap"] == 413 and seen["job n_components 2"] == 422
    assert seen["text/plain body"] == 415
    strict = [k for k in seen if k.startswith(("class rows eps", "class rows seeded", "class rows delta 1e",
                                               "class rows noise", "class rows rows", "class rows nested",
                                               "paper eps 1e", "paper classical", "paper params 7"))]
    assert len(strict) == 11 and {seen[k] for k in strict} == {422}, {k: seen[k] for k in strict}
