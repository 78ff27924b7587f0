"""The location release end to end: the real service, the real client, the real embedded PostgreSQL.

The default release of ``Client.query`` is one report over the whole collection; its answer is a
public function of the report (the same bytes for every query that reports the same cell), checked
whole by the client, and within the byte budget the user sets."""

from __future__ import annotations

import numpy as np
import pytest

from pm_vector.client.http import Client
from pm_vector.protocol.codec import MSGPACK, decode


def _ledger(tmp_path):
    from pm_vector.client.budget import PrivacyBudget

    b = PrivacyBudget(tmp_path / "ledger.json")
    return b


def test_default_query_is_one_location_report_within_the_byte_budget(service, svc_collection, svc_key, svc_split,
                                                                     tmp_path):
    from pm_vector.bench.metrics import nn_recall_at_k
    from pm_vector.neighbors import knn_search

    Xs, _ = svc_split.server
    Xq, _ = svc_split.query
    truth = knn_search(Xq[:20], Xs, 8)
    with Client(service.url, svc_key["key"], budget=_ledger(tmp_path)) as c:
        c.budget.set_budget(c.budget_key(), epsilon=1000.0)
        got: list = []
        c._http.event_hooks["response"] = [lambda resp: got.append(resp)]
        r = c.query(svc_collection, Xq[0], epsilon=4.0, k=8)
        c._http.event_hooks["response"] = []
        got[-1].read()
        ans = decode(got[-1].content, MSGPACK)
        assert r["release"] == "location" and r["delta"] == 0.0 and ans["release"] == "location"
        assert set(ans["rows"] if "rows" in ans else []) == set()  # one list, no rows
        n = min(r["candidates"], c._public[svc_collection].class_rows["n_items"])
        assert np.asarray(ans["item_ids"]).shape == (n,) and len(ans["codes_data"]) == n * r["code_bytes"]
        assert r["bytes_per_request"] <= 50_000, r["bytes_per_request"]
        assert len(r["item_ids"]) == 8 and r["reranked"] == "codes"
        # a smaller budget: a smaller answer, still within it
        small = c.query(svc_collection, Xq[0], epsilon=4.0, k=8, max_bytes=8_000)
        assert small["bytes_per_request"] <= 8_000 and small["candidates"] < r["candidates"]
        # recall at eps 16 well above chance on the digits collection
        res = [c.query(svc_collection, x, epsilon=16.0, k=8)["item_ids"] for x in Xq[:20]]
    ids = np.asarray(db_positions(svc_collection, res, Xs))
    rec = nn_recall_at_k(ids, truth)
    print("location release, digits, eps 16, nn_recall@8 over 20 queries:", rec)
    assert rec > 0.5


def db_positions(name, res, Xs):
    """The answer's item ids as positions in the split's server rows (ids were ingested in order)."""
    from pm_vector import db

    rows = db.fetch_items(name, sorted({i for r in res for i in r}), include_features=True)
    feats = {int(i): np.asarray(f) for i, f in zip(rows["item_ids"], rows["features"])}
    from pm_vector.neighbors import knn_search

    out = []
    for r in res:
        F = np.stack([feats[i] for i in r])
        out.append(knn_search(F, Xs, 1).ravel())
    return out


def test_a_delete_never_breaks_an_answer(service, svc_key, tmp_path):
    """Issue #35, finding 10: on the demo's collection (1,000 digits: the 50 kB plan asks for every
    item) deleting items made every later query fail on the client (``the answer's item_ids must be
    1000 integers; got shape (824,)``). The answer now says the run's items it was built on and holds
    min(candidates, n_items) of them; the client checks it against that and its request. A fifth
    deleted, queries at eps 1, 4 and 16 through a client that holds the document from before the
    delete and through a new one: every query answers, with no deleted item."""
    import uuid

    from pm_vector import db
    from pm_vector.bench.demo import DEMO_SIZES, prepare_collection
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    split = split_dataset(load_dataset("digits"), *DEMO_SIZES["digits"], seed=0)
    name = "del_" + uuid.uuid4().hex[:8]
    prepare_collection(name, split, allow_raw_features=True)
    try:
        db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
        Xq, _ = split.query
        with Client(service.url, svc_key["key"], budget=_ledger(tmp_path)) as old:
            old.budget.set_budget(old.budget_key(), epsilon=1000.0)
            before = old.query(name, Xq[0], epsilon=4.0, k=8)
            assert before["candidates"] >= 1000  # the plan asks for the whole collection
            gone = _item_ids(name)[::5]
            assert db.delete_items(name, item_ids=gone.tolist())["deleted"] == 200
            with Client(service.url, svc_key["key"], budget=_ledger(tmp_path)) as new:
                for c in (old, new):
                    for eps in (1.0, 4.0, 16.0):
                        for x in Xq[:3]:
                            r = c.query(name, x, epsilon=eps, k=8)
                            assert len(r["item_ids"]) == 8 and not set(r["item_ids"]) & set(gone.tolist())
                assert new._public[name].class_rows["n_items"] == 800
    finally:
        db.drop_collection(name, missing_ok=True)


