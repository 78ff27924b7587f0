"""The client's transport against a hostile server on loopback (tests/pmtest_hostile.py): answers
bounded in bytes, encodings and decoded objects, one deadline per exchange, every non-2xx and
every malformed answer one documented error, and the CLI saying ``error: ...`` without a
traceback. ``pytest -s`` prints the figures."""

from __future__ import annotations

import gzip
import json
import struct
import time

import httpx
import numpy as np
import pytest
from pmtest_hostile import Hostile, send, trickle

from pm_vector.client.budget import MemoryBudget
from pm_vector.client.http import Client
from pm_vector.client.transport import answer_bounds, answer_cap
from pm_vector.errors import MalformedAnswerError, ServiceError
from pm_vector.protocol.codec import MSGPACK, TooLargeError, decode_bounded, encode


def _client(url, **kw) -> Client:
    return Client(url, "pmv_test", budget=MemoryBudget(), **kw)


def _empty_lists(n: int) -> bytes:
    """A msgpack array of ``n`` empty arrays: ``n + 5`` bytes, about 64 n bytes of Python lists."""
    return b"\xdd" + struct.pack(">I", n) + b"\x90" * n


def test_a_msgpack_body_of_empty_lists_is_refused_by_its_object_bound():
    """Issue #35, finding 11: a 16 MiB msgpack answer of empty lists was refused after 4.7-5.3 s at
    +195-202 MB (msgpack built a million lists before the hook's count refused them). The body's
    maps and lists are now counted before anything is decoded (pm_vector.protocol.msgpack_counts)."""
    import tracemalloc

    body = _empty_lists(16 << 20)  # 16 MiB
    with Hostile(lambda h: send(h, 200, body, content_type=MSGPACK)) as h, _client(h.url) as c:
        t0 = time.perf_counter()
        with pytest.raises(MalformedAnswerError, match="maps and lists|lists and maps"):
            c.collection("x")
        took = time.perf_counter() - t0
    print(f"\n16 MiB msgpack of empty lists refused in {took:.2f} s")
    nested = b"\xdd" + struct.pack(">I", 8 << 20) + b"\x91\x00" * (8 << 20)  # 8 M lists of one value
    for bomb in (body, nested):
        t0 = time.perf_counter()
        with pytest.raises(TooLargeError, match="maps and lists"):
            decode_bounded(bomb, MSGPACK, **answer_bounds(64 << 20))
        took = time.perf_counter() - t0
        tracemalloc.start()  # (it slows the walk down: the time is taken without it)
        with pytest.raises(TooLargeError, match="maps and lists"):
            decode_bounded(bomb, MSGPACK, **answer_bounds(64 << 20))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"{len(bomb) >> 20} MiB bomb decoded under the 64 MiB cap: refused in {took:.2f} s, "
              f"peak {peak / 2 ** 20:.1f} MB allocated")
        assert peak < 16 << 20 and took < 2.5, (peak, took)  # before: 5.3 s, +140 MB
    # the decoder's own bound: a million containers at most for a 64 MiB cap, never the 16 million
    assert answer_bounds(64 << 20)["max_containers"] == 1 << 20
    with pytest.raises(TooLargeError):
        decode_bounded(_empty_lists(5000), MSGPACK, **answer_bounds(100_000))
    assert decode_bounded(encode({"a": [[1], [2]]}, MSGPACK), MSGPACK, **answer_bounds(100_000)) == {"a": [[1], [2]]}


def test_an_answer_over_its_byte_cap_is_refused_as_it_streams():
    sent = {}

    def answer(h):  # no Content-Length: the cap is met while reading, not before
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        sent["n"] = 0
        chunk = b" " * 65536
        try:
            for _ in range(1024):  # 64 MiB of JSON whitespace, if the client kept reading
                h.wfile.write(chunk)
                sent["n"] += len(chunk)
        except OSError:
            pass

    with Hostile(answer) as h, _client(h.url) as c:
        c.max_document_bytes = 1 << 20
        with pytest.raises(MalformedAnswerError, match="passed 1,048,576 bytes"):
            c.collection("x")
    with Hostile(lambda h: send(h, 200, b"{}", length=1 << 30)) as h, _client(h.url) as c:
        with pytest.raises(MalformedAnswerError, match="declares 1,073,741,824 bytes"):
            c.collection("x")


def test_an_encoded_answer_is_refused_and_identity_is_asked():
    doc = json.dumps({"name": "x", "pad": "a" * (8 << 20)}).encode()
    bomb = gzip.compress(doc, 9)
    assert len(bomb) < len(doc) // 500
    with Hostile(lambda h: send(h, 200, bomb, {"Content-Encoding": "gzip"})) as h, _client(h.url) as c:
        with pytest.raises(MalformedAnswerError, match="Content-Encoding 'gzip'"):
            c.collection("x")
        assert c._http.headers["accept-encoding"] == "identity"


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_trickling_server_is_cut_at_the_exchanges_deadline(where):
    body = json.dumps({"name": "x"}).encode()
    head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()

    def answer(h):
        if where == "body":
            h.wfile.write(head)
            trickle(h, body, 0.25)
        else:
            trickle(h, head + body, 0.1)

    with Hostile(answer) as h, _client(h.url, timeout=1.0) as c:
        t0 = time.perf_counter()
        with pytest.raises(httpx.TimeoutException):
            c.collection("x")
        took = time.perf_counter() - t0
    print(f"\ntrickle in the {where}, timeout=1: cut after {took:.2f} s")
    assert took < 1.5


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_service_error_and_not_followed(status):
    with Hostile(lambda h: send(h, status, b"", {"Location": "http://127.0.0.1:9/elsewhere"})) as h, \
            _client(h.url) as c:
        with pytest.raises(ServiceError, match=f"^{status} redirect: ") as e:
            c.collection("x")
        assert e.value.status == status and h.requests == [("GET", "/collections/x")]


