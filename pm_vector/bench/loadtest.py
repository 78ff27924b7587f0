"""Bounded load test of ``pm-vector serve`` (``pm-vector bench load``): loopback only, stops by itself.

For each collection size C (number of classes = query rows per request): prepare a collection
(C = 10: digits; any other C: a synthetic C-class collection of unit-norm Gaussian clusters),
embed it, build ``n_distinct`` real PrivateMail requests with the real client, then run
``concurrency`` concurrent clients (each its own HTTP connection, asyncio + aiohttp) that send
resolve requests until ``requests`` were sent or ``duration`` seconds passed, whichever comes
first. Requests are replayed from the pre-built set: the load test measures the service (auth,
parsing, alignment, one k-NN statement, request log), not the client's request building.

The service runs in its own process (``pm-vector serve`` on 127.0.0.1, free port) so that
the load generator does not share its interpreter; ``url``/``api_key`` point at a running one
instead (it must be on loopback). ``workers`` > 1 starts that many service processes, each on its
own port, and spreads the clients over them round robin (what a balancer in front of several
``pm-vector serve`` would do).

CPU is reported apart for the three parties on the machine (user + system seconds over the drive,
from psutil / ``/proc``): the service processes with their children, the sync process
(``server_cpu_ms_per_request``), the database's backends (``db_cpu_ms_per_request``: the children
of the PostgreSQL server pm_vector runs on, when it is the embedded one) and the load generator
itself (``generator_cpu_ms_per_request``), with each one's share of the wall time (1.0 = one core
busy). With ``changes_rate``, an attached table changed during the load and the service's sync lag
(:mod:`pm_vector.bench.load_changes`).
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

import aiohttp
import httpx
import numpy as np
import psutil

from ..protocol.codec import MSGPACK, encode
from .. import db
from ..client.budget import MemoryBudget
from ..client.http import Client
from ..datasets import Dataset, load_dataset, split_dataset
from ..db.runs.jobs import anchor_frame_embed_fn
from ..service.auth import create_key, revoke_key
from ..service.runner import free_port
from .demo import prepare_collection
from .load_changes import ChangeStream

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
    uvloop = None

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def synthetic_split(n_classes: int, *, dim: int = 32, per_class_server: int = 40, per_class_anchor: int = 4,
                    per_class_dummy: int = 2, per_class_query: int = 1, seed: int = 0):
    """A :class:`~pm_vector.datasets.Split` of unit-norm Gaussian clusters, ``n_classes`` classes."""
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
        return split_dataset(load_dataset("digits"), 1000, 300, 150, 20, seed=seed)
    return synthetic_split(n_classes, seed=seed)


def prepare(n_classes: int, *, seed: int = 0, n_components: int = 8) -> tuple[str, Any]:
    """Create and embed a collection with ``n_classes`` classes; returns ``(name, split)``."""
    split = _split_for(n_classes, seed)
    name = f"load_c{n_classes}_{uuid.uuid4().hex[:6]}"
    prepare_collection(name, split)
    db.run_embedding_job(name, {"n_components": n_components}, seed, embed_fn=anchor_frame_embed_fn)
    return name, split


class _CPU:
    """User + system CPU seconds of a set of processes between :meth:`start` and :meth:`stop`
    (processes that end in between count up to their last sample; new children of a parent are
    picked up at stop; ``children_of``: one parent's PID or several)."""

    def __init__(self, pids=(), children_of: int | list[int] | None = None):
        self.pids = [int(p) for p in pids]
        self.children_of = children_of

    def _sample(self) -> dict[int, float] | None:
        procs = []
        for pid in self.pids:
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                pass
        parents = () if self.children_of is None else \
            (self.children_of,) if isinstance(self.children_of, int) else self.children_of
        for parent in parents:
            try:
                procs += psutil.Process(parent).children(recursive=True)
            except psutil.Error:
                pass
        out = {}
        for pr in procs:
            try:
                t = pr.cpu_times()
                out[pr.pid] = float(t.user + t.system)
            except psutil.Error:
                pass
        return out

    def start(self) -> None:
        self._t0 = self._sample()

    def stop(self) -> float | None:
        t1 = self._sample()
        if t1 is None or self._t0 is None:
            return None
        return sum(v - self._t0.get(pid, 0.0) for pid, v in t1.items())


def _db_postmaster() -> int | None:
    """PID of the embedded PostgreSQL server (its backends do the database's share of the work)."""
    try:
        st = db.status()
    except Exception:  # noqa: BLE001 - an external database: its CPU is not ours to read
        return None
    return int(st["pid"]) if st.get("mode") == "embedded" and st.get("pid") else None


async def _drive(urls: list[str] | str, api_key: str, name: str, bodies: list[bytes], concurrency: int, requests: int,
                 duration: float) -> dict[str, Any]:
    """``concurrency`` clients, each on its own keep-alive connection (aiohttp: its C HTTP parser
    costs the generator ~4x less CPU per request than httpx, and the generator shares the machine
    with the service it measures)."""
    lat: list[float] = []
    errors: dict[str, int] = {}
    answer_bytes: list[int] = []
    sent = 0
    deadline = time.perf_counter() + duration
    # the default client's wire: msgpack both ways
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": MSGPACK, "Accept": MSGPACK}

    urls = [urls] if isinstance(urls, str) else list(urls)

    async def worker(wid: int) -> None:
        nonlocal sent
        conn = aiohttp.TCPConnector(limit=1, force_close=False)
        async with aiohttp.ClientSession(base_url=urls[wid % len(urls)], headers=headers, connector=conn,
                                         timeout=aiohttp.ClientTimeout(total=120.0)) as client:
            i = wid
            while True:
                if sent >= requests or time.perf_counter() >= deadline:
                    return
                sent += 1
                body = bodies[i % len(bodies)]
                i += concurrency
                t = time.perf_counter()
                try:
                    async with client.post(f"/collections/{name}/resolve", data=body) as r:
                        got = await r.read()
                        dt = (time.perf_counter() - t) * 1000
                        if r.status == 200:
                            lat.append(dt)
                            answer_bytes.append(len(got))
                        else:
                            errors[str(r.status)] = errors.get(str(r.status), 0) + 1
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - t0
    a = np.asarray(lat) if lat else np.asarray([np.nan])
    return {"requests": sent, "ok": len(lat), "errors": sum(errors.values()), "error_kinds": errors,
            "seconds": wall, "throughput_rps": len(lat) / wall if wall > 0 else 0.0,
            "p50_ms": float(np.nanpercentile(a, 50)), "p95_ms": float(np.nanpercentile(a, 95)),
            "max_ms": float(np.nanmax(a)),
            "answer_kib": float(np.median(answer_bytes)) / 1024 if answer_bytes else float("nan")}


def _run_async(coro):
    """``asyncio.run`` on uvloop when installed (the service's own loop: less generator CPU)."""
    if uvloop is None:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.run(coro)
    return uvloop.run(coro)


class _Subprocess:
    """``pm-vector serve`` in a child process on a free loopback port."""

    def __init__(self, pool_max: int):
        self.port = free_port()
        code = "import typer; from pm_vector.cli.service import serve; typer.run(serve)"  # == `pm-vector serve`
        cmd = [sys.executable, "-c", code, "--host", "127.0.0.1",
               "--port", str(self.port), "--pool-max", str(pool_max), "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, env=dict(os.environ))
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 60.0) -> None:
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


def _check_load_args(concurrency, requests, duration, n_distinct, url, workers) -> None:
    """Refuse a load test that cannot run, or that targets a service off this machine."""
    if int(requests) < 1 or float(duration) <= 0 or int(concurrency) < 1 or int(n_distinct) < 1:
        raise ValueError("requests, duration, concurrency and n_distinct must be positive.")
    if isinstance(workers, bool) or int(workers) < 1 or int(workers) > 16:
        raise ValueError(f"workers must be an integer in 1..16, got {workers!r}.")
    if url is not None and (urlparse(url).hostname or "") not in LOOPBACK:
        raise ValueError(f"the load test only targets loopback services (127.0.0.1/localhost), not {url!r}.")


def _drive_metered(urls: list, api_key, name: str, bodies: list, concurrency: int, requests: int, duration: float,
                   svcs: list, postmaster) -> dict[str, Any]:
    """One collection's load, with the CPU time of the service processes, the database's backends and
    this generator metered around it; returns the drive's figures with the CPU report."""
    # the service processes and theirs (the sync process of the one that syncs)
    server_cpu = _CPU([s_.proc.pid for s_ in svcs], children_of=[s_.proc.pid for s_ in svcs])
    db_cpu = _CPU(children_of=postmaster) if postmaster else None
    gen_cpu = _CPU([os.getpid()])
    for c_ in (server_cpu, db_cpu, gen_cpu):
        if c_ is not None:
            c_.start()
    r = _run_async(_drive(urls, api_key, name, bodies, concurrency, requests, duration))
    r.update(_cpu_report(r, server_cpu.stop() if svcs else None, db_cpu.stop() if db_cpu else None,
                         gen_cpu.stop()))
    return r


def run_load(classes=(10, 100), *, concurrency: int = 32, requests: int = 500, duration: float = 30.0,
             n_distinct: int = 16, epsilon: float = 1.0, url: str | None = None, api_key: str | None = None,
             pool_max: int = 8, seed: int = 0, keep: bool = False, log: Callable[[str], None] | None = None,
             workers: int = 1, changes_rate: float = 0.0, attached_items: int = 20_000,
             attached_dim: int = 128) -> dict[str, Any]:
    """Run the load test for every C in ``classes``; returns ``{"results": [...], "config": {...}}``.
    ``workers``: service processes to start (ignored with ``url``). ``changes_rate`` > 0: an attached
    table of ``attached_items`` rows of ``vector(attached_dim)`` receives that many changes a second
    during each C's load, and each result's ``sync`` gives the service's sync lag
    (:class:`pm_vector.bench.load_changes.ChangeStream`)."""
    say = log or (lambda s: None)
    _check_load_args(concurrency, requests, duration, n_distinct, url, workers)
    db.start()
    stream = None
    if changes_rate:
        stream = ChangeStream(attached_items, attached_dim, changes_rate, seed=seed, say=say)
    key = None
    svcs: list[_Subprocess] = []
    names: list[str] = []
    results = []
    try:
        if url is None:
            key = create_key("pm-vector bench load")
            api_key = key["key"]
            svcs = [_Subprocess(pool_max) for _ in range(int(workers))]
        urls = [s.url for s in svcs] or [url]
        prepared = []
        for C in classes:
            t = time.perf_counter()
            name, split = prepare(int(C), seed=seed)
            names.append(name)
            say(f"C={C}: collection {name} ready ({split.server_idx.size} items, {split.anchor_idx.size} anchors) "
                f"in {time.perf_counter() - t:.1f} s")
            prepared.append((int(C), name, split))
        if stream is not None:
            stream.prepare()
        for s_ in svcs:
            s_.wait_ready()
        say(f"service on {', '.join(urls)}")
        if stream is not None:
            say(f"the service's sync applied a first change of {stream.name} in {stream.warm():.1f} s")
        postmaster = _db_postmaster()
        # the built requests are real (unseeded) releases -- a service refuses seeded ones by default --
        # charged to an in-memory ledger given exactly what they spend (replaying one costs nothing more)
        n_built = int(n_distinct) * len(prepared)
        ledger = MemoryBudget(default_epsilon=n_built * float(epsilon) * (1 + 1e-9),
                              default_delta=min(0.999, n_built * 1e-5 * (1 + 1e-9)))
        with Client(urls[0], api_key, budget=ledger) as client:
            for C, name, split in prepared:
                t = time.perf_counter()
                Xq, yq = split.query
                bodies = []
                for i in range(int(n_distinct)):
                    # the default request (release "auto", as Client.query) on the default wire (msgpack)
                    req, _ = client.build_request(name, Xq[i % len(yq)], int(yq[i % len(yq)]), epsilon=epsilon)
                    bodies.append(encode({"request": req.to_dict(), "k": 8}, MSGPACK))
                build_s = time.perf_counter() - t
                before = len(db.list_requests(name, limit=100000))
                say(f"C={C}: {n_distinct} requests built in {build_s:.1f} s ({len(bodies[0]) / 1024:.0f} KiB each); "
                    f"{concurrency} clients, at most {requests} requests / {duration:g} s")
                if stream is not None:
                    stream.start()
                r = _drive_metered(urls, api_key, name, bodies, int(concurrency), int(requests), float(duration),
                                   svcs, postmaster)
                if stream is not None:
                    stream.stop()
                    stream.drain()
                    r["sync"] = stream.report()
                    say(f"C={C}: {r['sync']['changes']} changes to {stream.name} at {changes_rate:g}/s: lag_s p50 "
                        f"{r['sync']['lag_s']['p50']}, p99 {r['sync']['lag_s']['p99']}; commit to sync p50 "
                        f"{r['sync']['delay_s']['p50']} s, p99 {r['sync']['delay_s']['p99']} s")
                logged = len(db.list_requests(name, limit=100000)) - before
                r.update({"classes": C, "collection": name, "release": req.release,
                          "rows_per_request": getattr(req, "n_rows", C),
                          "concurrency": int(concurrency), "body_kib": len(bodies[0]) / 1024, "logged": logged})
                say(f"C={C}: {r['ok']} ok, {r['errors']} errors, {r['throughput_rps']:.1f} req/s, p50 "
                    f"{r['p50_ms']:.1f} ms, p95 {r['p95_ms']:.1f} ms; CPU ms/request: server "
                    f"{r['server_cpu_ms_per_request']}, database {r['db_cpu_ms_per_request']}, generator "
                    f"{r['generator_cpu_ms_per_request']}")
                results.append(r)
    finally:
        if stream is not None:
            stream.close()
        for s_ in svcs:
            s_.stop()
        if key is not None:
            revoke_key(key["id"])
        if not keep:
            for n in names:
                db.drop_collection(n, missing_ok=True)
    return {"config": {"concurrency": int(concurrency), "requests": int(requests), "duration_s": float(duration),
                       "n_distinct": int(n_distinct), "epsilon": float(epsilon), "pool_max": int(pool_max),
                       "workers": len(svcs) or None, "cpus": os.cpu_count(), "changes_rate": float(changes_rate),
                       "attached_items": int(attached_items) if changes_rate else None}, "results": results}


def _cpu_report(r: dict[str, Any], server_s: float | None, db_s: float | None, gen_s: float | None
                ) -> dict[str, Any]:
    """CPU ms per answered request and share of the wall time (1.0 = one core) of each party."""
    ok, wall = max(int(r["ok"]), 1), max(float(r["seconds"]), 1e-9)
    out: dict[str, Any] = {}
    for key, v in (("server", server_s), ("db", db_s), ("generator", gen_s)):
        out[f"{key}_cpu_ms_per_request"] = None if v is None else round(v * 1e3 / ok, 3)
        out[f"{key}_cpu_share"] = None if v is None else round(v / wall, 3)
    return out
