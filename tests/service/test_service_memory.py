"""Bounds on memory under large requests: at most ``max_large_requests`` large bodies are handled
at once (the others wait, and all are answered), and glibc returns freed memory."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from pm_vector.service import memory
from pm_vector.service.middleware.large_requests import LargeRequestGate
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
        async def receive():
            return {"type": "http.request", "body": b"x", "more_body": False}

        # each from its own address: one owner's bodies are limited on their own (the next test)
        await asyncio.gather(*[gate({**s, "client": (f"10.0.0.{i}", 1)}, receive, None)
                               for i, s in enumerate([big] * 6 + [chunked] * 2)])
        assert peak == 2 and gate.max_running == 2
        await asyncio.gather(*[gate(small, None, None) for _ in range(6)])  # small bodies are not held back
        return peak

    assert asyncio.run(main()) == 6


def test_a_slow_body_holds_no_slot_and_one_key_holds_at_most_its_share():
    """Issue 25, item 10: four requests of one key that declare a large body and send one byte
    held both slots, and another key's large request waited 19-20 s. Now a slot is taken once
    the body has arrived, and one key has at most ``slots`` large bodies arriving at once."""
    handled = []

    async def app(scope, receive, send):
        m = await receive()
        handled.append((scope["state"]["api_key"]["id"], m["body"]))

    async def main():
        gate = LargeRequestGate(app, threshold_bytes=100, slots=2)
        never = asyncio.Event()
        started = []

        def scope(key_id):
            return {"type": "http", "method": "POST", "headers": [(b"content-length", b"5000")],
                    "state": {"api_key": {"id": key_id}}, "client": ("10.0.0.1", 1)}

        async def slow_receive():  # one byte, then nothing
            started.append(1)
            if len(started) > 100:
                raise AssertionError("unreachable")
            await never.wait()

        async def fast_receive():
            return {"type": "http.request", "body": b"y" * 5000, "more_body": False}

        slow = [asyncio.create_task(gate(scope(1), slow_receive, None)) for _ in range(4)]
        await asyncio.sleep(0.05)
        assert len(started) == 2  # key 1's other two bodies wait, unread
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(gate(scope(2), fast_receive, None), 1.0)  # another key is not held back
        took = asyncio.get_running_loop().time() - t0
        assert handled == [(2, b"y" * 5000)] and took < 0.5
        assert gate.max_running == 1  # the slow bodies never took a slot
        for t in slow:
            t.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
        assert gate._reading == {}  # nothing left behind per key

    asyncio.run(main())


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


def test_parallel_large_requests_all_answered_with_one_slot(pm_home, svc_collection, svc_key, svc_split):
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
                                                          shortlist=16, release="gaussian")[0].to_dict(), "k": 8})
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
