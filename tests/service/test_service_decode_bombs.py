"""Decoding bombs (issue 25, item 8): a body of the largest allowed size made of the cheapest
containers (an empty msgpack map is one byte, an empty Python dict 64) must be refused fast and
without the service's memory growing with the number of objects.

The service runs in this process (uvicorn thread), so the process's peak resident set during the
request (``VmHWM`` after a reset through ``/proc/self/clear_refs``) is the service's; the body is
built before the reset, so only what the service allocates counts (its copies of the body
included)."""

from __future__ import annotations

import struct
import time

import httpx
import pytest

from pm_vector.service.settings import ServiceSettings

MB = 1024 * 1024


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _bodies(size: int) -> dict[str, tuple[str, bytes]]:
    n = size - 5
    flat = b"\xdd" + struct.pack(">I", n) + b"\x80" * n  # one array of n empty maps
    inner = 10_000  # each list within any per-list bound: 1,677 arrays of 10,000 empty maps
    outer = (size - 5) // (inner + 5)
    nested = b"\xdd" + struct.pack(">I", outer) + (b"\xdd" + struct.pack(">I", inner) + b"\x80" * inner) * outer
    lists = b"\xdd" + struct.pack(">I", n) + b"\x90" * n  # empty lists
    js = b"[" + b"{}," * ((size - 4) // 3) + b"{}]"
    return {"msgpack empty maps": ("application/msgpack", flat),
            "msgpack nested empty maps": ("application/msgpack", nested),
            "msgpack empty lists": ("application/msgpack", lists),
            "json empty objects": ("application/json", js)}


@pytest.fixture(scope="module")
def big_service(pm_home):
    from pm_vector.service.runner import ServiceThread

    with ServiceThread(ServiceSettings(auth=False, max_body_bytes=16 * MB)) as svc:
        yield svc


@pytest.mark.parametrize("kind", list(_bodies(64)))
def test_a_16_mb_body_of_empty_containers_is_refused_fast_and_small(big_service, kind):
    if not _reset_peak():
        pytest.skip("needs /proc/self/clear_refs (Linux) to measure the peak")
    media, body = _bodies(16 * MB)[kind]
    assert len(body) <= 16 * MB
    with httpx.Client(timeout=60) as c:
        c.get(f"{big_service.url}/health")  # a warm connection
        rss0 = _status_kb("VmRSS")
        _reset_peak()
        t0 = time.perf_counter()
        r = c.post(f"{big_service.url}/collections/bombed/resolve", content=body,
                   headers={"Content-Type": media})
        took = time.perf_counter() - t0
        grown_mb = (_status_kb("VmHWM") - rss0) / 1024
    print(f"{kind}: {r.status_code} in {took:.3f} s, peak RSS +{grown_mb:.0f} MB")
    assert r.status_code in (400, 413, 422), r.text
    assert r.json()["error"] in ("payload_too_large", "malformed_msgpack", "malformed_json", "invalid_input")
    assert took < 1.0, f"{kind}: refused after {took:.2f} s"
    assert grown_mb < 100, f"{kind}: the service's resident set grew by {grown_mb:.0f} MB"
