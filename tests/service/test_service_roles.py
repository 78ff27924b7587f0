"""Roles, collection scopes and per-key rate limits of the service; authentication before the body."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def keys(pm_home, svc_collection):
    from pm_vector.service.auth import create_key

    return {"query": create_key("roles query"), "admin": create_key("roles admin", role="admin"),
            "scoped": create_key("roles scoped", collections=["other_" + uuid.uuid4().hex[:6]]),
            "mine": create_key("roles mine", collections=[svc_collection])}


def _h(rec):
    return {"Authorization": f"Bearer {rec['key']}"}


def test_query_key_is_refused_admin_endpoints(service, svc_collection, keys):
    q, a = _h(keys["query"]), _h(keys["admin"])
    with httpx.Client(base_url=service.url, timeout=30) as c:
        for method, path, body in [("POST", f"/collections/{svc_collection}/jobs", {"params": {"n_components": 8}}),
                                   ("GET", "/jobs", None), ("GET", "/jobs/abc", None), ("GET", "/keys", None),
                                   ("POST", f"/collections/{svc_collection}/items", {"ids": [1]})]:
            r = c.request(method, path, headers=q, json=body)
            assert r.status_code == 403 and r.json()["error"] == "forbidden" and "--role admin" in r.json()["message"]
        # the role is checked before the body is read: a malformed body still gets 403
        r = c.post(f"/collections/{svc_collection}/jobs", headers={**q, "Content-Type": "application/json"},
                   content=b"{bad")
        assert r.status_code == 403
        # what a query key may do
        assert c.get(f"/collections/{svc_collection}/anchor", headers=q).status_code == 200
        assert c.get(f"/collections/{svc_collection}", headers=q).status_code == 200
        # an admin key may do the rest
        assert c.get("/jobs", headers=a).status_code == 200
        r = c.get("/keys", headers=a)
        assert r.status_code == 200
        listed = {k["id"]: k for k in r.json()["keys"]}
        assert listed[keys["query"]["id"]]["role"] == "query" and "key" not in listed[keys["query"]["id"]]
        from pm_vector.db.postgres import connection

        with connection() as conn:  # the collection's first item (ids come from one shared sequence)
            first = conn.execute("SELECT min(i.id) FROM pm_vector.items i JOIN pm_vector.collections c "
                                 "ON c.id = i.collection_id WHERE c.name = %s", [svc_collection]).fetchone()[0]
        r = c.post(f"/collections/{svc_collection}/items", headers=a, json={"ids": [int(first)]})
        assert r.status_code == 200 and r.json()["item_ids"] == [first], r.text


def test_scoped_key_sees_only_its_collections(service, svc_collection, keys):
    s, m = _h(keys["scoped"]), _h(keys["mine"])
    with httpx.Client(base_url=service.url, timeout=30) as c:
        assert svc_collection not in [x["name"] for x in c.get("/collections", headers=s).json()["collections"]]
        assert [x["name"] for x in c.get("/collections", headers=m).json()["collections"]] == [svc_collection]
        for path in (f"/collections/{svc_collection}", f"/collections/{svc_collection}/anchor",
                     f"/collections/{svc_collection}/kahm/models"):
            r = c.get(path, headers=s)
            assert r.status_code == 404 and "for this key" in r.json()["message"]
            assert c.get(path, headers=m).status_code in (200, 409)
        r = c.post(f"/collections/{svc_collection}/resolve", headers=s, json={"request": {}, "k": 8})
        assert r.status_code == 404  # the scope comes before the body's validation


def test_flood_from_one_key_gets_429_while_another_is_served(service, svc_collection, keys):
    from pm_vector.service.auth import create_key

    flood = _h(create_key("flood", rate_per_minute=60))  # 1 request/s, bursts of 10
    other = _h(keys["query"])
    codes, retry = [], []
    with httpx.Client(base_url=service.url, timeout=30) as c:
        t0 = time.monotonic()
        for _ in range(25):
            r = c.get(f"/collections/{svc_collection}", headers=flood)
            codes.append(r.status_code)
            if r.status_code == 429:
                retry.append(int(r.headers["Retry-After"]))
                assert r.json()["error"] == "rate_limited"
            # the other key is served all along
            assert c.get(f"/collections/{svc_collection}", headers=other).status_code == 200
    elapsed = time.monotonic() - t0
    # a burst of 10, then one a second: the rest is refused however slow the machine
    assert codes[:5] == [200] * 5 and codes.count(200) <= 10 + elapsed + 1 and codes.count(429) >= 1
    assert retry and all(1 <= s <= 60 for s in retry)


def test_rate_limiter_refills(pm_home):
    from pm_vector.service.auth import RateLimiter

    rl = RateLimiter(60, burst=2)
    assert rl.take(1, now=0.0) == 0.0 and rl.take(1, now=0.0) == 0.0
    wait = rl.take(1, now=0.0)
    assert wait == pytest.approx(1.0)
    assert rl.take(2, now=0.0) == 0.0  # another key has its own bucket
    assert rl.take(1, now=1.01) == 0.0
    assert RateLimiter(0).take(1, now=0.0) == 0.0  # 0: no limit


def test_unauthenticated_body_is_not_read(service, svc_collection):
    """An unauthenticated request over the body limit gets 401, not 413: the key is checked first."""
    big = b"[" + b"0," * 2_000_000 + b"0]"
    with httpx.Client(base_url=service.url, timeout=30) as c:
        t = time.perf_counter()
        r = c.post(f"/collections/{svc_collection}/resolve", content=big, headers={"Content-Type": "application/json"})
        assert r.status_code == 401
        r = c.post(f"/collections/{svc_collection}/resolve", content=big,
                   headers={"Content-Type": "application/json", "Authorization": "Bearer pmv_wrong"})
        assert r.status_code == 401 and time.perf_counter() - t < 10


def test_create_key_refuses_bad_roles_and_scopes(pm_home):
    from pm_vector.errors import InvalidInputError
    from pm_vector.service.auth import create_key, list_keys

    n = len(list_keys())
    for kw in ({"role": "root"}, {"collections": "digits"}, {"collections": []}, {"collections": ["a\x00"]},
               {"rate_per_minute": 0}, {"rate_per_minute": True}):
        with pytest.raises(InvalidInputError):
            create_key("bad", **kw)
    assert len(list_keys()) == n  # nothing written
    assert create_key("default role")["role"] == "query"  # least privilege unless asked


def test_keys_cli_role_and_collections(pm_home):
    from pm_vector.cli import app
    from pm_vector.cli.service import register

    register(app)
    runner = CliRunner()
    r = runner.invoke(app, ["keys", "create", "--name", "cli-admin", "--role", "admin", "--collection", "a",
                            "--collection", "b", "--rate-per-minute", "120", "--json"])
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)
    assert rec["role"] == "admin" and rec["collections"] == ["a", "b"] and rec["rate_per_minute"] == 120
    rec = json.loads(runner.invoke(app, ["keys", "create", "--name", "cli-q", "--json"]).stdout)
    assert rec["role"] == "query" and rec["collections"] is None
    r = runner.invoke(app, ["keys", "create", "--name", "x", "--role", "superuser"])
    assert r.exit_code == 2 and "role must be one of" in r.output
    out = runner.invoke(app, ["keys", "list"]).output
    assert "admin" in out and "query" in out


def test_query_keys_resolve_as_a_read_only_database_role(service, pm_home):
    """A query key's resolve runs as pm_vector_query: it may read and log the request, nothing else."""
    import psycopg

    st = service.app.state.service_state
    assert st.query_role == "pm_vector_query"
    with st.pool.connection_as(st.query_role) as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == "pm_vector_query"
        conn.execute("SELECT count(*) FROM pm_vector.items").fetchone()
        conn.rollback()
        for stmt in ("UPDATE pm_vector.collections SET name = name", "DELETE FROM pm_vector.request_log",
                     "DELETE FROM pm_vector.items", "SELECT * FROM pm_vector_service.api_keys",
                     "CREATE TABLE pm_vector.evil (x int)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(stmt)
            conn.rollback()
    for _ in range(st.pool.stats().get("pool_size", 1) + 1):  # every pooled session is the service user again
        with st.pool.connection() as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] != "pm_vector_query"


