"""Issue #37, build item 3 remainder: a request document's fields are declared ONCE, in its request
type (a dataclass of ``pm_vector.protocol``, each field with its wire type); the pydantic model the
service validates with and ``/openapi.json`` shows is made from them
(:func:`pm_vector.protocol.wire_types.body_model`), and so are the keys ``from_dict`` reads. Adding
a field to a request type is one line there: the test below adds one to a test-only request type and
sees it validated and in the schema, with no other declaration."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from pm_vector.protocol import releases
from pm_vector.protocol.wire import RequestBody
from pm_vector.protocol.wire_types import body_model, int_in, wire, wire_names

FORMAT = "tests.wired/1"


@dataclass
class _Wired:
    n: int = field(metadata=wire(int_in(1, 50, "Neighbours asked for.")))
    epsilon: float = 1.0  # not on the wire: no wire type

    @classmethod
    def from_dict(cls, d):
        need, optional = wire_names(cls)
        return cls(**{k: d[k] for k in need + optional if k in d})


@dataclass
class _WiredPlus(_Wired):
    # the new field: this one line is all it takes
    flavor: int = field(default=1, metadata=wire(int_in(1, 3, "A new field of the request.")))


@pytest.fixture(scope="module")
def app():
    from pm_vector.service.app import create_app
    from pm_vector.service.settings import ServiceSettings

    return create_app(ServiceSettings(), pool=object())


def _served(request_type):
    model = body_model(request_type, RequestBody, FORMAT, name="WiredRequestBody")
    base = releases.RELEASES["location"]
    return releases.register(releases.Release(
        name="test-wired", wire_format=FORMAT, request_type=request_type, answer_type=None, check_answer=None,
        guarantee=base.guarantee, client_plan=None, resolver="tests:nothing", answers=("full",), wire_model=model))


@pytest.mark.parametrize("request_type", [_Wired, _WiredPlus])
def test_a_field_added_to_a_request_type_is_validated_and_in_the_schema(app, request_type):
    from pm_vector.service.errors import ApiError
    from pm_vector.service.resolve_body import parse_resolve_body
    from pm_vector.service.settings import ServiceSettings

    st = ServiceSettings()
    _served(request_type)
    try:
        has = request_type is _WiredPlus
        got = parse_resolve_body({"request": {"format": FORMAT, "n": 3, **({"flavor": 2} if has else {})}}, st, "c")
        assert isinstance(got.request, request_type) and got.request.n == 3
        with pytest.raises(ApiError) as bad:
            parse_resolve_body({"request": {"format": FORMAT, "n": 3, "flavor": 9}}, st, "c")
        assert bad.value.status == 422
        if has:  # the new field's bound, from its one declaration
            assert got.request.flavor == 2
            assert "flavor must be an integer in 1..3, got 9" in bad.value.message, bad.value.message
        else:  # no such field yet: refused as unknown
            assert "flavor" in bad.value.message
        props = app.openapi()["components"]["schemas"]["WiredRequestBody"]["properties"]
        assert set(props) == {"format", "n"} | ({"flavor"} if has else set())  # epsilon is no wire field
        if has:
            assert props["flavor"]["maximum"] == 3 and props["flavor"]["description"] == "A new field of the request."
    finally:
        releases.unregister("test-wired")


@pytest.mark.parametrize("release", ["location", "cells", "gaussian", "privatemail"])
def test_a_built_in_request_documents_fields_are_its_request_types(release):
    """The model of each built-in request document has exactly the wire fields of the release's
    request type, with its defaults (the document's own where it has one: the paper's params), and
    from_dict reads the same keys."""
    from pm_vector.protocol.wire_types import WIRE_DEFAULT

    rel = releases.by_name(release)
    model = releases.load(rel.wire_model)
    dc = {f.name: f for f in dataclasses.fields(rel.request_type)}
    assert set(model.model_fields) - {"format"} == set(dc)
    for name, f in model.model_fields.items():
        if name == "format":
            continue
        d = dc[name]
        required = d.default is dataclasses.MISSING and d.default_factory is dataclasses.MISSING
        assert f.is_required() == required, name
        if WIRE_DEFAULT in d.metadata:
            assert f.default == d.metadata[WIRE_DEFAULT], name
        elif d.default is not dataclasses.MISSING:
            assert f.default == d.default, name
    need, optional = wire_names(rel.request_type)
    assert (rel.request_type._NEED, rel.request_type._OPTIONAL) == (need, optional)
