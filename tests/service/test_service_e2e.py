"""The real service over loopback with the real client: private queries, auth, budget, jobs, anchors."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import time

import httpx

import numpy as np
import pytest

from pm_vector.client.budget import PrivacyBudget, origin_key
from pm_vector.client.http import Client, ServiceError
from pm_vector.protocol.frame import frame_from_document
from pm_vector.errors import AlignmentError, BudgetExceededError
from pm_vector.protocol.codec import MSGPACK, decode, encode


def test_private_query_end_to_end(service, svc_collection, svc_key, svc_split, requests_logged, tmp_path):
    from pm_vector import db
    from pm_vector.bench.baselines import knn_search

    Xq, yq = svc_split.query
    Xs, _ = svc_split.server
    before = requests_logged(svc_collection)
    budget = PrivacyBudget(tmp_path / "budget.json")
    budget.set_budget(origin_key(service.url), 100.0)  # the server's entry
    exact = knn_search(Xq[:6], Xs, 8)
    ext = np.array([f"{svc_split.dataset.name}-{int(i)}" for i in svc_split.server_idx])
    hits, nn, answers = [], [], []
    with Client(service.url, svc_key["key"], budget=budget) as c:
        for i in range(6):
            r = c.query(svc_collection, Xq[i], int(yq[i]), epsilon=16.0, k=8, shortlist=32, release="gaussian")
            assert len(r["item_ids"]) == 8 and r["reranked"] == "codes" and r["answer"] == "compact"
            assert r["distances"] == sorted(r["distances"])
            assert r["protocol"] == "pm_vector" and r["bytes_sent"] > 0 and r["bytes_received"] > r["bytes_sent"]
            items = db.fetch_items(svc_collection, r["item_ids"])  # the compact answer carries ids (no labels)
            hits.append(np.mean(np.asarray(items["labels"]) == yq[i]))
            nn.append(len(set(items["external_ids"]) & set(ext[exact[i]])) / 8)
            answers.append(tuple(sorted(r["item_ids"])))
    assert requests_logged(svc_collection) == before + 6
    assert np.mean(hits) > 0.5  # precision@8 well above chance (0.1)
    assert np.mean(nn) > 0.2  # the answers hold the query's own nearest items, not only its class
    assert len(set(answers)) == 6  # every query gets its own answer
    st = budget.status(origin_key(service.url))
    assert st["releases"] == 6 and st["epsilon_spent"] == pytest.approx(96.0)
    # the log holds the released request only: one noised row per class in the frames' dimension
    logged = db.list_requests(svc_collection, limit=1)[0]
    req = logged["request"] if isinstance(logged["request"], dict) else json.loads(logged["request"])
    assert np.asarray(req["rows"]).shape == (10, 4) and req["seeded"] is False
    base = {"format", "rows", "classes", "epsilon", "delta", "noise_scale", "sigmas", "frames_digest", "shortlist",
            "seeded", "collection"}
    assert base <= set(req) <= base | {"noise", "grid", "release"}  # noise/grid: the release's public noise description
    assert req.get("release", "gaussian") == "gaussian"


def _ledger(tmp_path):
    """A ledger of the test's own (the default one is shared by every test of the session)."""
    from pm_vector.client.budget import PrivacyBudget, origin_key

    return PrivacyBudget(tmp_path / "ledger.json", default_epsilon=1000.0)


def test_private_query_paper_protocol(service, svc_collection, svc_key, svc_split):
    Xq, yq = svc_split.query
    with Client(service.url, svc_key["key"]) as c:
        r = c.query(svc_collection, Xq[0], int(yq[0]), epsilon=1.0, k=8, protocol="privatemail_paper", rerank=False)
    assert len(r["item_ids"]) == 8 and r["protocol"] == "privatemail_paper"


def test_label_free_query(service, svc_collection, svc_key, svc_split):
    Xq, yq = svc_split.query
    with Client(service.url, svc_key["key"]) as c:
        r = c.query(svc_collection, Xq[0], None, epsilon=4.0, k=8, shortlist=32)
    assert r["label_predicted"] and len(r["item_ids"]) == 8


