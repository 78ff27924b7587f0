"""The service keeps verified API keys in memory only while it LISTENs for key changes
(migration 0012's trigger, pm_vector.service.keycache): a key revoked by hand in SQL is refused
within milliseconds; with the listening session killed the cache is off (every request looks its
key up) until it listens again; a lookup that raced with a change is not kept."""

from __future__ import annotations

import time

import httpx
import pytest


def _until(pred, timeout=5.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    return pred()


@pytest.fixture
def keyed_service(pm_home):
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    with ServiceThread(ServiceSettings(pool_max=2)) as svc:
        yield svc, svc.app.state.service_state.keycache


def test_a_key_revoked_in_sql_is_refused_at_once(keyed_service):
    from pm_vector import db
    from pm_vector.service.auth import create_key, hash_key

    svc, cache = keyed_service
    assert cache is not None and cache.listening
    k = create_key("cached")
    h = {"X-API-Key": k["key"]}
    assert httpx.get(svc.url + "/collections", headers=h).status_code == 200
    assert cache.lookup(hash_key(k["key"])) is not None  # served from memory from now on
    assert httpx.get(svc.url + "/collections", headers=h).status_code == 200
    with db.connect() as conn:  # by hand, as an operator might: the trigger announces it
        conn.execute("UPDATE pm_vector_service.api_keys SET revoked_at = now() WHERE id = %s", [k["id"]])
        conn.commit()
    assert _until(lambda: cache.lookup(hash_key(k["key"])) is None, 2.0)
    assert _until(lambda: httpx.get(svc.url + "/collections", headers=h).status_code == 401, 2.0)


def test_without_the_listening_session_every_request_looks_its_key_up(keyed_service):
    from pm_vector import db
    from pm_vector.service.auth import create_key, hash_key
    from pm_vector.service.keycache import APPLICATION_NAME

    svc, cache = keyed_service
    k = create_key("while deaf")
    h = {"X-API-Key": k["key"]}
    assert httpx.get(svc.url + "/collections", headers=h).status_code == 200
    with db.connect() as conn:
        n = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                         [APPLICATION_NAME]).fetchone()[0]
        conn.commit()
        assert n >= 1
        assert _until(lambda: not cache.listening, 3.0)  # noticed within a second or so
        assert cache.lookup(hash_key(k["key"])) is None
        # while deaf, a revocation still takes effect on the very next request
        conn.execute("UPDATE pm_vector_service.api_keys SET revoked_at = now() WHERE id = %s", [k["id"]])
        conn.commit()
    # (off, or listening again with nothing kept: either way the key is looked up)
    assert httpx.get(svc.url + "/collections", headers=h).status_code == 401
    assert _until(lambda: cache.listening, 5.0)  # and it listens again by itself
    assert httpx.get(svc.url + "/collections", headers=h).status_code == 401


def test_a_lookup_that_raced_with_a_change_is_not_kept():
    from pm_vector.service.keycache import KeyCache

    c = KeyCache("postgresql://unused")
    c._listening = True
    g = c.generation()
    c._forget()  # a notification arrives while the lookup is in flight
    c.store("h", {"id": 1}, g)
    assert c.lookup("h") is None
    c.store("h", {"id": 1}, c.generation())
    assert c.lookup("h") == {"id": 1}
    c.ttl = 0.0
    c.store("h2", {"id": 2}, c.generation())
    assert c.lookup("h2") is None  # expired at once
    c._forget(listening=False)
    c.store("h", {"id": 1}, c.generation())
    assert c.lookup("h") is None  # nothing is kept while not listening
