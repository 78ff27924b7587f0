"""Bounds on memory under large requests: at most ``max_large_requests`` large bodies are handled
at once (the others wait, and all are answered), and glibc returns freed memory."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from pm_vector.service import memory
from pm_vector.service.memory import LargeRequestGate
from pm_vector.service.settings import ServiceSettings


def test_gate_lets_at_most_slots_large_requests_run():
    running, peak = 0, 0

    async def app(scope, receive, send):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1

    async def main():
        gate = LargeRequestGate(app, threshold_bytes=100, slots=2)
        big = {"type": "http", "method": "POST", "headers": [(b"content-length", b"5000")]}
        chunked = {"type": "http", "method": "POST", "headers": [(b"transfer-encoding", b"chunked")]}
        small = {"type": "http", "method": "POST", "headers": [(b"content-length", b"10")]}
        await asyncio.gather(*[gate(s, None, None) for s in [big] * 6 + [chunked] * 2])
        assert peak == 2 and gate.max_running == 2
        await asyncio.gather(*[gate(small, None, None) for _ in range(6)])  # small bodies are not held back
        return peak

    assert asyncio.run(main()) == 6


def test_settings_of_the_gate_are_validated():
    from pm_vector.errors import InvalidInputError

    for bad in ({"max_large_requests": 0}, {"large_request_bytes": 0}, {"max_large_requests": 1.5}):
        with pytest.raises(InvalidInputError):
            ServiceSettings(**bad)


def test_malloc_settings_apply_on_glibc():
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    assert memory.configure_malloc() is True
    assert memory.trim() is True


def test_parallel_large_requests_all_answered_with_one_slot(svc_home, svc_collection, svc_key, svc_split):
    """Eight parallel large resolves through one slot: every one gets its answer (none refused,
    none lost), in turn."""
    from pm_vector.client.http import Client
    from pm_vector.service.runner import ServiceThread

    st = ServiceSettings(max_rows=2000, max_dim=64, max_body_bytes=2 * 1024 * 1024, pool_max=4,
                         max_large_requests=1, large_request_bytes=1000, request_log_retention_days=0)
    Xq, yq = svc_split.query
    with ServiceThread(st) as svc:
        with Client(svc.url, svc_key["key"]) as c:
            body = json.dumps({"request": c.build_request(svc_collection, Xq[0], int(yq[0]), epsilon=1.0,
                                                          shortlist=16)[0].to_dict(), "k": 8})
        assert len(body) > 1000
        h = {"Authorization": f"Bearer {svc_key['key']}", "Content-Type": "application/json"}
        with ThreadPoolExecutor(8) as ex:
            codes = list(ex.map(lambda _: httpx.post(f"{svc.url}/collections/{svc_collection}/resolve",
                                                     content=body, headers=h, timeout=60).status_code, range(8)))
        layer = svc.app.middleware_stack  # the gate in the app's middleware chain
        while layer is not None and not isinstance(layer, LargeRequestGate):
            layer = getattr(layer, "app", None)
    assert codes == [200] * 8
    assert layer is not None and layer.max_running == 1
