"""CPU time of the service per repeated resolve, in-process (issue 35: ``bench load``'s service share).

Prepares a digits collection (``pm_vector.bench.loadtest.prepare``) on the database of
``PM_VECTOR_HOME``, builds 16 real location requests with the real client, then sends ``N`` of
them through the service's ASGI application itself (its middleware, its routes, its pools; no HTTP
parser, no load generator), 4 at a time, three rounds, and prints the process CPU time
(``time.process_time``: every thread, the resolves' worker threads included) per request. On a
shared machine CPU time, not wall time, is the figure that survives the load. ``--profile``: one
round under ``cProfile`` (``time.process_time``), the resolve run inline on the event loop so that
one thread holds it all; the top of the profile is printed.

    PM_VECTOR_HOME=/tmp/h python tools/resolve_cpu.py 2000 [--profile]
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import sys
import time

from pm_vector import db
from pm_vector.bench.loadtest import _run_async, _split_for, prepare
from pm_vector.client.budget import MemoryBudget
from pm_vector.client.http import Client
from pm_vector.protocol.codec import MSGPACK, encode
from pm_vector.service.app import create_app
from pm_vector.service.auth import create_key, revoke_key
from pm_vector.service.runner import ServiceThread
from pm_vector.service.settings import ServiceSettings


def _bodies(settings, name: str, key: str) -> list[bytes]:
    Xq, yq = _split_for(10, 0).query
    with ServiceThread(settings) as svc, Client(svc.url, key, budget=MemoryBudget(default_epsilon=100.0, default_delta=0.5)) as c:
        return [encode({"request": c.build_request(name, Xq[i % len(yq)], int(yq[i % len(yq)]), epsilon=1.0)[0]
                        .to_dict(), "k": 8}, MSGPACK) for i in range(16)]


async def _drive(app, name: str, key: str, bodies: list[bytes], n: int, profile: bool) -> list[float]:
    path = f"/collections/{name}/resolve"
    headers = [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {key}".encode()),
               (b"content-type", MSGPACK.encode()), (b"accept", MSGPACK.encode())]

    async def one(body: bytes) -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": headers + [(b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000), "state": {}}
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        status = []

        async def receive():
            if messages:
                return messages.pop()
            await asyncio.sleep(3600)

        async def send(m):
            if m["type"] == "http.response.start":
                status.append(m["status"])

        await app(scope, receive, send)
        if status != [200]:
            raise RuntimeError(f"resolve answered {status}")

    conc = 1 if profile else 4

    async def worker(w: int) -> None:
        for i in range(w, n, conc):
            await one(bodies[i % len(bodies)])

    figures = []
    async with app.router.lifespan_context(app):
        for i in range(200):  # warm: the repeated request's one statement, the pools
            await one(bodies[i % len(bodies)])
        prof = cProfile.Profile(time.process_time) if profile else None
        for _ in range(1 if profile else 3):
            t0, w0 = time.process_time(), time.perf_counter()
            if prof:
                prof.enable()
            await asyncio.gather(*(worker(w) for w in range(conc)))
            if prof:
                prof.disable()
            cpu, wall = time.process_time() - t0, time.perf_counter() - w0
            figures.append(cpu * 1e3 / n)
            print(f"{n} requests: {cpu * 1e3 / n:.3f} ms of CPU, {wall * 1e3 / n:.3f} ms of wall time a request")
    if prof:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(60)
        print(out.getvalue())
    return figures


def main(argv: list[str]) -> None:
    n = int(next((a for a in argv if a.isdigit()), 2000))
    profile = "--profile" in argv
    db.start()
    settings = ServiceSettings.from_env().with_(sync_interval_s=0, pool_max=8, request_nice=0)
    name, _ = prepare(10)
    key = create_key("tools/resolve_cpu")
    try:
        bodies = _bodies(settings, name, key["key"])
        app = create_app(settings)
        if profile:  # the resolve inline: one thread holds the whole request
            import pm_vector.service.routers.resolve as route

            async def inline(f, *a, **k):
                return f(*a, **k)

            route.run_in_threadpool = inline
        figs = _run_async(_drive(app, name, key["key"], bodies, n, profile))
        print(f"CPU ms a request: min {min(figs):.3f}, median {sorted(figs)[len(figs) // 2]:.3f}")
    finally:
        revoke_key(key["id"])
        db.drop_collection(name, missing_ok=True)


if __name__ == "__main__":
    main(sys.argv[1:])
