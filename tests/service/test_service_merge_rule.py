"""``GET`` / ``PUT /collections/{name}/merge-rule`` (admin keys): the rule as
``pm_vector.db.merge_rule`` reads it; a PUT sets only the keys it names, in either media type; a
value of the wrong type, out of bounds or not finite, and an unknown key, get 422 and change nothing;
a query key 403, an unknown collection 404, no key 401."""

from __future__ import annotations

import uuid

import httpx
import numpy as np

from pm_vector.protocol import codec


def _h(rec, **more):
    return {"Authorization": f"Bearer {rec['key']}", **more}


def test_the_merge_rule_route(service, svc_admin_key, svc_key, pm_home):
    from pm_vector import db, defaults

    name = "rule_" + uuid.uuid4().hex[:8]
    db.create_collection(name, 4, [0, 1])
    try:
        db.ingest(name, np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32), [0, 1] * 3)
        with httpx.Client(base_url=service.url, timeout=30) as c:
            url = f"/collections/{name}/merge-rule"
            r = c.get(url, headers=_h(svc_admin_key))
            assert r.status_code == 200, r.text
            got = r.json()
            want = {"delta_items": defaults.MERGE_DELTA_ITEMS, "age_s": float(defaults.MERGE_AGE_S),
                    "pause": float(defaults.MERGE_PAUSE)}
            assert got == {"collection": name, "rule": want, "own": {}, "defaults": want, "pause_ends_at": None}
            r = c.put(url, headers=_h(svc_admin_key), json={"pause": 10, "delta_items": 500})
            assert r.status_code == 200, r.text
            assert r.json()["own"] == {"pause": 10.0, "delta_items": 500} and r.json()["rule"]["pause"] == 10.0
            # the other media type; a PUT keeps the keys it does not name
            r = c.put(url, content=codec.encode({"age_s": 60.0}, codec.MSGPACK),
                      headers=_h(svc_admin_key, **{"Content-Type": codec.MSGPACK}))
            assert r.status_code == 200, r.text
            assert db.merge_rule(name)["own"] == {"pause": 10.0, "delta_items": 500, "age_s": 60.0}
            bodies = [b'{"pause": -1}', b'{"pause": "10"}', b'{"pause": true}', b'{"pause": 1001}', b'{"delta_items": 2.5}', b'{"delta_items": 1000000001}',
                      b'{"age_s": 2592001}', b'{"speed": 1}', b'{"reset": "yes"}', b'[1]']
            for bad in bodies:
                r = c.put(url, content=bad, headers=_h(svc_admin_key, **{"Content-Type": codec.JSON}))
                assert r.status_code == 422, (bad, r.status_code, r.text)
                assert r.json()["error"].startswith("invalid"), r.text
            r = c.put(url, content=b'{"pause": Infinity}', headers=_h(svc_admin_key, **{"Content-Type": codec.JSON}))
            assert r.status_code == 400 and r.json()["error"] == "malformed_json"  # (JSON has no Infinity)
            assert db.merge_rule(name)["own"] == {"pause": 10.0, "delta_items": 500, "age_s": 60.0}  # nothing written
            r = c.put(url, headers=_h(svc_admin_key), json={"reset": True})
            assert r.status_code == 200 and r.json()["own"] == {}
            r = c.get(url, headers=_h(svc_key))
            assert r.status_code == 403 and r.json()["error"] == "forbidden"
            r = c.put(url, headers=_h(svc_key), json={"pause": 0})
            assert r.status_code == 403
            assert c.get(url).status_code == 401
            r = c.get("/collections/no_such_collection_r/merge-rule", headers=_h(svc_admin_key))
            assert r.status_code == 404 and r.json()["error"] == "not_found"
        assert db.merge_rule(name)["own"] == {}
    finally:
        db.drop_collection(name, missing_ok=True)