def _item_ids(name) -> np.ndarray:
    from pm_vector.db.postgres import connection

    with connection() as conn:
        return np.array([r[0] for r in conn.execute(
            "SELECT i.id FROM pm_vector.items i JOIN pm_vector.collections c ON c.id = i.collection_id "
            "WHERE c.name = %s ORDER BY i.id", [name]).fetchall()], dtype=np.int64)


def _at_bound(i: int, bound: int):
    """A payload of exactly ``bound`` bytes of compact JSON, in the shapes that grow most on the
    wire: a list of short floats (9 bytes each in msgpack, 4 in JSON), a string, a map."""
    from pm_vector.db.store.payloads import payload_bytes

    if i % 3 == 0:
        v = [1.5] * ((bound - 1) // 4)
        while payload_bytes(v) < bound:  # fill with one more digit of the last float
            v[-1] = float(str(v[-1]) + "1") if payload_bytes(v) + 1 <= bound else v[-1]
            if payload_bytes(v) < bound and len(str(v[-1])) > 17:
                break
    elif i % 3 == 1:
        v = "é" * ((bound - 2) // 2) + "a" * ((bound - 2) % 2)
    else:
        v = {"k": "x" * (bound - 8)}
    assert payload_bytes(v) <= bound
    return v


@pytest.mark.parametrize("wire", ["msgpack", "json"])
def test_the_byte_budget_holds_with_payloads_at_their_bound(service, svc_key, svc_split, tmp_path, wire, monkeypatch):
    """Issue #35, build item 9 and finding 11: ``private_location`` never passed the collection's
    payload bound to the plan, so an answer with payloads at their bound could exceed the byte
    budget. The collection document now publishes ``max_payload_bytes`` and the plan counts it as
    the payload may travel on the client's wire; every answer's bytes on the wire, both ways, are
    within ``max_answer_bytes``."""
    import uuid

    from pm_vector import db
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.db.store.payloads import payload_bytes

    bound = 96
    name = "pay_" + uuid.uuid4().hex[:8]
    ds = svc_split.dataset
    db.create_collection(name, ds.dim, [int(c) for c in ds.classes], max_payload_bytes=bound)
    try:
        Xs, ys = svc_split.server
        pays = [_at_bound(i, bound) for i in range(len(ys))]
        assert min(payload_bytes(p) for p in pays) >= bound - 2
        db.ingest(name, Xs, ys, payloads=pays)
        db.register_anchor_set(name, *svc_split.anchor, role="anchor")
        db.register_anchor_set(name, *svc_split.dummy, role="dummy")
        db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
        Xq, _ = svc_split.query
        for budget_bytes in (6_000, 20_000, 50_000):
            with Client(service.url, svc_key["key"], budget=_ledger(tmp_path), wire=wire,
                        max_answer_bytes=budget_bytes) as c:
                c.budget.set_budget(c.budget_key(), epsilon=1000.0)
                for x in Xq[:3]:
                    r = c.query(name, x, epsilon=4.0, k=8)
                    assert len(r["payloads"]) == 8 and all(p is not None for p in r["payloads"])
                    print(f"{wire} budget {budget_bytes:,}: {r['candidates']} candidates of {r['code_bytes']} code "
                          f"bytes, {r['bytes_per_request']:,} bytes on the wire")
                    assert r["bytes_per_request"] <= budget_bytes, (r["bytes_per_request"], budget_bytes)
                doc = c.collection(name)
                assert doc["max_payload_bytes"] == bound
                # payloads at their bound: the high-water mark is the bound, and the plan counts it
                assert doc["payload_bytes_max"] == max(payload_bytes(p) for p in pays) == bound
        # a server that publishes a mark below its payloads (0: "none stored") only makes its own answer
        # larger than the plan counted: the transport refuses it whole, and an honest document plans again
        from pm_vector.errors import MalformedAnswerError
        from pm_vector.service.routers import collections as coll_router

        with Client(service.url, svc_key["key"], budget=_ledger(tmp_path), wire=wire,
                    max_answer_bytes=20_000) as c:
            c.budget.set_budget(c.budget_key(), epsilon=1000.0)
            monkeypatch.setattr(coll_router, "high_of", lambda coll: 0)
            assert c.collection(name)["payload_bytes_max"] == 0
            with pytest.raises(MalformedAnswerError, match="plan counted payloads of at most 0 bytes") as ei:
                c.query(name, Xq[0], epsilon=4.0, k=8)
            assert ei.value.error == "too_large"
            monkeypatch.undo()
            r = c.query(name, Xq[0], epsilon=4.0, k=8)
            assert r["bytes_per_request"] <= 20_000 and len(r["payloads"]) == 8
    finally:
        db.drop_collection(name, missing_ok=True)
