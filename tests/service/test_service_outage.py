"""The database dies under a running service (SIGKILL of the PostgreSQL server and its backends):
resolve answers 503 with Retry-After, /health says the database is unreachable, and both recover
by themselves once the server is back -- no 500, no service restart.

This file runs last in tests/service (it restarts the session's server); it leaves it running."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx

from pm_vector.client.http import Client


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.append(int(d.name))
    return out


def _kill_server() -> None:
    from pm_vector.db import server

    pid = server.status()["pid"]
    assert pid, "the embedded server is not running"
    for p in [pid] + _children(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (Path(f"/proc/{pid}").exists() or _children(pid)):
        time.sleep(0.05)


def test_database_outage_gives_503_and_recovers(service, svc_collection, svc_key, svc_split):
    from pm_vector.db import engine, server

    Xq, yq = svc_split.query
    with Client(service.url, svc_key["key"]) as c:
        body = json.dumps({"request": c.build_request(svc_collection, Xq[0], int(yq[0]), epsilon=1.0,
                                                      shortlist=16)[0].to_dict(), "k": 8})
    h = {"Authorization": f"Bearer {svc_key['key']}", "Content-Type": "application/json"}
    url = f"{service.url}/collections/{svc_collection}/resolve"
    assert httpx.get(f"{service.url}/health").json()["database"] == "ok"
    assert httpx.post(url, content=body, headers=h, timeout=30).status_code == 200

    # the test server runs with synchronous_commit off (PM_VECTOR_EMBEDDED_FAST): write out what the
    # session committed so far (the key, the collection), as a production server would have it
    from pm_vector import db

    with db.connect(autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    _kill_server()
    try:
        r = httpx.get(f"{service.url}/health", timeout=30)
        assert r.status_code == 503 and r.json()["database"] == "unreachable" and r.headers["Retry-After"]
        for _ in range(3):  # every request, not only the first: 503 with Retry-After, never 500
            t = time.monotonic()
            r = httpx.post(url, content=body, headers=h, timeout=30)
            assert r.status_code == 503, (r.status_code, r.text)
            assert r.json()["error"] == "database_unavailable" and int(r.headers["Retry-After"]) > 0
            assert time.monotonic() - t < 15  # a bounded wait, not a hang
    finally:
        server.start()
        engine.dispose_engines()

    deadline = time.monotonic() + 60
    while httpx.get(f"{service.url}/health", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "the service did not see the database come back"
        time.sleep(0.5)
    for _ in range(3):  # the pool replaced its dead sessions: no request pays for them
        r = httpx.post(url, content=body, headers=h, timeout=30)
        assert r.status_code == 200, (r.status_code, r.text)
        assert len(r.json()["rows"]) == 10
