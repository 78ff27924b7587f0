"""Seeded requests (noise that follows from a seed: not a private release) reach no service that
has not been told to allow them: a service with default settings refuses them with a 403 naming
the setting and logs nothing; one with ``allow_seeded_requests`` (tests only) answers them."""

from __future__ import annotations

import json

import httpx
import pytest

from pm_vector.client.budget import MemoryBudget
from pm_vector.client.http import Client
from pm_vector.errors import InvalidInputError
from pm_vector.service.settings import ServiceSettings


@pytest.fixture(scope="module")
def bodies(service, svc_collection, svc_key, svc_split):
    """{"rows"|"paper": (seeded body, unseeded body)}, built by the real client (seeded ones through
    its internal path: no public method takes a seed)."""
    Xq, yq = svc_split.query
    out = {}
    with Client(service.url, svc_key["key"], budget=MemoryBudget()) as c:
        for kind, kw in (("rows", {"shortlist": 16}), ("paper", {"protocol": "privatemail_paper"})):
            seeded, _ = c._build_request(svc_collection, Xq[0], int(yq[0]), epsilon=1.0, rng=3, **kw)
            plain, _ = c._build_request(svc_collection, Xq[0], int(yq[0]), epsilon=1.0, **kw)
            out[kind] = ({"request": seeded.to_dict(), "k": 8}, {"request": plain.to_dict(), "k": 8})
        assert c.budget.status(c.budget_key())["releases"] == 2  # the seeded ones were not charged
    assert out["rows"][0]["request"]["seeded"] is True and out["paper"][0]["request"]["params"]["seeded"] is True
    return out


def _post(svc, name, key, body):
    return httpx.post(f"{svc.url}/collections/{name}/resolve", content=json.dumps(body),
                      headers={"Authorization": f"Bearer {key['key']}", "Content-Type": "application/json"},
                      timeout=60)


@pytest.mark.parametrize("kind", ["rows", "paper"])
def test_a_default_service_refuses_seeded_requests(service, svc_collection, svc_key, bodies, kind, requests_logged):
    seeded, plain = bodies[kind]
    assert not service.settings.allow_seeded_requests
    before = requests_logged(svc_collection)
    r = _post(service, svc_collection, svc_key, seeded)
    assert r.status_code == 403 and r.json()["error"] == "seeded_request"
    assert "allow_seeded_requests" in r.json()["message"] and "PM_VECTOR_SERVICE_ALLOW_SEEDED_REQUESTS" in \
        r.json()["message"]
    assert requests_logged(svc_collection) == before  # nothing written
    # a mark that is not a boolean is refused as malformed, never read as "not seeded"
    marked = json.loads(json.dumps(plain))
    if kind == "rows":
        marked["request"]["seeded"] = "yes"
    else:
        marked["request"]["params"]["seeded"] = 1
    r = _post(service, svc_collection, svc_key, marked)
    assert r.status_code == 422 and r.json()["error"] == "invalid_input", r.text
    assert requests_logged(svc_collection) == before
    # the same request unseeded is answered
    assert _post(service, svc_collection, svc_key, plain).status_code == 200
    assert requests_logged(svc_collection) == before + 1


@pytest.mark.parametrize("kind", ["rows", "paper"])
def test_a_service_set_to_allow_them_answers_seeded_requests(seeded_service, svc_collection, svc_key, bodies, kind):
    assert seeded_service.settings.allow_seeded_requests
    r = _post(seeded_service, svc_collection, svc_key, bodies[kind][0])
    assert r.status_code == 200, r.text
    assert len(r.json()["rows"]) == 10


def test_the_setting_is_validated(monkeypatch):
    assert ServiceSettings().allow_seeded_requests is False
    monkeypatch.setenv("PM_VECTOR_SERVICE_ALLOW_SEEDED_REQUESTS", "1")
    assert ServiceSettings.from_env().allow_seeded_requests is True
    monkeypatch.setenv("PM_VECTOR_SERVICE_ALLOW_SEEDED_REQUESTS", "off")
    assert ServiceSettings.from_env().allow_seeded_requests is False
    monkeypatch.setenv("PM_VECTOR_SERVICE_ALLOW_SEEDED_REQUESTS", "maybe")
    with pytest.raises(InvalidInputError, match="PM_VECTOR_SERVICE_ALLOW_SEEDED_REQUESTS"):
        ServiceSettings.from_env()
    for bad in ("yes", 1, None):
        with pytest.raises(InvalidInputError, match="allow_seeded_requests must be true or false"):
            ServiceSettings(allow_seeded_requests=bad)
