"""`pm-vector bench scale`: the server's embedding job against the number of items.

For every size n the benchmark creates a temporary collection of n synthetic items
(unit-norm Gaussian clusters, ``dim`` dimensions, ``classes`` labels; see
:func:`pm_vector.bench.latency.clustered`) with ``anchors`` public anchors, runs
:func:`pm_vector.db.run_embedding_job` with the AnchorFrame embedding (fit on the anchors,
out-of-sample extension of the items: each item sees its ``n_neighbors`` nearest anchors,
so no ``n x n`` matrix exists), and records:

* ``seconds``: wall time of the whole job (load by binary COPY, embed, write by binary COPY,
  HNSW index build, switch), and the job's own stage timings;
* ``peak_mb``: the high-water mark of this process's resident memory during the job (Linux
  ``VmHWM`` reset before the job through ``/proc/self/clear_refs``, and a sampling thread as
  a cross-check / fallback), with ``baseline_mb`` (resident before the job) beside it;
* ``index_share``: the HNSW build's part of the job time.

``time_per_doubling = (t_max / t_min) ** (1 / log2(n_max / n_min))``: 2.0 is linear.
Collections are dropped at the end.
"""

from __future__ import annotations

import gc
import math
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from ..errors import InvalidInputError


@dataclass
class ScaleConfig:
    sizes: tuple = (10_000, 50_000, 200_000)
    anchors: int = 1000
    dim: int = 128
    classes: int = 10
    n_components: int = 16  # AnchorFrame's default
    repeats: int = 1
    seed: int = 0
    hnsw_m: int = 16
    hnsw_ef_construction: int = 64
    maintenance_work_mem: str = "512MB"


def _rss_mb() -> float | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        try:
            import psutil  # type: ignore[import-not-found]

            return psutil.Process().memory_info().rss / 2**20
        except Exception:  # noqa: BLE001
            return None


def _hwm_mb() -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


class PeakRSS:
    """``with PeakRSS() as p: ...`` then ``p.peak_mb``, ``p.baseline_mb``: the resident-memory
    high-water mark of this process during the block."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.samples_peak = 0.0
        self._stop = threading.Event()
        self.hwm_reset = False

    def _run(self):
        while not self._stop.wait(self.interval):
            v = _rss_mb()
            if v is not None and v > self.samples_peak:
                self.samples_peak = v

    def __enter__(self):
        gc.collect()
        self.baseline_mb = _rss_mb() or 0.0
        try:  # "5" resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self.samples_peak = self.baseline_mb
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        v = _rss_mb()
        if v is not None:
            self.samples_peak = max(self.samples_peak, v)
        hwm = _hwm_mb() if self.hwm_reset else None
        self.peak_mb = max(self.samples_peak, hwm or 0.0)
        self.method = "VmHWM" if hwm is not None and hwm >= self.samples_peak else "sampling"
        return False


def time_per_doubling(sizes, seconds) -> float:
    """``(t_max / t_min) ** (1 / log2(n_max / n_min))`` of the smallest and largest size."""
    i, j = int(np.argmin(sizes)), int(np.argmax(sizes))
    if sizes[j] == sizes[i]:
        raise InvalidInputError("time per doubling needs at least two different sizes.")
    return float((seconds[j] / seconds[i]) ** (1.0 / math.log2(sizes[j] / sizes[i])))


def run(cfg: ScaleConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    import pm_vector.db as db

    from ..db.jobs import anchor_frame_embed_fn
    from ..manifold import AnchorFrame  # noqa: F401  torch is loaded before any memory is measured
    from .latency import N_FINE, clustered

    say = progress or (lambda _m: None)
    sizes = sorted(int(n) for n in cfg.sizes)
    if len(sizes) < 2 or sizes[0] < 1 or len(set(sizes)) != len(sizes):
        raise InvalidInputError("--sizes needs at least two different positive sizes, e.g. 10000,50000,200000.")
    if cfg.repeats < 1 or cfg.anchors < 2 or N_FINE % cfg.classes:
        raise InvalidInputError(f"repeats >= 1, anchors >= 2, and classes must divide {N_FINE}.")
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    tag = uuid.uuid4().hex[:10]
    results = []
    Xa, ya = clustered(cfg.anchors, cfg.dim, N_FINE, seed=cfg.seed + 1)
    ya = ya // (N_FINE // cfg.classes)
    for n in sizes:
        name = f"bench_scale_{tag}_{n}"
        runs = []
        try:
            say(f"{n:,} items: ingest")
            db.create_collection(name, cfg.dim, list(range(cfg.classes)), hnsw_m=cfg.hnsw_m,
                                 hnsw_ef_construction=cfg.hnsw_ef_construction, keep_previous_runs=0)
            X, y = clustered(n, cfg.dim, N_FINE, seed=cfg.seed + 2)
            db.ingest(name, X, y // (N_FINE // cfg.classes), batch_size=50_000)
            del X, y
            db.register_anchor_set(name, Xa, ya)
            for r in range(cfg.repeats):
                say(f"{n:,} items: job {r + 1}/{cfg.repeats}")
                with PeakRSS() as mem:
                    t = time.perf_counter()
                    info = db.run_embedding_job(name, {"n_components": cfg.n_components}, cfg.seed,
                                                embed_fn=anchor_frame_embed_fn,
                                                maintenance_work_mem=cfg.maintenance_work_mem)
                    secs = time.perf_counter() - t
                tm = info.get("timings") or {}
                runs.append({"seconds": secs, "peak_mb": mem.peak_mb, "baseline_mb": mem.baseline_mb,
                             "timings": tm, "memory_method": mem.method})
        finally:
            db.drop_collection(name, missing_ok=True)
        med = sorted(runs, key=lambda x: x["seconds"])[len(runs) // 2]
        tm = med["timings"]
        results.append({"items": n, "seconds": round(med["seconds"], 3), "peak_mb": round(max(x["peak_mb"] for x in runs), 1),
                        "baseline_mb": round(med["baseline_mb"], 1),
                        "job_delta_mb": round(max(x["peak_mb"] - x["baseline_mb"] for x in runs), 1),
                        "index_s": round(tm.get("index_s", float("nan")), 3),
                        "index_share": round(tm.get("index_s", 0.0) / med["seconds"], 3),
                        "stages_s": {k: round(v, 3) for k, v in tm.items()},
                        "all_seconds": [round(x["seconds"], 3) for x in runs], "memory_method": med["memory_method"]})
    secs = [r["seconds"] for r in results]
    idx = [r["index_s"] for r in results]
    out = {"results": results, "time_per_doubling": round(time_per_doubling(sizes, secs), 3),
           "index_time_per_doubling": round(time_per_doubling(sizes, idx), 3) if min(idx) > 0 else None,
           "anchors": cfg.anchors, "dim": cfg.dim, "classes": cfg.classes, "data": "synthetic",
           "config": {**asdict(cfg), "sizes": sizes},
           "load_average": {"before": [round(v, 2) for v in load_before],
                            "after": [round(v, 2) for v in os.getloadavg()]},
           "seconds": round(time.perf_counter() - t_start, 1)}
    return out
