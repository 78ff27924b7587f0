"""The resolve route, the hottest, states its checks as ONE dependency
(:func:`pm_vector.service.deps.resolve_context`): FastAPI solves every ``Depends`` on every request,
and the seven it had were about a tenth of a cached answer's CPU. The checks and their order are
those of ``AUTH + JSON_BODY + NEG``: 404 for a malformed collection name (or one outside the key's scope), 415 for a body
of another type, 406 for an Accept the service cannot meet, each before the body is read."""

from __future__ import annotations

import httpx


def test_resolve_route_has_one_dependency():
    from pm_vector.service.deps import resolve_context
    from pm_vector.service.routers.resolve import router

    (route,) = [r for r in router.routes if r.path == "/collections/{name}/resolve"]
    assert [d.call for d in route.dependant.dependencies] == [resolve_context]


def test_resolve_checks_in_order(service, svc_collection, svc_key):
    url = service.url + "/collections/{}/resolve"
    auth = {"Authorization": f"Bearer {svc_key['key']}"}
    json_png = {**auth, "Content-Type": "application/json", "Accept": "image/png"}
    r = httpx.post(url.format("Not%20a%20name"), content=b"{}",
                   headers={**auth, "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"] == "not_found", r.text
    r = httpx.post(url.format(svc_collection), content=b"{}", headers={**json_png, "Content-Type": "text/plain"},
                   timeout=60)
    assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type", r.text
    r = httpx.post(url.format(svc_collection), content=b"{}", headers=json_png, timeout=60)
    assert r.status_code == 406, r.text
    r = httpx.post(url.format(svc_collection), content=b"{}", headers={**auth, "Content-Type": "application/json"},
                   timeout=60)
    assert r.status_code == 422, r.text  # the checks passed; the body is read and refused


def test_resolve_is_answered_without_fastapis_router(service, svc_collection, svc_key, svc_split, monkeypatch):
    """``POST /collections/{name}/resolve`` is answered by the innermost middleware
    (:class:`pm_vector.service.middleware.hot_route.ResolveRoute`), not by FastAPI's router and
    its dependency solving (a third of a repeated request's CPU in-process): with FastAPI's
    ``solve_dependencies`` broken, every other route fails and resolve still answers, its
    checks (404, 415, 406) and its errors (422) as the route's."""
    import fastapi.routing

    from pm_vector.client.budget import MemoryBudget
    from pm_vector.client.http import Client
    from pm_vector.protocol.codec import MSGPACK, encode

    Xq, yq = svc_split.query
    with Client(service.url, svc_key["key"], budget=MemoryBudget(default_epsilon=10.0, default_delta=0.5)) as c:
        req, _ = c.build_request(svc_collection, Xq[0], int(yq[0]), epsilon=1.0)
    body = encode({"request": req.to_dict(), "k": 8}, MSGPACK)

    async def broken(*a, **k):
        raise RuntimeError("FastAPI's dependency solving ran")

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", broken)
    auth = {"Authorization": f"Bearer {svc_key['key']}"}
    r = httpx.get(f"{service.url}/collections/{svc_collection}", headers=auth, timeout=60)
    assert r.status_code == 500, r.text  # the router's routes do need it
    url = f"{service.url}/collections/{svc_collection}/resolve"
    for _ in range(2):  # the full path, then the repeated request's one statement
        r = httpx.post(url, content=body, headers={**auth, "Content-Type": MSGPACK, "Accept": MSGPACK}, timeout=60)
        assert r.status_code == 200 and r.headers["content-type"] == MSGPACK, r.text
    r = httpx.post(url, content=b"{}", headers={**auth, "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 422 and r.json()["error"] == "invalid_input", r.text
    r = httpx.post(url, content=b"{}", headers={**auth, "Content-Type": "text/plain"}, timeout=60)
    assert r.status_code == 415, r.text
    r = httpx.post(service.url + "/collections/Not%20a%20name/resolve", content=b"{}",
                   headers={**auth, "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 404, r.text
    r = httpx.post(url, content=b"{}", headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 401, r.text