def test_client_traffic_does_not_depend_on_the_real_row(service, svc_collection, svc_key, svc_split, tmp_path):
    """After the resolve the client sends nothing; the resolve asks for every row's compact answer alike
    (the code prefix is the public rule's for the release: the first stage for cells, the whole code
    for the Gaussian)."""
    Xq, yq = svc_split.query
    with Client(service.url, svc_key["key"], budget=_ledger(tmp_path)) as c:
        c.private_knn(svc_collection, epsilon=4.0)  # fetch the public anchor first
        for i, release in ((0, "gaussian"), (1, "gaussian"), (2, "gaussian"), (0, "cells"), (1, "cells")):
            sent: list = []
            c._http.event_hooks["request"] = [lambda req: sent.append(req)]
            c.query(svc_collection, Xq[i], int(yq[i]), epsilon=4.0, k=8, shortlist=16, release=release)
            paths = [q.url.path for q in sent]
            assert paths[-1].endswith("/resolve") and sum(p.endswith("/resolve") for p in paths) == 1
            body = decode(sent[-1].content, sent[-1].headers["content-type"])  # msgpack: the default wire
            assert body["answer"] == "compact" and set(body) == {"request", "k", "answer", "code_bytes"}
            assert body["code_bytes"] == (32 if release == "cells" else 64)
            assert body["request"]["release"] == release
            assert len(body["request"]["rows" if release == "gaussian" else "reports"]) == 10


def test_unauthenticated_refused(service, svc_collection, svc_key, svc_split, requests_logged):
    from pm_vector.service.auth import create_key, revoke_key

    before = requests_logged(svc_collection)
    with Client(service.url, svc_key["key"]) as ok:
        req, _ = ok.build_request(svc_collection, svc_split.query[0][0], int(svc_split.query[1][0]), epsilon=1.0)
    body = {"request": req.to_dict(), "k": 8}
    url = f"{service.url}/collections/{svc_collection}/resolve"
    r = httpx.post(url, json=body)
    assert r.status_code == 401 and r.json()["error"] == "unauthorized" and "keys create" in r.json()["message"]
    r = httpx.post(url, json=body, headers={"Authorization": "Bearer pmv_not-a-real-key"})
    assert r.status_code == 401 and "unknown" in r.json()["message"]
    k2 = create_key("to be revoked")
    assert httpx.get(f"{service.url}/collections", headers={"X-API-Key": k2["key"]}).status_code == 200
    revoke_key(k2["id"])
    # refused once the service hears of the revocation (NOTIFY at its commit: milliseconds)
    for _ in range(50):
        r = httpx.post(url, json=body, headers={"X-API-Key": k2["key"]})
        if r.status_code == 401:
            break
        time.sleep(0.02)
    assert r.status_code == 401 and "revoked" in r.json()["message"]
    for path in ("/collections", f"/collections/{svc_collection}/anchor", "/jobs"):
        assert httpx.get(service.url + path).status_code == 401
    assert httpx.get(service.url + "/health").status_code == 200
    assert requests_logged(svc_collection) == before


