"""``pm-vector bench memory``: the service's resident memory under rounds of large
``/kahm/distances`` calls.

In a private ``PM_VECTOR_HOME`` the benchmark makes a synthetic collection (``dim`` features, 10
classes) with a raw KAHM model whose distances it opts in to, starts ``pm-vector serve`` as a
separate process, and sends ``rounds`` rounds of ``parallel`` simultaneous calls, each with a
body of about ``mb`` megabytes (the rows that fit). After every round it reads the service's
resident set size (``VmRSS`` of /proc/PID/status); after the last one it waits ``idle_s`` seconds
and reads it again. Reported: the RSS series, its maximum, the growth from round 1 to the last
round, and the statuses of the calls (all must be 200).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable

import httpx
import numpy as np

from .. import db
from ..db import postgres
from ..db.kahm.roles import fit_kahm_models
from ..service.auth import create_key
from ..service.runner import free_port
from ._home import private_home


@dataclass
class MemoryConfig:
    rounds: int = 100
    parallel: int = 6
    #: approximate size of each request body (MB)
    mb: float = 13.0
    dim: int = 256
    #: items of the collection (its KAHM model's training rows: the distances' cost grows with them)
    items: int = 2000
    idle_s: float = 5.0
    seed: int = 0

    def __post_init__(self):
        if not (1 <= self.rounds <= 10_000 and 1 <= self.parallel <= 64 and 0.01 <= self.mb <= 15.5
                and 2 <= self.dim <= 256 and 0 <= self.idle_s <= 600 and 100 <= self.items <= 100_000):
            raise ValueError("memory bench: rounds in 1..10000, parallel in 1..64, mb in [0.01, 15.5], dim in "
                             "2..256, idle_s in [0, 600], items in 100..100000.")


def rss_mb(pid: int) -> float:
    """Resident set size of process ``pid`` in MB (Linux /proc)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for pid {pid}")


def body_of(cfg: MemoryConfig) -> tuple[bytes, int]:
    """A ``/kahm/distances`` body of about ``cfg.mb`` MB: rows of ``cfg.dim`` 4-decimal floats."""
    rng = np.random.default_rng(cfg.seed + 1)
    row = json.dumps([round(float(v), 4) for v in rng.normal(size=cfg.dim)])
    n = max(1, int(cfg.mb * 1e6 // (len(row) + 2)))
    X = np.round(rng.normal(size=(n, cfg.dim)), 4)
    return json.dumps({"features": X.tolist()}).encode(), n


def _wait_up(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited ({proc.returncode}) during start-up")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the service did not start")


def run(cfg: MemoryConfig, progress: Callable[[str], None] | None = None,
        env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the benchmark (module doc); ``env``: extra environment of the service process."""
    say = progress or (lambda s: None)
    proc = None
    with private_home("pm_bench_memory_", stop=postgres.stop):
        try:
            say("starting a private embedded server and a collection with a KAHM model")
            postgres.start()
            rng = np.random.default_rng(cfg.seed)
            per = cfg.items // 10
            X = rng.normal(size=(10 * per, cfg.dim)) + np.repeat(np.eye(10, cfg.dim) * 4, per, axis=0)
            y = np.repeat(np.arange(10), per)
            db.create_collection("memory", cfg.dim, list(range(10)), settings={"kahm": {"raw_distances": True}})
            db.ingest("memory", X, y)
            fit_kahm_models("memory", n_components=8)
            key = create_key("memory bench")["key"]
            port = free_port()
            senv = {**os.environ, **(env or {}), "PM_VECTOR_SERVICE_MAX_ROWS": "100000",
                    "PM_VECTOR_SERVICE_REQUEST_LOG_RETENTION_DAYS": "0"}
            proc = subprocess.Popen([sys.executable, "-c", "from pm_vector.cli import main; main()", "serve", "--port",
                                     str(port), "--log-level", "warning"], env=senv, stdin=subprocess.DEVNULL)
            url = f"http://127.0.0.1:{port}"
            _wait_up(url, proc)
            body, n_rows = body_of(cfg)
            say(f"{cfg.rounds} rounds of {cfg.parallel} parallel calls of {len(body) / 1e6:.1f} MB ({n_rows} rows)")
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            statuses: dict[str, int] = {}
            series = []
            start_rss = rss_mb(proc.pid)
            t0 = time.monotonic()
            with httpx.Client(timeout=600, limits=httpx.Limits(max_connections=cfg.parallel)) as client, \
                    ThreadPoolExecutor(cfg.parallel) as ex:
                def call(_):
                    return client.post(f"{url}/collections/memory/kahm/distances", content=body, headers=headers)

                for r in range(cfg.rounds):
                    for resp in ex.map(call, range(cfg.parallel)):
                        statuses[str(resp.status_code)] = statuses.get(str(resp.status_code), 0) + 1
                    series.append(round(rss_mb(proc.pid), 1))
                    if (r + 1) % 10 == 0:
                        say(f"round {r + 1}: RSS {series[-1]:.0f} MB")
            seconds = time.monotonic() - t0
            time.sleep(cfg.idle_s)
            idle = round(rss_mb(proc.pid), 1)
            return {"config": asdict(cfg), "body_mb": round(len(body) / 1e6, 2), "rows": n_rows,
                    "service_env": {k: v for k, v in (env or {}).items()}, "rss_start_mb": round(start_rss, 1),
                    "rss_mb": series, "rss_max_mb": max(series), "rss_growth_mb": round(series[-1] - series[0], 1),
                    "rss_after_idle_mb": idle, "statuses": statuses, "seconds": round(seconds, 1)}
        finally:
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