def test_raw_kahm_distances_refusal_is_a_403():
    from pm_vector.db.kahm import roles as kahm
    from pm_vector.service.errors import _status_of

    assert _status_of(kahm.RawKAHMDistancesNotAllowedError("raw model")) == (403, "raw_distances_not_allowed")
    assert _status_of(kahm.NoKAHMModelError("none")) == (409, "no_kahm_model")


def test_a_table_the_query_role_cannot_read_is_named_not_hidden(service, svc_collection, keys, svc_split):
    """A table pm_vector_query may not read (its column grants on items taken away): the answer says
    where the operator finds what to grant; admin keys still resolve."""
    from pm_vector.client.budget import MemoryBudget
    from pm_vector.client.http import Client, ServiceError
    from pm_vector.db.postgres import connect
    from pm_vector.db.postgres.privileges import QUERY_COLUMNS

    priv, cols = QUERY_COLUMNS["pm_vector.items"]
    Xq, yq = svc_split.query
    with connect() as conn:
        conn.execute("REVOKE SELECT ON pm_vector.items FROM pm_vector_query")  # its column grants too
        conn.commit()
        try:
            with Client(service.url, keys["query"]["key"], budget=MemoryBudget(default_epsilon=100.0)) as c:
                with pytest.raises(ServiceError) as e:  # (a location answer may come from the cache, unread)
                    c.query(svc_collection, Xq[0], int(yq[0]), epsilon=1.0, release="cells")
            assert e.value.status == 500 and "Database roles" in e.value.message
            with Client(service.url, keys["admin"]["key"], budget=MemoryBudget(default_epsilon=100.0)) as c:
                assert len(c.query(svc_collection, Xq[0], int(yq[0]), epsilon=1.0)["item_ids"]) == 8
        finally:  # the matrix's grant back (tests/db/test_db_privileges.py checks it)
            conn.execute(f"GRANT {priv} ({', '.join(cols)}) ON pm_vector.items TO pm_vector_query")
            conn.commit()
