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