def test_over_budget_refused_before_anything_is_sent(service, svc_collection, svc_key, svc_split, requests_logged,
                                                     tmp_path):
    Xq, yq = svc_split.query
    path = tmp_path / "ledger.json"
    key = origin_key(service.url)  # the server's entry: every collection of it
    PrivacyBudget(path).set_budget(key, 1.5)
    sent: list[str] = []
    with Client(service.url, svc_key["key"], budget=PrivacyBudget(path)) as c:
        c._http.event_hooks["request"].append(lambda req: sent.append(req.url.path))
        c.query(svc_collection, Xq[0], int(yq[0]), epsilon=1.0)
        assert sum(p.endswith("/resolve") for p in sent) == 1
        before = requests_logged(svc_collection)
        n_sent = len(sent)
        with pytest.raises(BudgetExceededError, match="budget"):
            c.query(svc_collection, Xq[1], int(yq[1]), epsilon=1.0)
        assert not any(p.endswith("/resolve") for p in sent[n_sent:])  # nothing sent
    assert requests_logged(svc_collection) == before  # the server saw nothing
    # the ledger is persistent: a new process/ledger object sees the spend and refuses too
    again = PrivacyBudget(path)
    assert again.status(key)["epsilon_spent"] == pytest.approx(1.0)
    with pytest.raises(BudgetExceededError):
        again.spend(key, 1.0, 1e-5)
    assert again.spend(key, 0.5, 1e-5)[0] == pytest.approx(1.5)
    data = PrivacyBudget(path).export()  # the ledger in its JSON form
    assert data["version"] == 1 and list(data["collections"]) == [key] and len(data["collections"][key]["spends"]) == 2
    assert not list(tmp_path.glob(".budget-*"))  # no temporary files left behind


def test_rerank_with_own_raw_features(service, svc_collection, svc_key, svc_split, tmp_path):
    Xq, yq = svc_split.query
    with Client(service.url, svc_key["key"], budget=_ledger(tmp_path)) as c:
        r = c.query(svc_collection, Xq[3], int(yq[3]), epsilon=1.0, rerank=True, protocol="privatemail_paper")
    assert r["reranked"] and r["distances"] == sorted(r["distances"])
    assert "features" not in r and len(r["item_ids"]) == 8


def test_collections_anchor_and_frame(service, svc_collection, admin_key, tmp_path):
    with Client(service.url, admin_key["key"], budget=_ledger(tmp_path)) as c:  # admin: items by id
        names = [x["name"] for x in c.collections()]
        assert svc_collection in names
        d = c.collection(svc_collection)
        assert d["active_run"]["params"] == {"n_components": 8} and d["n_items"] == 800
        doc = c.anchor_document(svc_collection)
        assert len(doc["anchor_ids"]) == 300 and doc["anchor_ids"][0].endswith(":0")
        assert len(doc["dummy_labels"]) == 150 and doc["frame"]["seed"] == 0
        frame, anchor = frame_from_document(doc)
        assert frame.anchor_embedding_.shape == (300, 8)
        bad = copy.deepcopy(doc)
        bad["frame"]["anchor_embedding"][0][0] += 0.5
        with pytest.raises(AlignmentError, match="does not reproduce"):
            frame_from_document(bad)
        items = c.items(svc_collection, [int(i) for i in c.query(svc_collection, doc["features"][0], doc["labels"][0],
                                                                   epsilon=2.0)["item_ids"][:2]], include_features=True)
        assert np.asarray(items["features"]).shape == (2, 64)
    spec = httpx.get(service.url + "/openapi.json").json()
    for p in ("/collections/{name}/resolve", "/collections/{name}/anchor", "/collections/{name}/jobs", "/jobs/{job_id}"):
        assert p in spec["paths"]
    assert "ResolveBody" in spec["components"]["schemas"]


@pytest.fixture(scope="module")
def admin_key(pm_home):
    from pm_vector.service.auth import create_key

    return create_key("e2e admin", role="admin")


def test_raw_features_only_if_allowed(service, admin_key, pm_home, svc_split):
    from pm_vector import db

    name = "svc_noraw"
    db.create_collection(name, 64, range(10))
    try:
        ids = db.ingest(name, svc_split.server[0][:5], svc_split.server[1][:5])["item_ids"]
        with Client(service.url, admin_key["key"]) as c:  # items by id need an admin key
            assert len(c.items(name, ids)["labels"]) == 5
            with pytest.raises(ServiceError) as e:
                c.items(name, ids, include_features=True)
            assert e.value.status == 403 and "allow_raw_features" in e.value.message
            with pytest.raises(ServiceError) as e:  # no run yet
                c.anchor_document(name)
            assert e.value.status in (404, 409)
    finally:
        db.drop_collection(name, missing_ok=True)


