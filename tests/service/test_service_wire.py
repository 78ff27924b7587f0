"""The wire format through the real service on loopback: the same answers in JSON and msgpack,
content negotiation, malformed msgpack bodies refused cleanly (the service keeps serving), and
the client's traffic recorded by a loopback proxy: its byte counts are the bytes on the wire, and
nothing follows the resolve."""

from __future__ import annotations

import socket
import struct
import threading

import httpx
import msgpack
import numpy as np
import pytest

from pm_vector.client.budget import MemoryBudget
from pm_vector.client.http import Client
from pm_vector.protocol.codec import JSON, MSGPACK, decode, encode


def _plain(doc):
    """A document as JSON would carry it (arrays as lists, NaN as None)."""
    import json

    return json.loads(encode(doc, JSON))


def _drop_volatile(res):
    return {k: v for k, v in res.items() if k not in ("timings_ms", "request_log_id")}


@pytest.fixture(scope="module")
def body(service, svc_collection, svc_key, svc_split):
    """A valid resolve body (class rows, raw features asked for: float32 arrays in the answer)."""
    with Client(service.url, svc_key["key"], budget=MemoryBudget()) as c:
        req, _ = c.build_request(svc_collection, svc_split.query[0][0], int(svc_split.query[1][0]), epsilon=1.0,
                                 shortlist=16, release="gaussian")
    return {"request": req.to_dict(), "k": 8, "include_features": True}


def _post(service, key, name, content, ctype=MSGPACK, accept=None):
    h = {"Authorization": f"Bearer {key['key']}", "Content-Type": ctype}
    if accept is not None:
        h["Accept"] = accept
    return httpx.post(f"{service.url}/collections/{name}/resolve", content=content, headers=h, timeout=60)


def test_same_answer_in_json_and_msgpack(service, svc_collection, svc_key, body):
    """One request, four ways (body JSON or msgpack, answer JSON or msgpack): the same answer; the
    msgpack answer carries the features as float32 arrays and is smaller."""
    rows = np.asarray(body["request"]["rows"])  # (classes, the class frames' components)
    as_arrays = {**body, "request": {**body["request"], "rows": rows}}  # arrays where lists of numbers are
    answers = {}
    for bt, content in ((JSON, encode(body, JSON)), (MSGPACK, encode(as_arrays, MSGPACK))):
        for at in (JSON, MSGPACK):
            r = _post(service, svc_key, svc_collection, content, ctype=bt, accept=at)
            assert r.status_code == 200, r.text
            assert r.headers["content-type"] == at and "accept" in r.headers["vary"].lower()
            answers[bt, at] = (r.content, decode(r.content, at))
    ref = _drop_volatile(answers[JSON, JSON][1])
    for (bt, at), (raw, doc) in answers.items():
        assert _drop_volatile(_plain(doc)) == ref, (bt, at)
    feats = answers[MSGPACK, MSGPACK][1]["rows"][0]["features"]
    assert isinstance(feats, np.ndarray) and feats.dtype == np.float32 and feats.shape == (16, 64)
    print(f"resolve answer: JSON {len(answers[JSON, JSON][0]):,} B, msgpack {len(answers[MSGPACK, MSGPACK][0]):,} B")
    assert len(answers[MSGPACK, MSGPACK][0]) < 0.8 * len(answers[JSON, JSON][0])


def test_anchor_document_travels_as_arrays(service, svc_collection, svc_key):
    h = {"Authorization": f"Bearer {svc_key['key']}"}
    url = f"{service.url}/collections/{svc_collection}/anchor"
    j = httpx.get(url, headers=h, timeout=60)
    m = httpx.get(url, headers={**h, "Accept": MSGPACK}, timeout=60)
    assert j.headers["content-type"] == JSON and m.headers["content-type"] == MSGPACK
    doc = decode(m.content, MSGPACK)
    for key, shape in (("features", (300, 64)), ("dummy_features", (150, 64)), ("labels", (300,))):
        assert isinstance(doc[key], np.ndarray) and doc[key].shape == shape, key
    assert isinstance(doc["frame"]["anchor_embedding"], np.ndarray)
    assert _plain(doc) == j.json()
    print(f"anchor document: JSON {len(j.content):,} B, msgpack {len(m.content):,} B")
    assert len(m.content) < len(j.content)


@pytest.mark.parametrize("accept,expect", [
    (None, JSON), ("*/*", JSON), ("application/*", JSON), (JSON, JSON), (MSGPACK, MSGPACK),
    ("application/x-msgpack", MSGPACK), (f"{MSGPACK};q=0.2, {JSON}", JSON), (f"{JSON};q=0.5, {MSGPACK}", MSGPACK),
    ("text/html, */*;q=0.1", JSON), (f"{JSON};q=0, */*", MSGPACK), ("text/html", 406), (f"{MSGPACK};q=0", 406)])