@pytest.mark.parametrize("body,ctype,match", [
    (b"", "application/json", "empty"),
    (b"[1, 2]", "application/json", "not a map"),
    (b"null", "application/json", "not a map"),
    (b"{\"a\": ", "application/json", "cannot be read"),
    (b"\xc1", MSGPACK, "cannot be read"),
    (encode({"a": np.zeros(3)}, MSGPACK)[:-3], MSGPACK, "cannot be read"),
])
def test_a_malformed_2xx_answer_is_one_error(body, ctype, match):
    with Hostile(lambda h: send(h, 200, body, content_type=ctype)) as h, _client(h.url) as c:
        with pytest.raises(MalformedAnswerError, match=match) as e:
            c.collection("x")
        assert isinstance(e.value, ServiceError) and e.value.status == 200


def test_a_refusal_keeps_the_servers_message_printable():
    body = json.dumps({"error": "nope\x1b[31m", "message": "[bold]go away[/bold]\n"}).encode()
    with Hostile(lambda h: send(h, 403, body)) as h, _client(h.url) as c:
        with pytest.raises(ServiceError) as e:
            c.collection("x")
    assert e.value.status == 403 and "\x1b" not in str(e.value) and "\n" not in str(e.value)
    with Hostile(lambda h: send(h, 502, b"\xff\xfe garbage")) as h, _client(h.url) as c:
        with pytest.raises(ServiceError, match="^502 error: "):
            c.collection("x")


def test_the_resolve_cap_follows_the_published_shape():
    req = {"format": "pm_vector.class_rows.v1", "rows": [[0.0] * 8] * 10, "shortlist": 64}
    compact = answer_cap(req, 8, code_bytes=16, payload_bytes=256)
    assert compact == 64 * 1024 + 10 * 64 * (512 + 32 + (9 * 256 // 4 + 12) + 64)
    assert answer_cap(req, 8, n_features=784) > compact
    assert answer_cap({"n_query_rows": 10}, 50) == 64 * 1024 + 10 * 50 * (512 + 4096)


@pytest.mark.parametrize("status", [302, 200])
def test_cli_query_prints_an_error_and_no_traceback(status, tmp_path):
    from typer.testing import CliRunner

    from pm_vector.cli import app

    np.save(tmp_path / "q.npy", np.ones((1, 8)))
    answer = (lambda h: send(h, 302, b"", {"Location": "/x"})) if status == 302 else \
        (lambda h: send(h, 200, _empty_lists(1 << 22), content_type=MSGPACK))
    with Hostile(answer) as h:
        r = CliRunner().invoke(app, ["query", "x", "--features", str(tmp_path / "q.npy"), "--label", "0",
                                     "--epsilon", "1", "--url", h.url, "--api-key", "k", "--budget-file",
                                     str(tmp_path / "l.json")])
    assert r.exit_code != 0 and "error:" in r.output and "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_a_query_s_exchanges_share_one_deadline():
    """Every answer trickled to arrive just inside the timeout: the query, not each exchange,
    ends at the timeout."""
    def answer(h):
        body = json.dumps({"name": "x", "active_run_id": 1, "allow_raw_features": False, "pad": "p" * 20}).encode()
        raw = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
               "Connection: close\r\n\r\n").encode()
        h.wfile.write(raw)
        trickle(h, body, 1.2 / len(body))  # each answer whole in 1.2 s: within a 2 s exchange

    with Hostile(answer) as h, _client(h.url, timeout=2.0) as c:
        t0 = time.perf_counter()
        c.collection("x")  # one exchange: answered
        assert time.perf_counter() - t0 < 2.0
        t0 = time.perf_counter()
        with pytest.raises(httpx.TimeoutException):
            c.query("x", np.ones(8), 0, epsilon=1.0)
        took = time.perf_counter() - t0
        assert sum(p.endswith("/anchor") for _, p in h.requests) == 1  # the second exchange was cut
    print(f"\nevery answer trickled over 1.2 s, timeout=2: the query cut after {took:.2f} s")
    assert took < 3.0


@pytest.mark.parametrize("query", [np.zeros(64), np.full(64, 1e-300), np.full(64, 1e-170), np.r_[np.ones(63), np.nan]],
                         ids=["zero", "underflowing", "subnormal-norm", "nan"])
def test_a_bad_query_is_refused_before_the_first_request(query):
    """Issue #35, finding 12c: a zero or underflowing query failed after the first GET (the server
    saw a GET and no POST). Now it is refused before anything is sent, charged or built."""
    from pm_vector.errors import InvalidInputError

    with Hostile(lambda h: send(h, 200, b"{}")) as h, _client(h.url) as c:
        for call in (lambda: c.query("x", query, 0, epsilon=1.0),
                     lambda: c.query("x", query, epsilon=1.0, release="location"),
                     lambda: c.build_request("x", query, 0, epsilon=1.0)):
            with pytest.raises(InvalidInputError, match="query"):
                call()
        assert h.requests == []
        assert c.budget.status(c.budget_key())["releases"] == 0