def test_job_through_the_api(service, admin_key, pm_home, svc_split, tmp_path):
    from pm_vector.bench.demo import prepare_collection

    name = "svc_job"
    from pm_vector import db

    small = svc_split
    prepare_collection(name, small)
    try:
        with Client(service.url, admin_key["key"], budget=str(tmp_path / "budget.json")) as c:
            with pytest.raises(ServiceError) as e:
                c.start_job(name, {"n_components": 8, "bogus": 1})
            assert e.value.status == 422 and "bogus" in e.value.message
            with pytest.raises(ServiceError) as e:
                c.start_job("no_such_collection")
            assert e.value.status == 404
            job = c.start_job(name, {"n_components": 4}, seed=7)
            assert job["status"] in ("queued", "running")
            seen = []
            done = c.wait_job(job["job_id"], progress=lambda j: seen.append(j["stage"]), poll=0.05)
            assert done["status"] == "succeeded" and done["result"]["status"] == "succeeded"
            assert set(done["stages"]) >= {"load", "embed", "write", "index", "switch"}
            assert c.collection(name)["active_run"]["seed"] == 7
            r = c.query(name, svc_split.query[0][0], int(svc_split.query[1][0]), epsilon=1.0)
            assert len(r["item_ids"]) == 8
            with pytest.raises(ServiceError) as e:
                c.job("nope")
            assert e.value.status == 404
    finally:
        db.drop_collection(name, missing_ok=True)


def test_concurrent_requests_share_the_pool(service, svc_collection, svc_key, svc_split, requests_logged):
    """32 requests from 16 concurrent clients through a 4-connection pool: all answered, all logged."""
    from concurrent.futures import ThreadPoolExecutor

    with Client(service.url, svc_key["key"]) as c:
        reqs = [c.build_request(svc_collection, svc_split.query[0][i], int(svc_split.query[1][i]),
                                epsilon=1.0, release="gaussian")[0].to_dict() for i in range(4)]
    before = requests_logged(svc_collection)

    def one(i):
        r = httpx.post(f"{service.url}/collections/{svc_collection}/resolve", json={"request": reqs[i % 4], "k": 8},
                       headers={"Authorization": f"Bearer {svc_key['key']}"}, timeout=60)
        return r.status_code, len(r.json().get("rows", []))

    with ThreadPoolExecutor(16) as ex:
        out = list(ex.map(one, range(32)))
    assert out == [(200, 10)] * 32
    assert requests_logged(svc_collection) == before + 32




