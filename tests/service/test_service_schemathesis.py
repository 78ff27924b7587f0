"""schemathesis against the service's own ``/openapi.json`` (issue 25, "tools of the field"):
every route, request bodies in both media types (JSON and msgpack), with an admin key, a query
key and none; no answer is a 5xx and every answer matches the schema the service publishes.

A bounded number of examples per route here (CI: well under a minute); a longer run by hand:
``PM_VECTOR_SCHEMATHESIS_EXAMPLES=500 pytest tests/service/test_service_schemathesis.py``.
A finding becomes a regular test (tests/service/test_service_hostile_inputs.py and the like)."""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance

from pm_vector.protocol import codec

EXAMPLES = int(os.environ.get("PM_VECTOR_SCHEMATHESIS_EXAMPLES", "6"))


@schemathesis.serializer("application/msgpack")
def _to_msgpack(ctx, value):
    try:
        return codec.encode(value, codec.MSGPACK)
    except TypeError:  # e.g. an integer beyond 64 bits (negative cases): msgpack cannot say it
        return b"\xc1"  # the one byte msgpack never uses: a malformed body


@schemathesis.deserializer("application/msgpack")
def _from_msgpack(ctx, response):
    return codec.decode(response.content, codec.MSGPACK, arrays="lists")


@pytest.fixture(scope="module")
def fuzz_service(pm_home, svc_collection):
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    st = ServiceSettings(max_rows=200, max_dim=64, max_body_bytes=256 * 1024, pool_max=4, rate_per_minute=0,
                         auth_failures_per_minute=0, request_log_retention_days=0, max_queued_jobs=1)
    with ServiceThread(st) as svc:
        yield svc


@pytest.fixture(scope="module")
def keys(svc_admin_key, svc_key):
    return {"admin": {"Authorization": f"Bearer {svc_admin_key['key']}"},
            "query": {"Authorization": f"Bearer {svc_key['key']}"}, "none": {}}


def _operations(url: str):
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) >= 12, [o.label for o in ops]  # every route of service/routers
    return ops


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.slow
def test_no_5xx_and_answers_match_the_schema(fuzz_service, keys, svc_collection, mode):
    seen: dict[str, set] = {}
    for op in _operations(fuzz_service.url):
        if op.path.startswith("/keys") and op.method.upper() in ("POST", "DELETE"):
            continue  # keys are made and revoked by the CLI tests (a fuzzed revoke would revoke the test keys)

        real_name = "{name}" in op.path and not op.path.endswith("/jobs")  # no fuzzed job re-embeds it

        @given(case=op.as_strategy(generation_mode=mode), on_real=st.booleans())
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case, on_real):
            if real_name and on_real:  # half the cases on the session's collection: past the 404
                case.path_parameters = {**(case.path_parameters or {}), "name": svc_collection}
            for who, headers in keys.items():  # each case with an admin key, a query key and none
                response = case.call(headers=headers, timeout=60)
                seen.setdefault(op.label, set()).add(response.status_code)
                assert response.status_code < 500, (who, case.method, case.formatted_path, response.status_code,
                                                    response.text[:300])
                case.validate_response(response, checks=[response_schema_conformance])

        try:
            run()
        except Unsatisfiable:  # an operation with nothing to make invalid (no parameters, no body)
            assert mode == GenerationMode.NEGATIVE, op.label
    print({k: sorted(v) for k, v in seen.items()})
