"""The OpenAPI document is the service's contract with its clients: every path, its operation
id, tags, documented request body (in both media types) and status codes, in this order; the
component schemas of the self-parsed bodies; and the middleware in its order. The application
is made without a database (nothing here needs one)."""

from __future__ import annotations

import pytest

from pm_vector.protocol.codec import JSON, MSGPACK

# (method, path): (operationId, tags, request body schema or None, documented status codes)
_COMMON = ["401", "413", "422", "429"]
EXPECTED = {
    ("GET", "/health"): ("health_health_get", ["service"], None, ["200", *_COMMON, "503"]),
    ("GET", "/collections"): ("collections_collections_get", ["collections"], None, ["200", *_COMMON]),
    ("GET", "/collections/{name}"): ("describe_collections__name__get", ["collections"], None, ["200", *_COMMON]),
    ("GET", "/collections/{name}/sync"): ("sync_status_collections__name__sync_get", ["collections"], None,
                                          ["200", *_COMMON]),
    ("GET", "/collections/{name}/anchor"): ("anchor_collections__name__anchor_get", ["collections"], None,
                                            ["200", *_COMMON]),
    ("POST", "/collections/{name}/items"): ("items_collections__name__items_post", ["collections"], "ItemsBody",
                                            ["200", *_COMMON]),
    ("POST", "/collections/{name}/items/delete"): ("delete_collections__name__items_delete_post", ["collections"],
                                                   "DeleteItemsBody", ["200", *_COMMON]),
    ("GET", "/collections/{name}/merge-rule"): ("read_rule_collections__name__merge_rule_get", ["collections"], None,
                                                ["200", *_COMMON]),
    ("PUT", "/collections/{name}/merge-rule"): ("set_rule_collections__name__merge_rule_put", ["collections"],
                                                "MergeRuleBody", ["200", *_COMMON]),
    ("POST", "/collections/{name}/jobs"): ("start_job_collections__name__jobs_post", ["jobs"], "JobBody",
                                           ["202", *_COMMON]),
    ("GET", "/jobs"): ("list_jobs_jobs_get", ["jobs"], None, ["200", *_COMMON]),
    ("GET", "/jobs/{job_id}"): ("get_job_jobs__job_id__get", ["jobs"], None, ["200", *_COMMON]),
    ("GET", "/keys"): ("keys_keys_get", ["keys"], None, ["200", *_COMMON]),
    ("POST", "/collections/{name}/resolve"): ("resolve_endpoint_collections__name__resolve_post", ["resolve"],
                                              "ResolveBody", ["200", *_COMMON]),
    ("GET", "/collections/{name}/kahm/models"): ("kahm_models_collections__name__kahm_models_get", ["kahm"], None,
                                                 ["200", *_COMMON]),
    ("POST", "/collections/{name}/kahm/distances"): ("kahm_distances_collections__name__kahm_distances_post",
                                                     ["kahm"], "DistancesBody", ["200", *_COMMON]),
}


@pytest.fixture(scope="module")
def app():
    from pm_vector.service.app import create_app
    from pm_vector.service.settings import ServiceSettings

    return create_app(ServiceSettings(), pool=object())


def test_paths_operation_ids_and_bodies(app):
    spec = app.openapi()
    seen = {}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            content = op.get("requestBody", {}).get("content", {})
            refs = {v["schema"]["$ref"].rsplit("/", 1)[1] for v in content.values()}
            assert len(refs) <= 1 and (not content or set(content) == {JSON, MSGPACK}), (method, path)
            seen[(method.upper(), path)] = (op["operationId"], op.get("tags"), next(iter(refs), None),
                                            sorted(op["responses"]))
    assert list(seen) == list(EXPECTED)  # the same paths, in the same order
    for key, want in EXPECTED.items():
        assert seen[key] == (want[0], want[1], want[2], sorted(want[3])), key
    # the self-parsed bodies are documented in full, with the schemas they refer to
    comps = spec["components"]["schemas"]
    for name in ("ResolveBody", "PrivateMailRequestBody", "DistancesBody", "ItemsBody", "DeleteItemsBody", "JobBody",
                 "MergeRuleBody"):
        assert comps[name]["type"] == "object" and comps[name]["properties"], name
    # the sync status's answer is documented by its model
    ok = spec["paths"]["/collections/{name}/sync"]["get"]["responses"]["200"]["content"]["application/json"]
    assert ok["schema"]["$ref"].rsplit("/", 1)[1] == "SyncStatus"
    assert set(comps["SyncStatus"]["properties"]) == {"collection", "source_table", "queued", "oldest_queued_at",
                                                      "lag_s", "rejected", "broken", "broken_at",
                                                      "pending_purge", "purge_age_s"}
    for path, ops in spec["paths"].items():  # every reference resolves
        for op in ops.values():
            for v in op.get("requestBody", {}).get("content", {}).values():
                assert v["schema"]["$ref"].rsplit("/", 1)[1] in comps


def test_middleware_order(app):
    # outermost first: the key before the body limit or anything reads the body; the gate reads a large
    # body under the limit and the body timeout, then waits for its slot; the catch-all inside them, and
    # inside it the resolve route answered without FastAPI's router (middleware/hot_route.py)
    assert [m.cls.__name__ for m in app.user_middleware] == [
        "AuthMiddleware", "BodyLimitMiddleware", "BodyTimeoutMiddleware", "LargeRequestGate", "CatchAllMiddleware",
        "ResolveRoute"]