def test_query_without_raw_features_reranks_by_published_codes(seeded_service, svc_collection, svc_key, svc_split):
    """A collection that does not hand out raw features answers compactly: Client.query re-ranks the
    real row by the published product codes (checked against the run's digest), exactly as the same
    re-rank in memory of the same candidates; its nn_recall is close to the raw-feature re-rank of the
    same release on the same data, and its answer is far smaller."""
    from pm_vector import db
    from pm_vector.bench.baselines import knn_search
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.manifold.codes import ProductCodes
    from pm_vector.bench.demo import prepare_collection

    name = "svc_codes"
    db.drop_collection(name, missing_ok=True)
    prep = prepare_collection(name, svc_split, allow_raw_features=False)
    try:
        db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
        Xq, yq = svc_split.query
        Xs, _ = svc_split.server
        exact = knn_search(Xq[:20], Xs, 8)
        ext = np.array([f"{svc_split.dataset.name}-{int(i)}" for i in svc_split.server_idx])
        ext_of = dict(zip(np.asarray(prep["item_ids"]).tolist(), ext.tolist()))
        # the codes fit in memory on the public anchor alone: the published ones
        from pm_vector.db.runs.class_rows import DEFAULTS

        A = np.asarray(svc_split.anchor[0], np.float32).astype(np.float64)
        mem_pc = ProductCodes(DEFAULTS["code_bytes"], DEFAULTS["code_stages"],
                              tuple(w for w in DEFAULTS["code_widths"] if w <= A.shape[1])).fit(A)
        with Client(seeded_service.url, svc_key["key"]) as c:
            doc = c.anchor_document(name)
            assert doc["frame"]["class_rows"]["codes"]["digest"] == mem_pc.digest()
            assert c.product_codes(name).digest() == mem_pc.digest()
            nn_c, nn_f, b_c, b_f = [], [], [], []
            for i in range(20):
                sent: list = []
                got: list = []
                c._http.event_hooks["request"] = [lambda req: sent.append(req)]
                c._http.event_hooks["response"] = [lambda resp: got.append(resp)]
                # seeded (tests only, through the internal path; the seeded service answers it): the
                # same release to both collections, so the same candidates
                r = c._query(name, Xq[i], int(yq[i]), epsilon=16.0, k=8, shortlist=32, release="gaussian",
                             rng=100 + i)
                c._http.event_hooks["request"] = c._http.event_hooks["response"] = []
                assert sent[-1].url.path.endswith("/resolve")  # nothing after the answer
                body = decode(sent[-1].content, sent[-1].headers["content-type"])  # msgpack: the default wire
                assert body["answer"] == "compact" and body["code_bytes"] == 64 and "include_features" not in body
                assert r["reranked"] == "codes" and r["answer"] == "compact" and len(r["item_ids"]) == 8
                assert r["distances"] == sorted(r["distances"]) and "codes" not in r and "labels" not in r
                # the same re-rank in memory of the real row's candidates
                got[-1].read()
                rows = decode(got[-1].content, got[-1].headers["content-type"].split(";")[0])["rows"]
                _, secret = c._build_request(name, Xq[i], int(yq[i]), epsilon=16.0, shortlist=32, release="gaussian",
                                             rng=100 + i)
                real = secret.pick(rows)
                q = np.asarray(Xq[i], np.float64) / np.linalg.norm(Xq[i])
                d = mem_pc.distances(q, np.asarray(real["codes"], np.uint8))
                assert r["item_ids"] == [real["item_ids"][j] for j in np.argsort(d, kind="stable")[:8]]
                f = c._query(svc_collection, Xq[i], int(yq[i]), epsilon=16.0, k=8, shortlist=32, release="gaussian",
                             answer="features", rng=100 + i)
                assert f["reranked"] == "features"
                nn_c.append(len({ext_of[v] for v in r["item_ids"]} & set(ext[exact[i]])) / 8)
                nn_f.append(len(set(f["external_ids"]) & set(ext[exact[i]])) / 8)
                b_c.append(r["bytes_received"])
                b_f.append(f["bytes_received"])
            # asking for features on this collection is refused before anything is sent
            with pytest.raises(Exception, match="does not hand out raw features"):
                c.query(name, Xq[0], int(yq[0]), epsilon=1.0, answer="features")
            # the raw endpoint: the default answer is compact, every row alike, no raw features
            req, _ = c.build_request(name, Xq[0], int(yq[0]), epsilon=4.0, shortlist=32, release="gaussian")
            raw = c._call("POST", f"/collections/{name}/resolve", {"request": req.to_dict()})
            assert raw["answer"] == "compact" and raw["codes"]["bytes"] == 32  # the residual code unless asked
            for row in raw["rows"]:
                assert set(row) == {"row", "item_ids", "codes"}  # no payloads stored: ids and codes only
                assert np.asarray(row["codes"]).shape == (32, 32) and len(row["item_ids"]) == 32
            short = c._call("POST", f"/collections/{name}/resolve", {"request": req.to_dict(), "code_bytes": 16})
            for row, srow in zip(raw["rows"], short["rows"]):
                assert np.asarray(srow["codes"]).tolist() == np.asarray(row["codes"])[:, :16].tolist()
            # a prefix that is not a stage width, and features on a collection without them, are refused
            for body, status, msg in (({"code_bytes": 40}, 422, r"published code widths \[16, 32, 64"),
                                      ({"code_bytes": 257}, 422, "code_bytes must be an integer in 8..256"),
                                      ({"answer": "features"}, 403, "allow_raw_features"),
                                      ({"answer": "compact", "include_features": True}, 422, "carries none"),
                                      ({"answer": "bogus"}, 422, "answer must be one of")):
                with pytest.raises(ServiceError) as e:
                    c._call("POST", f"/collections/{name}/resolve", {"request": req.to_dict(), **body})
                assert e.value.status == status and re.search(msg, e.value.message), (body, e.value.message)
        print(f"nn_recall@8 codes {np.mean(nn_c):.3f} features {np.mean(nn_f):.3f}; bytes received p50 "
              f"codes {np.median(b_c):.0f} features {np.median(b_f):.0f} (JSON)")
        assert np.median(b_c) < 0.5 * np.median(b_f)
        assert abs(np.mean(nn_c) - np.mean(nn_f)) <= 0.1
    finally:
        db.drop_collection(name, missing_ok=True)


