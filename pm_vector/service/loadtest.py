"""Bounded load test of ``pm-vector serve`` (``pm-vector bench load``): loopback only, stops by itself.

For each collection size C (number of classes = query rows per request): prepare a collection
(C = 10: digits; any other C: a synthetic C-class collection of unit-norm Gaussian clusters),
embed it, build ``n_distinct`` real PrivateMail requests with the real client, then run
``concurrency`` concurrent clients (each its own HTTP connection, asyncio + httpx) that send
resolve requests until ``requests`` were sent or ``duration`` seconds passed, whichever comes
first. Requests are replayed from the pre-built set: the load test measures the service (auth,
parsing, alignment, one k-NN statement, request log), not the client's request building.

The service runs in its own process (``pm-vector serve`` on 127.0.0.1, free port) so that
the load generator does not share its interpreter; ``url``/``api_key`` point at a running one
instead (it must be on loopback).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from typing import Any, Callable
from urllib.parse import urlparse

import numpy as np

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def synthetic_split(n_classes: int, *, dim: int = 32, per_class_server: int = 40, per_class_anchor: int = 4,
                    per_class_dummy: int = 2, per_class_query: int = 1, seed: int = 0):
    """A :class:`~pm_vector.datasets.Split` of unit-norm Gaussian clusters, ``n_classes`` classes."""
    from ..datasets import Dataset, split_dataset

    rng = np.random.default_rng(seed)
    per = per_class_server + per_class_anchor + per_class_dummy + per_class_query
    centres = rng.standard_normal((n_classes, dim))
    X = np.repeat(centres, per, axis=0) + 0.35 * rng.standard_normal((n_classes * per, dim))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = np.repeat(np.arange(n_classes), per)
    ds = Dataset(f"synthetic{n_classes}", X.astype(np.float32), y)
    return split_dataset(ds, n_classes * per_class_server, n_classes * per_class_anchor,
                         n_classes * per_class_dummy, n_classes * per_class_query, seed=seed)


def _split_for(n_classes: int, seed: int):
    if n_classes == 10:
        from ..datasets import load_dataset, split_dataset

        return split_dataset(load_dataset("digits"), 1000, 300, 150, 20, seed=seed)
    return synthetic_split(n_classes, seed=seed)


def prepare(n_classes: int, *, seed: int = 0, n_components: int = 8) -> tuple[str, Any]:
    """Create and embed a collection with ``n_classes`` classes; returns ``(name, split)``."""
    from .. import db
    from ..db.jobs import anchor_frame_embed_fn
    from .demo import prepare_collection

    split = _split_for(n_classes, seed)
    name = f"load_c{n_classes}_{uuid.uuid4().hex[:6]}"
    prepare_collection(name, split)
    db.run_embedding_job(name, {"n_components": n_components}, seed, embed_fn=anchor_frame_embed_fn)
    return name, split


async def _drive(url: str, api_key: str, name: str, bodies: list[bytes], concurrency: int, requests: int,
                 duration: float) -> dict[str, Any]:
    import httpx

    lat: list[float] = []
    errors: dict[str, int] = {}
    sent = 0
    deadline = time.perf_counter() + duration
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}

    async def worker(wid: int) -> None:
        nonlocal sent
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120.0) as client:
            i = wid
            while True:
                if sent >= requests or time.perf_counter() >= deadline:
                    return
                sent += 1
                body = bodies[i % len(bodies)]
                i += concurrency
                t = time.perf_counter()
                try:
                    r = await client.post(f"/collections/{name}/resolve", content=body)
                    dt = (time.perf_counter() - t) * 1000
                    if r.status_code == 200:
                        lat.append(dt)
                    else:
                        errors[str(r.status_code)] = errors.get(str(r.status_code), 0) + 1
                except httpx.HTTPError as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - t0
    a = np.asarray(lat) if lat else np.asarray([np.nan])
    return {"requests": sent, "ok": len(lat), "errors": sum(errors.values()), "error_kinds": errors,
            "seconds": wall, "throughput_rps": len(lat) / wall if wall > 0 else 0.0,
            "p50_ms": float(np.nanpercentile(a, 50)), "p95_ms": float(np.nanpercentile(a, 95)),
            "max_ms": float(np.nanmax(a))}


class _Subprocess:
    """``pm-vector serve`` in a child process on a free loopback port."""

    def __init__(self, pool_max: int):
        from .runner import free_port

        self.port = free_port()
        code = "import typer; from pm_vector.cli.service import serve; typer.run(serve)"  # == `pm-vector serve`
        cmd = [sys.executable, "-c", code, "--host", "127.0.0.1",
               "--port", str(self.port), "--pool-max", str(pool_max), "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, env=dict(os.environ))
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 60.0) -> None:
        import httpx

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`pm-vector serve` exited with status {self.proc.returncode} during start-up.")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("`pm-vector serve` did not answer /health in time.")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def run_load(classes=(10, 100), *, concurrency: int = 32, requests: int = 500, duration: float = 30.0,
             n_distinct: int = 16, epsilon: float = 1.0, url: str | None = None, api_key: str | None = None,
             pool_max: int = 8, seed: int = 0, keep: bool = False, log: Callable[[str], None] | None = None
             ) -> dict[str, Any]:
    """Run the load test for every C in ``classes``; returns ``{"results": [...], "config": {...}}``."""
    from .. import db
    from ..client.http import Client
    from .auth import create_key, revoke_key

    say = log or (lambda s: None)
    if int(requests) < 1 or float(duration) <= 0 or int(concurrency) < 1 or int(n_distinct) < 1:
        raise ValueError("requests, duration, concurrency and n_distinct must be positive.")
    if url is not None and (urlparse(url).hostname or "") not in LOOPBACK:
        raise ValueError(f"the load test only targets loopback services (127.0.0.1/localhost), not {url!r}.")
    db.start()
    key = None
    svc = None
    names: list[str] = []
    results = []
    try:
        if url is None:
            key = create_key("pm-vector bench load")
            api_key = key["key"]
            svc = _Subprocess(pool_max)
            url = svc.url
        prepared = []
        for C in classes:
            t = time.perf_counter()
            name, split = prepare(int(C), seed=seed)
            names.append(name)
            say(f"C={C}: collection {name} ready ({split.server_idx.size} items, {split.anchor_idx.size} anchors) "
                f"in {time.perf_counter() - t:.1f} s")
            prepared.append((int(C), name, split))
        if svc is not None:
            svc.wait_ready()
        say(f"service on {url}")
        with Client(url, api_key) as client:
            for C, name, split in prepared:
                t = time.perf_counter()
                Xq, yq = split.query
                bodies = []
                for i in range(int(n_distinct)):
                    req, _ = client.build_request(name, Xq[i % len(yq)], int(yq[i % len(yq)]), epsilon=epsilon,
                                                  _rng=seed + i)
                    import json

                    bodies.append(json.dumps({"request": req.to_dict(), "k": 8}).encode())
                build_s = time.perf_counter() - t
                before = len(db.list_requests(name, limit=100000))
                say(f"C={C}: {n_distinct} requests built in {build_s:.1f} s ({len(bodies[0]) / 1024:.0f} KiB each); "
                    f"{concurrency} clients, at most {requests} requests / {duration:g} s")
                r = asyncio.run(_drive(url, api_key, name, bodies, int(concurrency), int(requests), float(duration)))
                logged = len(db.list_requests(name, limit=100000)) - before
                r.update({"classes": C, "collection": name, "rows_per_request": C + int(split.anchor_idx.size),
                          "concurrency": int(concurrency), "body_kib": len(bodies[0]) / 1024, "logged": logged})
                say(f"C={C}: {r['ok']} ok, {r['errors']} errors, {r['throughput_rps']:.1f} req/s, p50 "
                    f"{r['p50_ms']:.1f} ms, p95 {r['p95_ms']:.1f} ms")
                results.append(r)
    finally:
        if svc is not None:
            svc.stop()
        if key is not None:
            revoke_key(key["id"])
        if not keep:
            for n in names:
                db.drop_collection(n, missing_ok=True)
    return {"config": {"concurrency": int(concurrency), "requests": int(requests), "duration_s": float(duration),
                       "n_distinct": int(n_distinct), "epsilon": float(epsilon), "pool_max": int(pool_max),
                       "cpus": os.cpu_count()}, "results": results}