def test_accept_negotiation(accept, expect, service, svc_collection, svc_key, body, requests_logged):
    before = requests_logged(svc_collection)
    r = _post(service, svc_key, svc_collection, encode(body, MSGPACK), accept=accept)
    if expect == 406:
        assert r.status_code == 406 and r.json()["error"] == "not_acceptable", r.text
        assert requests_logged(svc_collection) == before  # refused before any work
        return
    assert r.status_code == 200 and r.headers["content-type"] == expect
    assert len(decode(r.content, expect)["rows"]) == 10


def _mutated(body, **request):
    return {**body, "request": {**body["request"], **request}}


def _ext(code, data):
    return msgpack.ExtType(code, data)


def _arr(code, shape, data):
    return _ext(1, struct.pack(f"<BB{len(shape)}I", code, len(shape), *shape) + data)


BAD = {  # name: (body bytes from the valid body, status, needle)
    "truncated": (lambda b: encode(b, MSGPACK)[:-7], 400, "not valid msgpack"),
    "trailing": (lambda b: encode(b, MSGPACK) + b"\xc0", 400, "not valid msgpack"),
    "json_sent_as_msgpack": (lambda b: encode(b, JSON), 400, "not valid msgpack"),
    "empty": (lambda b: b"", 400, "empty"),
    "ext_type_7": (lambda b: msgpack.packb(_mutated(b, rows=_ext(7, b"\x05\x01\x01\x00\x00\x00abcd"))), 400,
                   "extension type 7"),
    "timestamp": (lambda b: msgpack.packb(_mutated(b, epsilon=msgpack.Timestamp(1, 0))), 400, "Timestamp"),
    "shape_data_mismatch": (lambda b: msgpack.packb(_mutated(b, rows=_arr(6, (10, 64), b"\x00" * 8 * 639))), 400,
                            "does not match"),
    "unknown_dtype": (lambda b: msgpack.packb(_mutated(b, rows=_arr(99, (1,), b"\x00"))), 400, "dtype code 99"),
    "three_dims": (lambda b: msgpack.packb(_mutated(b, rows=_arr(6, (1, 10, 64), b"\x00" * 8 * 640))), 400,
                   "3 dimensions"),
    "deep_nesting": (lambda b: b"\x81\xa1k" + b"\x91" * 40 + b"\x00", 400, "deeper than"),
    "very_deep_nesting": (lambda b: b"\x91" * 200_000 + b"\x00", 400, "deeper than"),
    "declared_array_4g": (lambda b: b"\x81\xa1k\xdd\xff\xff\xff\xff" + b"\x00" * 64, 400, "not valid msgpack"),
    "declared_bin_4g": (lambda b: b"\x81\xa1k\xc6\xff\xff\xff\xff" + b"\x00" * 64, 400, "not valid msgpack"),
    "declared_shape_huge": (lambda b: msgpack.packb(_mutated(b, rows=_arr(6, (65535, 65535), b""))), 413,
                            "elements"),
    "shape_overflow": (lambda b: msgpack.packb(_mutated(b, rows=_arr(6, (2 ** 32 - 1,) * 2, b""))), 413,
                       "elements"),
    "int_map_key": (lambda b: msgpack.packb({**b, 1: 2}), 400, "not valid msgpack"),
    "bin_value": (lambda b: msgpack.packb(_mutated(b, frames_digest=b"\x00" * 32), use_bin_type=True), 400,
                  "binary"),
    "not_a_map": (lambda b: msgpack.packb([1, 2, 3]), 422, "object"),
    "k_as_string": (lambda b: encode({**b, "k": "8"}, MSGPACK), 422, "k must be"),
    "k_as_float": (lambda b: encode({**b, "k": 8.0}, MSGPACK), 422, "k must be"),
    "include_features_int": (lambda b: encode({**b, "include_features": 1}, MSGPACK), 422, "include_features"),
    "rows_nan": (lambda b: encode(_mutated(b, rows=np.full((10, 64), np.nan)), MSGPACK), 422, "NaN"),
    "rows_1e300": (lambda b: encode(_mutated(b, rows=np.full((10, 64), 1e300)), MSGPACK), 422, "beyond"),
    "rows_too_many": (lambda b: encode(_mutated(b, rows=np.zeros((2001, len(b["request"]["rows"][0])))), MSGPACK),
                      413, "at most 2,000"),
    "array_over_the_cap": (lambda b: encode(_mutated(b, rows=np.zeros((2001, 64))), MSGPACK), 413,
                           "at most 128,000"),  # max_rows x max_dim: refused from the header
    "rows_too_wide": (lambda b: encode(_mutated(b, rows=np.zeros((10, 65))), MSGPACK), 413, "at most 64"),
    "rows_one_dim": (lambda b: encode(_mutated(b, rows=np.zeros(640)), MSGPACK), 422, "rows"),
    "epsilon_array": (lambda b: encode(_mutated(b, epsilon=np.ones(1)), MSGPACK), 422, "epsilon"),
    "classes_floats": (lambda b: encode(_mutated(b, classes=np.arange(10) + 0.5), MSGPACK), 422, "classes"),
    "request_a_list": (lambda b: encode({**b, "request": [1, 2]}, MSGPACK), 422, "request"),
    "unknown_field": (lambda b: encode({**b, "extra": np.zeros(3)}, MSGPACK), 422, "unknown field"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_msgpack_refused(case, service, svc_collection, svc_key, body, requests_logged):
    make, status, needle = BAD[case]
    before = requests_logged(svc_collection)
    r = _post(service, svc_key, svc_collection, make(body))
    assert r.status_code == status, (case, r.status_code, r.text)
    assert r.headers["content-type"] == JSON and needle in r.json()["message"], (case, r.json())
    assert requests_logged(svc_collection) == before
    ok = _post(service, svc_key, svc_collection, encode(body, MSGPACK), accept=MSGPACK)  # keeps serving
    assert ok.status_code == 200 and len(decode(ok.content, MSGPACK)["rows"]) == 10


def test_msgpack_bodies_on_the_other_endpoints(service, svc_collection, svc_key, svc_admin_key, body):
    """items, jobs and kahm/distances read msgpack bodies through the same validation."""
    h = {"Authorization": f"Bearer {svc_admin_key['key']}", "Content-Type": MSGPACK, "Accept": MSGPACK}
    ids = decode(_post(service, svc_key, svc_collection, encode(body, MSGPACK), accept=MSGPACK).content,
                 MSGPACK)["rows"][0]["item_ids"][:2]  # two of the collection's items
    r = httpx.post(f"{service.url}/collections/{svc_collection}/items", headers=h, timeout=60,
                   content=encode({"ids": np.asarray(ids), "include_features": True}, MSGPACK))
    assert r.status_code == 200 and r.headers["content-type"] == MSGPACK
    assert np.asarray(decode(r.content, MSGPACK)["features"]).shape == (2, 64)
    r = httpx.post(f"{service.url}/collections/{svc_collection}/items", headers=h, timeout=60,
                   content=encode({"ids": np.zeros((2, 2), np.int64)}, MSGPACK))
    assert r.status_code == 422, r.text
    r = httpx.post(f"{service.url}/collections/{svc_collection}/jobs", headers=h, timeout=60,
                   content=encode({"params": [1], "seed": "x"}, MSGPACK))
    assert r.status_code == 422 and "params" in r.json()["message"]
    r = httpx.post(f"{service.url}/collections/{svc_collection}/kahm/distances", timeout=60,
                   headers={**h, "Authorization": f"Bearer {svc_key['key']}"},
                   content=encode({"features": np.zeros((2, 64)) + np.nan}, MSGPACK))
    assert r.status_code == 422 and "NaN" in r.json()["message"]


# ----------------------------------------------------------------------------- the client's traffic

class CountingProxy:
    """A loopback TCP proxy that splits the HTTP/1.1 stream into exchanges (Content-Length framing,
    the only one the client and the service use) and records each: the request line and the
    bytes each way, as they passed through the sockets."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.requests: list[list] = []  # [request line, bytes out, bytes in]
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream_port))
            mine: list = []
            threading.Thread(target=self._pump, args=(conn, up, mine, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, conn, mine, False), daemon=True).start()

    def _pump(self, src, dst, mine, outgoing):
        buf, n_done = b"", 0
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            buf += data
            while b"\r\n\r\n" in buf:  # complete messages
                head, rest = buf.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v)
                if len(rest) < length:
                    break
                size = len(head) + 4 + length
                with self.lock:
                    if outgoing:
                        rec = [head.split(b"\r\n", 1)[0].decode(), size, None]
                        mine.append(rec)
                        self.requests.append(rec)
                    else:
                        mine[n_done][2] = size
                        n_done += 1
                buf = buf[size:]
            dst.sendall(data)

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("wire", ["msgpack", "json"])
def test_client_traffic(wire, service, svc_collection, svc_key, svc_split):
    """A query's requests, recorded by a loopback proxy: the resolve is the last, nothing follows
    the answer, bodies travel in the client's wire format, and ``bytes_per_request`` is exactly
    the resolve's bytes on the wire, both ways."""
    port = int(service.url.rsplit(":", 1)[1])
    proxy = CountingProxy(port)
    Xq, yq = svc_split.query
    try:
        with Client(proxy.url, svc_key["key"], budget=MemoryBudget(default_epsilon=100.0), wire=wire) as c:
            seen: list = []
            c._http.event_hooks["request"] = [lambda req: seen.append(req)]
            results = [c.query(svc_collection, Xq[i], int(yq[i]), epsilon=4.0, k=8, shortlist=16, release=rel)
                       for i, rel in ((0, "gaussian"), (1, "cells"), (2, "gaussian"))]
            n = len(proxy.requests)
        with proxy.lock:
            reqs = list(proxy.requests)
        assert len(reqs) == n  # nothing after the last answer (the client closed; the proxy saw all)
        media = MSGPACK if wire == "msgpack" else JSON
        resolves = [i for i, r in enumerate(reqs) if r[0].startswith("POST ") and r[0].split()[1].endswith("/resolve")]
        assert len(resolves) == 3 and resolves[-1] == len(reqs) - 1
        for k, (i, res) in enumerate(zip(resolves, results)):
            # between two queries only reads of public documents: no request depends on an answer
            assert all(r[0].startswith("GET ") for r in reqs[(resolves[k - 1] + 1 if k else 0):i])
            assert (res["bytes_sent"], res["bytes_received"]) == (reqs[i][1], reqs[i][2]), (wire, reqs[i])
            assert res["bytes_per_request"] == reqs[i][1] + reqs[i][2] and res["wire"] == wire
            assert len(res["item_ids"]) == 8
        posts = [q for q in seen if q.method == "POST"]
        assert all(q.headers["content-type"] == media for q in posts)
        assert decode(posts[-1].content, media)["request"]["format"]
        print(f"{wire}: bytes per request (sent + received) "
              f"{[r['bytes_sent'] for r in results]} + {[r['bytes_received'] for r in results]}")
    finally:
        proxy.close()


def test_json_client_and_msgpack_client_agree(service, svc_collection, svc_key, svc_split):
    """The JSON client (wire="json") still works end to end, and reads the same anchor."""
    with Client(service.url, svc_key["key"], budget=MemoryBudget(), wire="json") as cj, \
            Client(service.url, svc_key["key"], budget=MemoryBudget()) as cm:
        assert _plain(cm.anchor_document(svc_collection)) == cj.anchor_document(svc_collection)
        r = cj.query(svc_collection, svc_split.query[0][3], int(svc_split.query[1][3]), epsilon=2.0)
        assert len(r["item_ids"]) == 8 and r["wire"] == "json" and r["reranked"] == "codes"  # the compact answer: the default
    with pytest.raises(Exception, match="wire must be"):
        Client(service.url, svc_key["key"], wire="cbor")


def test_corrupted_msgpack_bodies_never_5xx(service, svc_collection, svc_key, body):
    """300 random corruptions of a valid msgpack body (bytes flipped, cut, spliced) on one
    keep-alive connection: each answered with a status below 500 (400/413/422, or 200 when the
    corruption left a valid request), and the connection keeps serving."""
    valid = encode({**body, "request": {**body["request"], "rows": np.asarray(body["request"]["rows"])}}, MSGPACK)
    rng = np.random.default_rng(3)
    h = {"Authorization": f"Bearer {svc_key['key']}", "Content-Type": MSGPACK, "Accept": MSGPACK}
    seen: dict[int, int] = {}
    with httpx.Client(base_url=service.url, headers=h, timeout=60) as c:
        for i in range(300):
            b = bytearray(valid)
            kind = i % 3
            if kind == 0:
                for j in rng.integers(0, len(b), int(rng.integers(1, 6))):
                    b[j] = int(rng.integers(0, 256))
            elif kind == 1:
                b = b[: int(rng.integers(0, len(b)))]
            else:
                j = int(rng.integers(0, len(b)))
                b = b[:j] + bytes(rng.integers(0, 256, int(rng.integers(1, 40))).astype(np.uint8)) + b[j:]
            r = c.post(f"/collections/{svc_collection}/resolve", content=bytes(b))
            assert r.status_code < 500, (i, r.status_code, r.text)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
        ok = c.post(f"/collections/{svc_collection}/resolve", content=valid)
        assert ok.status_code == 200 and len(decode(ok.content, MSGPACK)["rows"]) == 10
    print(f"statuses of 300 corrupted bodies: {dict(sorted(seen.items()))}")
    assert seen.get(400, 0) > 100


def test_openapi_lists_both_body_types(service):
    spec = httpx.get(service.url + "/openapi.json").json()
    for path in ("/collections/{name}/resolve", "/collections/{name}/kahm/distances", "/collections/{name}/items",
                 "/collections/{name}/jobs"):
        assert set(spec["paths"][path]["post"]["requestBody"]["content"]) == {JSON, MSGPACK}, path
