"""One wire contract (issue 37, build item 3): the pydantic models of the resolve body are the
validators and the OpenAPI schema at once; the body's ``request`` is a discriminated union of the
request documents of the table of releases; the answer is declared, and real answers match it.

Before: ``ResolveBody`` declared the paper's request only (``/openapi.json`` showed neither the
default location request nor its answer), the declared answer (``ResolveResponse``, ``k``
required) matched neither a location answer nor a class-rows one, and a release registered in
the table was not part of the contract."""

from __future__ import annotations

from typing import Literal

import httpx
import jsonschema_rs
import numpy as np
import pytest
from pydantic import Field

from pm_vector.client.budget import MemoryBudget
from pm_vector.client.http import Client
from pm_vector.protocol import codec, releases
from pm_vector.protocol.answers_wire import LocationAnswer, RowsAnswer
from pm_vector.protocol.formats import LOCATION_FORMAT

RESOLVE = "/collections/{name}/resolve"


@pytest.fixture(scope="module")
def app():
    from pm_vector.service.app import create_app
    from pm_vector.service.settings import ServiceSettings

    return create_app(ServiceSettings(), pool=object())


def _answer_schema(spec: dict, media: str) -> dict:
    """The resolve endpoint's 200 schema in ``media``, with the document's components."""
    ok = spec["paths"][RESOLVE]["post"]["responses"]["200"]["content"][media]["schema"]
    return {**ok, "components": spec["components"]}


def test_openapi_shows_the_location_request_and_its_answer(app):
    spec = app.openapi()
    comps = spec["components"]["schemas"]
    body = comps["ResolveBody"]
    # the body's request: a union on "format", one member per served release, the location one among them
    req = body["properties"]["request"]
    mapping = req["discriminator"]["mapping"]
    assert req["discriminator"]["propertyName"] == "format"
    assert mapping[LOCATION_FORMAT] == "#/components/schemas/LocationRequestBody"
    assert {r["$ref"] for r in req["oneOf"]} == set(mapping.values())
    for rel in releases.RELEASES.values():  # every release with a wire model is in the union
        assert (rel.wire_format in mapping) == (rel.wire_model is not None), rel.name
    assert len(mapping) == 4
    loc = comps["LocationRequestBody"]
    assert loc["properties"]["format"]["const"] == LOCATION_FORMAT
    assert set(loc["required"]) >= {"format", "report", "level", "epsilon", "locations_digest", "candidates",
                                    "code_bytes"}
    assert loc["properties"]["candidates"]["maximum"] == 65_536 and loc["additionalProperties"] is False
    # the bounds the validators enforce are the schema's
    rows = comps["ClassRowsRequestBody"]["properties"]["rows"]["items"]["items"]
    assert rows["maximum"] == 1e12 and rows["minimum"] == -1e12
    assert comps["ClassRowsRequestBody"]["properties"]["shortlist"]["maximum"] == 1000
    # the answer: the location answer or the rows answer, in both media types
    for media in (codec.JSON, codec.MSGPACK):
        refs = {r["$ref"].rsplit("/", 1)[1] for r in comps["ResolveAnswer"]["anyOf"]}
        assert _answer_schema(spec, media)["$ref"] == "#/components/schemas/ResolveAnswer"
        assert refs == {"LocationAnswer", "ResolveResponse"}
    assert set(comps["LocationAnswer"]["required"]) >= {"item_ids", "codes_data", "n_items", "codes", "level",
                                                        "report"}


class _EchoRequest:
    """A test-only request type (what the table's ``request_type`` is for a release)."""

    def __init__(self, n: int):
        self.n = n

    @classmethod
    def from_dict(cls, d):
        return cls(d["n"])


def _echo_model():
    from pm_vector.protocol.wire import RequestBody

    class EchoRequestBody(RequestBody):
        format: Literal["test.echo/1"]
        n: int = Field(ge=1, le=50)

    return EchoRequestBody


def test_a_release_registered_at_run_time_is_in_the_union_and_the_schema(app):
    from pm_vector.service.errors import ApiError
    from pm_vector.service.resolve_body import parse_resolve_body
    from pm_vector.service.settings import ServiceSettings

    model = _echo_model()
    base = releases.RELEASES["location"]
    echo = releases.Release(name="test-echo", wire_format="test.echo/1", request_type=_EchoRequest,
                            answer_type=None, check_answer=None, guarantee=base.guarantee, client_plan=None,
                            resolver="tests:nothing", answers=("full",), wire_model=model)
    st = ServiceSettings()
    releases.register(echo)
    try:
        got = parse_resolve_body({"request": {"format": "test.echo/1", "n": 3}, "k": 2}, st, "c")
        assert got.release is echo and isinstance(got.request, _EchoRequest) and got.request.n == 3
        assert got.answer == {"compact": False, "code_bytes": None}
        with pytest.raises(ApiError) as bad:  # its model's bounds, in the same words as every release's
            parse_resolve_body({"request": {"format": "test.echo/1", "n": 51}}, st, "c")
        assert bad.value.status == 422 and "request.n must be less than or equal to 50" in bad.value.message
        spec = app.openapi()
        assert spec["components"]["schemas"]["ResolveBody"]["properties"]["request"]["discriminator"]["mapping"][
            "test.echo/1"] == "#/components/schemas/EchoRequestBody"
    finally:
        releases.unregister("test-echo")
    with pytest.raises(ApiError) as gone:
        parse_resolve_body({"request": {"format": "test.echo/1", "n": 3}}, st, "c")
    assert gone.value.status == 422 and "unsupported request format" in gone.value.message
    assert "test.echo/1" not in app.openapi()["components"]["schemas"]["ResolveBody"]["properties"]["request"][
        "discriminator"]["mapping"]


def _post(service, key, name, body: dict, accept: str) -> httpx.Response:
    return httpx.post(f"{service.url}/collections/{name}/resolve", content=codec.encode(body, codec.JSON),
                      headers={"Authorization": f"Bearer {key['key']}", "Content-Type": codec.JSON,
                               "Accept": accept}, timeout=60)


@pytest.mark.parametrize("release", ["location", "gaussian", "paper"])
def test_real_answers_match_the_declared_answer(service, svc_collection, svc_key, svc_split, release):
    """The answer the service writes, in JSON, is valid against the schema ``/openapi.json``
    declares for it; in msgpack (arrays as the codec's extension, codes as bin) against its model."""
    x, y = svc_split.query[0][0], int(svc_split.query[1][0])
    with Client(service.url, svc_key["key"], budget=MemoryBudget()) as c:
        kw = {"protocol": "privatemail_paper"} if release == "paper" else {"release": release}
        req, _ = c.build_request(svc_collection, x, y, epsilon=1.0, **kw)
    body = {"request": req.to_dict(), "k": 8}
    spec = httpx.get(f"{service.url}/openapi.json").json()
    r = _post(service, svc_key, svc_collection, body, codec.JSON)
    assert r.status_code == 200, r.text
    jsonschema_rs.validate(_answer_schema(spec, codec.JSON), r.json())
    model = LocationAnswer if release == "location" else RowsAnswer
    model.model_validate_json(r.content)
    m = _post(service, svc_key, svc_collection, body, codec.MSGPACK)
    assert m.status_code == 200 and m.headers["content-type"].startswith(codec.MSGPACK)
    got = model.model_validate(codec.decode(m.content, codec.MSGPACK, arrays="lists"))
    if release == "location":
        assert isinstance(got.codes_data, bytes) and len(got.codes_data) == len(got.item_ids) * req.code_bytes
        assert got.n_items >= len(got.item_ids) and np.unique(got.item_ids).size == len(got.item_ids)
