"""Floods of made-up API keys through the real service: failed authentications are limited per
client address (429 with Retry-After, before any key lookup), a refused key is refused from
memory for a few seconds (no lookup), and neither stops a valid key nor delays a new one."""

from __future__ import annotations

import secrets
import time

import httpx
import pytest

LIMIT = 20


@pytest.fixture(scope="module")
def guarded(pm_home):
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    st = ServiceSettings(pool_max=2, auth_failures_per_minute=LIMIT, failed_key_ttl_s=5)
    with ServiceThread(st) as svc:
        yield svc, svc.app.state.service_state


def _from(address: str) -> httpx.Client:
    """A client whose connections come from ``address`` (any of 127.0.0.0/8 is local)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30)


def _fake() -> str:
    return "pmv_" + secrets.token_urlsafe(32)


def test_a_flood_of_made_up_keys_gets_429_without_lookups(guarded, pm_home):
    from pm_vector.service.auth import create_key

    svc, state = guarded
    good = create_key("flood good")
    statuses = []
    with _from("127.0.0.11") as c:
        before = state.key_lookups
        for _ in range(300):
            r = c.get(svc.url + "/collections", headers={"Authorization": f"Bearer {_fake()}"})
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.json()["error"] == "too_many_failed_authentications"
                assert int(r.headers["Retry-After"]) >= 1
        lookups = state.key_lookups - before
        print(f"\n300 made-up keys from one address: {statuses.count(401)} x 401, {statuses.count(429)} x 429, "
              f"{lookups} key lookups (limit {LIMIT}/min)")
        assert statuses[:LIMIT] == [401] * LIMIT  # the burst: each looked up and refused
        assert statuses.count(429) >= 300 - LIMIT - 2  # (a token or two may refill during the flood)
        assert lookups == statuses.count(401)  # a 429 costs the database nothing
        # the blocked address: a key not verified lately waits too (no lookup while blocked) ...
        r = c.get(svc.url + "/collections", headers={"X-API-Key": good["key"]})
        assert r.status_code == 429 and state.key_lookups - before == lookups
    # ... while another address is served at once, and its good key is now verified and cached
    with _from("127.0.0.12") as other:
        assert other.get(svc.url + "/collections", headers={"X-API-Key": good["key"]}).status_code == 200
    # a key the service verified lately still works from the blocked address (no lookup needed)
    with _from("127.0.0.11") as c:
        n = state.key_lookups
        assert c.get(svc.url + "/collections", headers={"X-API-Key": good["key"]}).status_code == 200
        assert state.key_lookups == n
        assert c.get(svc.url + "/collections", headers={"X-API-Key": _fake()}).status_code == 429


def test_a_repeated_bad_key_is_looked_up_once(guarded):
    from pm_vector.service.auth import hash_key

    svc, state = guarded
    cache = state.keycache
    assert cache is not None and cache.listening
    bad = _fake()
    with _from("127.0.0.13") as c:
        before = state.key_lookups
        codes = [c.get(svc.url + "/collections", headers={"X-API-Key": bad}).status_code for _ in range(10)]
        assert codes == [401] * 10
        assert state.key_lookups - before == 1  # then refused from memory
        assert cache.failed(hash_key(bad))


def test_key_changes_clear_the_negative_cache(guarded, pm_home):
    """A refused key that becomes valid (un-revoked by hand) is accepted at once, and creating a key
    forgets every refused key (the negative cache cannot hold a key created after it was tried)."""
    from pm_vector import db
    from pm_vector.service.auth import create_key, hash_key, revoke_key

    svc, state = guarded
    cache = state.keycache
    k = create_key("revoked then restored")
    revoke_key(k["id"])
    with _from("127.0.0.14") as c:
        h = {"X-API-Key": k["key"]}
        assert c.get(svc.url + "/collections", headers=h).status_code == 401
        assert cache.failed(hash_key(k["key"]))
        with db.connect() as conn:
            conn.execute("UPDATE pm_vector_service.api_keys SET revoked_at = NULL WHERE id = %s", [k["id"]])
            conn.commit()
        t0 = time.monotonic()
        while cache.failed(hash_key(k["key"])) and time.monotonic() - t0 < 2:
            time.sleep(0.01)
        assert c.get(svc.url + "/collections", headers=h).status_code == 200  # well before the 5 s TTL
        bad = _fake()
        assert c.get(svc.url + "/collections", headers={"X-API-Key": bad}).status_code == 401
        assert cache.failed(hash_key(bad))
        new = create_key("created after a refusal")
        t0 = time.monotonic()
        while cache.failed(hash_key(bad)) and time.monotonic() - t0 < 2:
            time.sleep(0.01)
        assert not cache.failed(hash_key(bad))  # create_key announced itself: refusals forgotten
        assert c.get(svc.url + "/collections", headers={"X-API-Key": new["key"]}).status_code == 200


def test_failed_auth_limiter_refills():
    from pm_vector.service.auth import FailedAuthLimiter

    lim = FailedAuthLimiter(6, max_addresses=2)  # 6 per minute: one every 10 s
    for _ in range(6):
        assert lim.wait("a", now=0.0) == 0.0
        lim.fail("a", now=0.0)
    assert lim.wait("a", now=0.0) == pytest.approx(10.0)
    assert lim.wait("a", now=5.0) == pytest.approx(5.0)
    assert lim.wait("a", now=10.0) == 0.0
    assert lim.wait("b", now=0.0) == 0.0  # per address
    lim.fail("b", now=0.0)
    lim.fail("c", now=0.0)  # bounded: the least recently failed address is dropped
    assert len(lim._buckets) == 2 and "a" not in lim._buckets
    assert FailedAuthLimiter(0).wait("a") == 0.0  # 0: no limit


def test_the_limit_is_shared_by_the_service_processes(guarded, pm_home):
    """Two service processes of one database (two apps, each with its own limiter and key
    cache): failures from an address at one count at the other, through the key cache's
    channel. Before, the second gave the same address another LIMIT x 401."""
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    svc, _ = guarded
    st = ServiceSettings(pool_max=2, auth_failures_per_minute=LIMIT, failed_key_ttl_s=5)
    with ServiceThread(st) as second, _from("127.0.0.21") as c:
        assert second.app.state.service_state.keycache.listening
        first = [c.get(svc.url + "/collections", headers={"X-API-Key": _fake()}).status_code for _ in range(LIMIT)]
        assert first == [401] * LIMIT
        time.sleep(0.5)  # the announcements arrive within milliseconds
        codes = [c.get(second.url + "/collections", headers={"X-API-Key": _fake()}).status_code for _ in range(LIMIT)]
        print(f"\nthe second process, after {LIMIT} failures at the first: {codes.count(401)} x 401, "
              f"{codes.count(429)} x 429")
        assert codes.count(401) <= 2, codes  # (a token may refill meanwhile)