def test_compact_answer_is_the_default_and_has_no_raw_features(service, svc_collection, svc_key, svc_split,
                                                                tmp_path):
    """On a collection that allows raw features the default answer is still compact: ids and code
    prefixes of k' x C candidates (the public rule's shape), no features; raw features on request.
    Published codes that do not hash to the run's digest are refused."""
    from pm_vector.manifold.codes import compact_answer_shape
    from pm_vector.protocol.codec import MSGPACK, encode

    Xq, yq = svc_split.query
    with Client(service.url, svc_key["key"], budget=_ledger(tmp_path)) as c:
        pc = c.product_codes(svc_collection)
        sizes = {}
        for release in ("cells", "gaussian"):
            kp, b = compact_answer_shape(10, release, 4.0, pc.widths_)
            got: list = []
            c._http.event_hooks["response"] = [lambda resp: got.append(resp)]
            r = c.query(svc_collection, Xq[0], int(yq[0]), epsilon=4.0, k=8, release=release)
            c._http.event_hooks["response"] = []
            got[-1].read()
            assert got[-1].headers["content-type"].startswith(MSGPACK)  # the default wire
            ans = decode(got[-1].content, MSGPACK)
            assert ans["answer"] == "compact" and ans["codes"] == {"bytes": b, "digest": pc.digest()}
            assert r["shortlist"] == kp and r["code_bytes"] == b and r["reranked"] == "codes"
            for row in ans["rows"]:
                assert set(row) == {"row", "item_ids", "codes"}  # the demo stores no payloads
                assert np.asarray(row["codes"]).shape == (kp, b)
            # on the wire (msgpack, pm_vector.protocol.codec): C k' (b + 4) bytes and a little framing,
            # and the whole request, both ways with the headers, within 50,000 bytes
            packed = len(got[-1].content)
            assert 10 * kp * (b + 4) < packed <= 10 * kp * (b + 4) + 1500, (packed, kp, b)
            assert r["bytes_per_request"] <= 50_000, r["bytes_per_request"]
            sizes[release] = (r["bytes_received"], packed)
            f = c.query(svc_collection, Xq[0], int(yq[0]), epsilon=4.0, k=8, release=release, answer="features")
            assert f["reranked"] == "features" and len(f["labels"]) == 8
        print("compact answer bytes (received on the wire with headers, the answer body):", sizes)
        # a codes document that is not the published one (a tampered centroid) is refused before any query
        cached = c._public[svc_collection]  # a PublicDocument
        cached.derived.pop("codes")
        doc = json.loads(json.dumps(cached.product_codes))
        raw = bytearray(__import__("base64").b64decode(doc["centroids"][0]["data"]))
        raw[0] ^= 1
        doc["centroids"][0]["data"] = __import__("base64").b64encode(bytes(raw)).decode()
        c._public[svc_collection] = dataclasses.replace(cached, product_codes=doc, derived={})
        with pytest.raises(AlignmentError, match="digest"):
            c.query(svc_collection, Xq[0], int(yq[0]), epsilon=4.0, k=8)
