"""Smaller holes of issue 25 (items 9 and 11) over HTTP: ids are strict integers, a name is
matched whole, and every payload an ingest accepts is one that ``POST /items`` and every answer
can carry (no 500)."""

from __future__ import annotations

import uuid

import httpx
import numpy as np
import pytest

from pm_vector.protocol import codec


@pytest.fixture(scope="module")
def odd_payloads(pm_home):
    """A collection whose items carry the payloads at the edge of what ingest accepts."""
    from pm_vector import db
    from pm_vector.db.store.payloads import MAX_PAYLOAD_DEPTH

    deep: object = "x"
    for _ in range(MAX_PAYLOAD_DEPTH):
        deep = [deep]
    pays = [[1e18] * 4, deep, {"s": "é\u2028", "n": -2 ** 63, "f": 1.5e-30}, None]
    name = "odd_" + uuid.uuid4().hex[:8]
    db.create_collection(name, 4, [0, 1], max_payload_bytes=1000)
    ids = db.ingest(name, np.random.default_rng(0).random((4, 4)), [0, 1, 0, 1], payloads=pays)["item_ids"]
    yield name, [int(i) for i in ids]
    db.drop_collection(name, missing_ok=True)


def test_items_returns_every_stored_payload_in_both_media_types(service, svc_admin_key, odd_payloads):
    name, ids = odd_payloads
    for media in (codec.JSON, codec.MSGPACK):
        r = httpx.post(f"{service.url}/collections/{name}/items", timeout=30, content=codec.encode({"ids": ids}, media),
                       headers={"Authorization": f"Bearer {svc_admin_key['key']}", "Content-Type": media,
                                "Accept": media})
        assert r.status_code == 200, r.text
        got = codec.decode(r.content, media)["payloads"]
        assert got[0] == [10 ** 18] * 4 and got[2]["n"] == -2 ** 63 and got[3] is None
        assert got[2]["f"] == pytest.approx(1.5e-30)


@pytest.mark.parametrize("ids", [["1"], [True], [1.0], [1, "2"], [[1]]])
def test_item_ids_are_strict_integers(service, svc_admin_key, svc_collection, ids):
    for media in (codec.JSON, codec.MSGPACK):
        r = httpx.post(f"{service.url}/collections/{svc_collection}/items", timeout=30,
                       content=codec.encode({"ids": ids}, media),
                       headers={"Authorization": f"Bearer {svc_admin_key['key']}", "Content-Type": media})
        assert r.status_code == 422, (ids, media, r.status_code, r.text)
        assert r.json()["error"] == "invalid_input"
    r = httpx.post(f"{service.url}/collections/{svc_collection}/items", timeout=30,
                   json={"ids": [1], "include_features": "yes"},
                   headers={"Authorization": f"Bearer {svc_admin_key['key']}"})
    assert r.status_code == 422


def test_a_name_with_a_trailing_newline_is_refused_alike_in_python_and_http(service, svc_key, svc_collection):
    from pm_vector.db.store._names import check_name
    from pm_vector.errors import InvalidInputError

    with pytest.raises(InvalidInputError):
        check_name(svc_collection + "\n")
    r = httpx.get(f"{service.url}/collections/{svc_collection}%0A", timeout=30,
                  headers={"Authorization": f"Bearer {svc_key['key']}"})
    assert r.status_code == 404


def test_a_payload_stored_before_the_ingest_check_is_still_served(service, svc_admin_key, odd_payloads):
    """A payload stored before ingest refused numbers beyond 64 bits (jsonb gives ``1e300`` back
    as an integer of 301 digits) is answered, as the float it was, not with a 500."""
    from pm_vector import db

    name, ids = odd_payloads
    with db.connect() as conn:
        conn.execute("UPDATE pm_vector.items SET payload = '[1e300, 1e19, 2]'::jsonb WHERE id = %s", [ids[3]])
        conn.commit()
    try:
        for media in (codec.JSON, codec.MSGPACK):
            r = httpx.post(f"{service.url}/collections/{name}/items", timeout=30,
                           content=codec.encode({"ids": [ids[3]]}, media),
                           headers={"Authorization": f"Bearer {svc_admin_key['key']}", "Content-Type": media,
                                    "Accept": media})
            assert r.status_code == 200, r.text
            assert codec.decode(r.content, media)["payloads"] == [[1e300, 10 ** 19, 2]]
    finally:
        with db.connect() as conn:
            conn.execute("UPDATE pm_vector.items SET payload = NULL WHERE id = %s", [ids[3]])
            conn.commit()
