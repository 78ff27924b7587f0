"""A body that trickles in is answered 408 once PM_VECTOR_SERVICE_BODY_TIMEOUT_S has passed; the
connection is closed and nothing is processed. Raw sockets, as a slow client would send."""

from __future__ import annotations

import json
import socket
import time

import pytest

from pm_vector.errors import InvalidInputError
from pm_vector.service.runner import ServiceThread
from pm_vector.service.settings import ServiceSettings


@pytest.fixture(scope="module")
def slow_service(pm_home):
    with ServiceThread(ServiceSettings(body_timeout_s=2, pool_max=2, request_log_retention_days=0)) as svc:
        yield svc


def _head(svc, key: str, path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{svc.port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


def _read_all(s: socket.socket, limit: float) -> bytes:
    s.settimeout(limit)
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out  # the server closed the connection
            out += chunk
    except socket.timeout:
        return out + b"<still open>"


def test_a_body_that_does_not_arrive_gets_408_and_the_connection_closes(slow_service, svc_collection, svc_key):
    with socket.create_connection(("127.0.0.1", slow_service.port), timeout=10) as s:
        t = time.monotonic()
        s.sendall(_head(slow_service, svc_key["key"], f"/collections/{svc_collection}/resolve", 1000) + b'{"reque')
        out = _read_all(s, 10)
        took = time.monotonic() - t
    assert out.startswith(b"HTTP/1.1 408"), out[:200]
    assert out.endswith(b"}") and not out.endswith(b"<still open>")  # answered, then closed
    body = json.loads(out.split(b"\r\n\r\n", 1)[1])
    assert body["error"] == "request_timeout"
    assert 1.5 < took < 4.0, took  # the 2-s limit, not the 20+ s a trickling client could hold it


def test_a_body_sent_in_pieces_within_the_limit_is_read(slow_service, svc_collection, svc_key):
    payload = json.dumps({"request": {"rows": "not rows"}, "k": 8}).encode()
    with socket.create_connection(("127.0.0.1", slow_service.port), timeout=10) as s:
        s.sendall(_head(slow_service, svc_key["key"], f"/collections/{svc_collection}/resolve", len(payload)))
        s.sendall(payload[:5])
        time.sleep(0.8)
        s.sendall(payload[5:])
        s.settimeout(10)
        out = s.recv(65536)
    assert out.startswith(b"HTTP/1.1 422"), out[:200]  # the whole body was read and judged


def test_body_timeout_setting_is_validated(monkeypatch):
    for bad in (0, -1, True, 2.5):
        with pytest.raises(InvalidInputError, match="body_timeout_s"):
            ServiceSettings(body_timeout_s=bad)
    monkeypatch.setenv("PM_VECTOR_SERVICE_BODY_TIMEOUT_S", "7")
    assert ServiceSettings.from_env().body_timeout_s == 7
    monkeypatch.setenv("PM_VECTOR_SERVICE_BODY_TIMEOUT_S", "soon")
    with pytest.raises(InvalidInputError):
        ServiceSettings.from_env()
