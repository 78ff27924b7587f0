"""``pm-vector bench outage``: the service while its database is SIGKILLed and restarted.

In a private ``PM_VECTOR_HOME`` the benchmark starts an embedded server, a small digits
collection, an API key and the real service (uvicorn on loopback, in this process). A client
thread sends one resolve after another (``interval`` seconds apart, each with its own timeout),
and every ``health_every``-th request is a ``GET /health``. Then the PostgreSQL server and its
backends are SIGKILLed, left dead for ``seconds``, and started again; a poller connects to the
database every 20 ms to note when it accepts connections again. Reported:

* the 503 answers during the outage (count, median, 90th percentile and max latency, of resolve and /health), and
  any other status (a 500 or a transport error would be a bug);
* seconds from "the database accepts connections" to the first 200 of resolve, and whether every
  answer after that first 200 was a 200.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .. import db
from ..client.http import Client
from ..datasets import load_dataset, split_dataset
from ..db import postgres
from ..db.postgres import status
from ..db.postgres.config import pgdata_dir
from ..db.runs.jobs import anchor_frame_embed_fn
from ..service.auth import create_key
from ..service.runner import ServiceThread
from ..service.settings import ServiceSettings
from ._home import private_home
from .demo import prepare_collection

import httpx
import psycopg


@dataclass
class OutageConfig:
    #: seconds the database stays dead
    seconds: float = 30.0
    #: pause between the client's requests
    interval: float = 0.05
    #: every this many requests one is GET /health
    health_every: int = 5
    #: seconds the client keeps sending after the first 200 (all must be 200)
    settle: float = 5.0
    #: each request's client-side timeout
    request_timeout: float = 30.0

    def __post_init__(self):
        if not (0 < self.seconds <= 3600 and 0 < self.interval <= 10 and self.health_every >= 1
                and 0 <= self.settle <= 600 and 0 < self.request_timeout <= 600):
            raise ValueError("outage bench: seconds in (0, 3600], interval in (0, 10], health_every >= 1, "
                             "settle in [0, 600], request_timeout in (0, 600].")


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


def kill_postmaster(pgdata: Path, wait: float = 10.0) -> int:
    """SIGKILL the postmaster of ``pgdata`` and its backends (Linux /proc), as a crash would end
    them; return the postmaster's pid once it and its children are gone."""
    pid = int((Path(pgdata) / "postmaster.pid").read_text().splitlines()[0])
    for p in [pid] + _children(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and (Path(f"/proc/{pid}").exists() or _children(pid)):
        time.sleep(0.02)
    return pid


def kill_embedded_server(wait: float = 10.0) -> int:
    """:func:`kill_postmaster` of the embedded server of ``PM_VECTOR_HOME``."""
    if not status()["pid"]:
        raise RuntimeError("the embedded server is not running")
    return kill_postmaster(pgdata_dir(), wait)


class Prober:
    """A client thread that sends the resolve ``body`` (and every ``health_every``-th request a
    GET /health) until stopped, recording ``(sent, answered, kind, status)`` per request
    (monotonic seconds; status None for a transport error)."""

    def __init__(self, base: str, collection: str, key: str, body: str, *, interval: float = 0.05,
                 health_every: int = 5, timeout: float = 30.0):
        self.client = httpx.Client(timeout=timeout)
        self.url = f"{base}/collections/{collection}/resolve"
        self.health_url = f"{base}/health"
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self.body, self.interval, self.health_every = body, interval, health_every
        self.records: list[tuple[float, float, str, int | None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outage-prober", daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            kind = "health" if i % self.health_every == 0 else "resolve"
            t0 = time.monotonic()
            try:
                if kind == "health":
                    r = self.client.get(self.health_url)
                else:
                    r = self.client.post(self.url, content=self.body, headers=self.headers)
                status: int | None = r.status_code
            except Exception:  # noqa: BLE001 - a transport error is recorded as status None
                status = None
            with self._lock:
                self.records.append((t0, time.monotonic(), kind, status))
            self._stop.wait(self.interval)

    def start(self) -> "Prober":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.client.close()

    def snapshot(self) -> list[tuple[float, float, str, int | None]]:
        with self._lock:
            return list(self.records)


def wait_accepting(url: str, stop: threading.Event, every: float = 0.02) -> float | None:
    """Connect to ``url`` every ``every`` seconds until a connection succeeds; return that
    moment (monotonic), or None if ``stop`` was set first."""
    while not stop.is_set():
        t = time.monotonic()
        try:
            with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return t
        except Exception:  # noqa: BLE001 - refused or starting up: try again
            stop.wait(every)
    return None


def _ms(v: list[float]) -> dict[str, Any]:
    p90 = sorted(v)[min(len(v) - 1, int(0.9 * len(v)))] if v else None
    return {"n": len(v), "median_ms": round(statistics.median(v) * 1e3, 1) if v else None,
            "p90_ms": round(p90 * 1e3, 1) if v else None, "max_ms": round(max(v) * 1e3, 1) if v else None}


def summarize(records: list[tuple[float, float, str, int | None]], t_kill: float, t_accept: float) -> dict[str, Any]:
    """The outage's figures from a :class:`Prober`'s records (see the module doc)."""
    during = [r for r in records if t_kill <= r[0] and r[1] <= t_accept]
    lat = {kind: _ms([r[1] - r[0] for r in during if r[2] == kind and r[3] == 503]) for kind in ("resolve", "health")}
    other = sorted({str(r[3]) for r in during if r[3] != 503})
    first = next((r for r in records if r[2] == "resolve" and r[3] == 200 and r[1] >= t_accept), None)
    after = [r for r in records if first is not None and r[0] >= first[0]]
    return {"outage_503": lat, "outage_other_statuses": other,
            "first_200_after_accept_s": None if first is None else round(first[1] - t_accept, 3),
            "after_first_200": {"requests": len(after), "non_200": sum(1 for r in after if r[3] != 200)}}


def run(cfg: OutageConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    say = progress or (lambda s: None)
    with private_home("pm_bench_outage_", stop=postgres.stop):
        say("starting a private embedded server and a digits collection")
        postgres.start()
        split = split_dataset(load_dataset("digits"), 800, 300, 150, 40, seed=0)
        prepare_collection("outage", split, allow_raw_features=True)
        db.run_embedding_job("outage", {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
        key = create_key("outage bench")["key"]
        with ServiceThread(ServiceSettings(pool_max=4, request_log_retention_days=0)) as svc:
            Xq, yq = split.query
            with Client(svc.url, key) as c:
                req = c.build_request("outage", Xq[0], int(yq[0]), epsilon=1.0, shortlist=16)[0]
            body = json.dumps({"request": req.to_dict(), "k": 8})
            url = svc.app.state.service_state.pool.url
            prober = Prober(svc.url, "outage", key, body, interval=cfg.interval, health_every=cfg.health_every,
                            timeout=cfg.request_timeout).start()
            try:
                time.sleep(2.0)
                before = prober.snapshot()
                # the fast test server: write out what is committed (CHECKPOINT: the superuser's, not pm_vector's)
                with db.connect(postgres.admin_url(), autocommit=True) as conn:
                    conn.execute("CHECKPOINT")
                postgres.dispose_engines()
                say(f"SIGKILL of PostgreSQL; restarting it in {cfg.seconds:g} s")
                kill_embedded_server()
                t_kill = time.monotonic()  # the server and its backends are gone
                time.sleep(max(0.0, t_kill + cfg.seconds - time.monotonic()))
                stop = threading.Event()
                accepted: list[float | None] = []
                poller = threading.Thread(target=lambda: accepted.append(wait_accepting(url, stop)), daemon=True)
                poller.start()
                t_restart = time.monotonic()
                postgres.start()
                t_started = time.monotonic()
                poller.join(timeout=60)
                stop.set()
                t_accept = accepted[0] if accepted and accepted[0] is not None else t_started
                say("database back; waiting for the first 200")
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    s = summarize(prober.snapshot(), t_kill, t_accept)
                    if s["first_200_after_accept_s"] is not None:
                        break
                    time.sleep(0.1)
                time.sleep(cfg.settle)
            finally:
                prober.stop()
            records = prober.snapshot()
        base = [r[1] - r[0] for r in before if r[2] == "resolve" and r[3] == 200]
        out = {"config": asdict(cfg), "outage_s": round(t_accept - t_kill, 2),
               "restart_s": round(t_started - t_restart, 2), "before_200": _ms(base),
               **summarize(records, t_kill, t_accept)}
        return out
