"""Slow connections (issue 25, item 10): header lines that trickle in, and large bodies that do
not arrive. Raw sockets, as an attacker would send them, against the real service."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from pm_vector.errors import InvalidInputError
from pm_vector.service.runner import ServiceThread
from pm_vector.service.settings import ServiceSettings


@pytest.fixture(scope="module")
def svc(pm_home):
    st = ServiceSettings(header_timeout_s=1, body_timeout_s=10, pool_max=2, request_log_retention_days=0,
                         max_body_bytes=4 * 1024 * 1024, max_large_requests=2)
    with ServiceThread(st) as s:
        yield s


def _closed_within(s: socket.socket, limit: float) -> tuple[bool, bytes]:
    s.settimeout(0.05)
    out, t_end = b"", time.monotonic() + limit
    while time.monotonic() < t_end:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return True, out
        if not chunk:
            return True, out
        out += chunk
    return False, out


def test_header_lines_that_trickle_in_are_cut_off(svc):
    """200 connections that send a header line every 0.3 s (and 50 that send nothing) are all
    answered 408 and closed soon after the 1-s header timeout; without it they stayed open."""
    def trickle(i: int):
        with socket.create_connection(("127.0.0.1", svc.port), timeout=5) as s:
            t0 = time.monotonic()
            if i % 5:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            closed, out = False, b""
            while time.monotonic() - t0 < 6 and not closed:
                if i % 5:
                    try:
                        s.sendall(b"X-Slow: %d\r\n" % i)
                    except OSError:
                        closed = True
                        break
                closed, out = _closed_within(s, 0.3)
            return closed, time.monotonic() - t0, out

    with ThreadPoolExecutor(64) as ex:
        results = list(ex.map(trickle, range(250)))
    assert all(c for c, _, _ in results), sum(not c for c, _, _ in results)
    took = sorted(t for _, t, _ in results)
    print(f"250 slow connections closed; median {took[len(took) // 2]:.2f} s, max {took[-1]:.2f} s")
    assert took[len(took) // 2] < 3.0
    assert any(out.startswith(b"HTTP/1.1 408") and b"request_timeout" in out for _, _, out in results)
    assert httpx.get(f"{svc.url}/health", timeout=5).status_code == 200  # the service answers the others


def test_a_keep_alive_connection_may_stay_idle_longer_than_the_header_timeout(svc):
    with httpx.Client(timeout=5) as c:
        assert c.get(f"{svc.url}/health").status_code == 200
        time.sleep(1.5)  # idle between requests: the keep-alive timer's business (30 s), not the header timer's
        assert c.get(f"{svc.url}/health").status_code == 200
        assert c.get(f"{svc.url}/health").headers.get("connection") != "close"


def test_large_bodies_that_do_not_arrive_hold_no_slot(svc, svc_key, svc_admin_key, svc_collection):
    """Four sockets of one key declare 2 MB and send one byte; another key's 2 MB request is
    answered at once (it waited 19-20 s for the slots before)."""
    head = (f"POST /collections/{svc_collection}/resolve HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            f"{svc_key['key']}\r\nContent-Type: application/json\r\nContent-Length: {2 * 1024 * 1024}\r\n\r\n{{")
    socks = [socket.create_connection(("127.0.0.1", svc.port), timeout=5) for _ in range(4)]
    try:
        for s in socks:
            s.sendall(head.encode())
        time.sleep(0.3)
        body = b'{"k": 8, "request": {"rows": [[' + b"0," * (1024 * 1024 - 20) + b'0]]}}'
        t0 = time.monotonic()
        r = httpx.post(f"{svc.url}/collections/{svc_collection}/resolve", content=body, timeout=30,
                       headers={"Authorization": f"Bearer {svc_admin_key['key']}", "Content-Type": "application/json"})
        took = time.monotonic() - t0
    finally:
        for s in socks:
            s.close()
    print(f"a 2 MB request beside 4 stalled large bodies of another key: {r.status_code} in {took:.3f} s")
    assert r.status_code in (413, 422), r.text  # judged (one row of a million values), not left waiting
    assert took < 3.0, took


def test_header_timeout_setting_is_validated(monkeypatch):
    for bad in (0, -1, True, 2.5):
        with pytest.raises(InvalidInputError, match="header_timeout_s"):
            ServiceSettings(header_timeout_s=bad)
    monkeypatch.setenv("PM_VECTOR_SERVICE_HEADER_TIMEOUT_S", "7")
    assert ServiceSettings.from_env().header_timeout_s == 7
