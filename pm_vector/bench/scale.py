"""`pm-vector bench scale`: the server's default embedding job against the number of items.

For every size n the benchmark creates a temporary collection of n synthetic items
(unit-norm Gaussian clusters, ``dim`` dimensions, ``classes`` labels; see
:func:`pm_vector.bench.latency.clustered`) with ``anchors`` public anchors and runs the job
``pm-vector embed`` runs (:func:`pm_vector.db.run_embedding_job` with the AnchorFrame
embedding): load by streamed binary COPY, AnchorFrame embedding (each item sees its
``n_neighbors`` nearest anchors), write, the **class rows** (frames, prior, the raw-feature
neighbour graph -- exact up to ``graph_exact_max_items`` items, blocked over faiss k-means cells above, see
:mod:`pm_vector.neighbors` -- hub counts, codes), the HNSW index builds and the switch. It
records:

* ``seconds``: wall time of the whole job, and its stage timings (``stages_s``);
* ``peak_mb``: the high-water mark of the job process's resident memory during the job (the job
  runs in this process and starts no child; Linux ``VmHWM`` reset before the job through
  ``/proc/self/clear_refs``, and a sampling thread as a cross-check / fallback), with
  ``baseline_mb`` (resident before the job) beside it. The database server's own memory
  (shared buffers, index builds' ``maintenance_work_mem``) is not the job's and is not counted;
* ``cells_table_mb`` / ``cells_entries``: the cell release's table (size with its TOAST and index,
  and the (item, count) entries of all its rows);
* ``graph_method`` and ``graph_recall``: how the job computed the graph, and the share of the
  ``graph_degree`` exact nearest other items of ``recall_sample`` random items that their
  stored lists hold (exact neighbours by brute force against all items, in blocks, float64);
  ``graph_build``: the blocked graph's ``cells``, ``probe`` and ``sample_recall`` (the job's own
  estimate on its 500-row sample, which chose the probe), from the run's timings.

``time_per_doubling = (t_max / t_min) ** (1 / log2(n_max / n_min))``: 2.0 is linear (also per
consecutive pair of sizes). Collections are dropped at the end. Each size's result is also printed
as it finishes, as one JSON line ``{"partial": ...}`` on stderr.
"""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import psutil
from psycopg import sql

from ..errors import InvalidInputError
import pm_vector.db as db
from ..db import _binary
from ..db.run_tables import run_table
from ..db.runs.jobs import anchor_frame_embed_fn
from ..manifold import AnchorFrame
from ..neighbors import knn_search
from .latency import N_FINE, clustered


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
    maintenance_work_mem: str | None = None  # None: the job's own, sized by the number of items
    graph: str = "auto"  # the class rows' graph method (auto / exact / hnsw)
    graph_exact_max_items: int | None = None  # None: the project's default threshold
    recall_sample: int = 1000  # items whose stored neighbour lists are checked against exact (0: none)


def _rss_mb() -> float | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        try:
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
    cr = {"graph": cfg.graph, **({} if cfg.graph_exact_max_items is None else
                                 {"graph_exact_max_items": int(cfg.graph_exact_max_items)})}
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
            t = time.perf_counter()
            db.ingest(name, X, y // (N_FINE // cfg.classes), batch_size=50_000)
            ingest_s = time.perf_counter() - t
            del X, y
            db.register_anchor_set(name, Xa, ya)
            for r in range(cfg.repeats):
                say(f"{n:,} items: job {r + 1}/{cfg.repeats}")
                with PeakRSS() as mem:
                    t = time.perf_counter()
                    info = db.run_embedding_job(name, {"n_components": cfg.n_components}, cfg.seed,
                                                embed_fn=anchor_frame_embed_fn,
                                                maintenance_work_mem=cfg.maintenance_work_mem, class_rows=cr)
                    secs = time.perf_counter() - t
                tm = info.get("timings") or {}
                runs.append({"seconds": secs, "peak_mb": mem.peak_mb, "baseline_mb": mem.baseline_mb,
                             "timings": tm, "memory_method": mem.method})
            say(f"{n:,} items: graph recall")
            graph = _graph_recall(name, info["run_id"], n, cfg)
        finally:
            db.drop_collection(name, missing_ok=True)
        med = sorted(runs, key=lambda x: x["seconds"])[len(runs) // 2]
        tm = med["timings"]
        results.append({"items": n, "seconds": round(med["seconds"], 3), "peak_mb": round(max(x["peak_mb"] for x in runs), 1),
                        "baseline_mb": round(med["baseline_mb"], 1),
                        "job_delta_mb": round(max(x["peak_mb"] - x["baseline_mb"] for x in runs), 1),
                        "index_s": round(tm.get("index_s", float("nan")), 3),
                        "index_share": round(tm.get("index_s", 0.0) / med["seconds"], 3),
                        "stages_s": {k: round(v, 3) for k, v in tm.items() if k.endswith("_s")},
                        # the blocked graph's cells, probe and its sample's recall (the job's own estimate)
                        "graph_build": {k.removeprefix("class_rows.graph_"): v for k, v in tm.items()
                                        if k.startswith("class_rows.graph_") and not k.endswith("_s")},
                        "all_seconds": [round(x["seconds"], 3) for x in runs], "memory_method": med["memory_method"],
                        "ingest_s": round(ingest_s, 3), **graph})
        # each size as it finishes, one JSON line on stderr: a long run stopped early keeps its sizes
        print(json.dumps({"partial": results[-1]}), file=sys.stderr, flush=True)
    secs = [r["seconds"] for r in results]
    idx = [r["index_s"] for r in results]
    for a, b in zip(results, results[1:]):
        b["time_per_doubling_from_previous"] = round(time_per_doubling([a["items"], b["items"]],
                                                                       [a["seconds"], b["seconds"]]), 3)
    out = {"results": results, "time_per_doubling": round(time_per_doubling(sizes, secs), 3),
           "index_time_per_doubling": round(time_per_doubling(sizes, idx), 3) if min(idx) > 0 else None,
           "anchors": cfg.anchors, "dim": cfg.dim, "classes": cfg.classes, "data": "synthetic",
           "config": {**asdict(cfg), "sizes": sizes},
           "load_average": {"before": [round(v, 2) for v in load_before],
                            "after": [round(v, 2) for v in os.getloadavg()]},
           "seconds": round(time.perf_counter() - t_start, 1)}
    return out


def exact_neighbors(X: np.ndarray, rows: np.ndarray, g: int, block: int = 100_000) -> np.ndarray:
    """``(len(rows), g)`` positions of the ``g`` exact nearest *other* items of ``X[rows]``
    (float64 distances, ties by the lower position), by brute force against blocks of ``block``
    items: memory ``len(rows) x block``, never ``n x n`` nor a float64 copy of ``X``."""
    Q = np.asarray(X[rows], dtype=np.float64)
    n = X.shape[0]
    k = min(g + 1, n)
    cand = []
    for s in range(0, n, block):
        Xb = np.asarray(X[s:s + block], dtype=np.float64)
        cand.append(knn_search(Q, Xb, min(k, Xb.shape[0])) + s)
    C = np.concatenate(cand, axis=1)
    d2 = np.stack([((np.asarray(X[C[i]], np.float64) - Q[i]) ** 2).sum(1) for i in range(len(rows))])
    order = np.stack([np.lexsort((C[i], d2[i])) for i in range(len(rows))])  # distance, then position
    best = np.take_along_axis(C, order, axis=1)
    out = np.empty((len(rows), k - 1), np.int64)
    for i, r in enumerate(rows):  # drop the item itself (if absent, the farthest)
        out[i] = best[i][best[i] != r][:k - 1]
    return out


def _graph_recall(name: str, run_id: int, n: int, cfg: ScaleConfig) -> dict[str, Any]:
    """The run's graph method and its recall against the exact graph on ``cfg.recall_sample``
    random items (the data regenerated from the seed; item ids checked against the features)."""
    with db.connect() as conn:
        doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s",
                           [int(run_id)]).fetchone()[0] or {}
        out: dict[str, Any] = {"graph_method": doc.get("graph_method"), "graph_recall": None,
                               "recall_sample": 0}
        cells = conn.execute("SELECT to_regclass(pm_vector.pm_run_table(%s, 'cells'))::text", [int(run_id)]).fetchone()[0]
        if cells is not None:  # the cell release's table: its size on disk and its entries (item, count) in all rows
            size, entries = conn.execute(sql.SQL("SELECT pg_total_relation_size(%s::regclass), "
                                                 "(SELECT coalesce(sum(cardinality(item_ids)), 0) FROM {})").format(
                run_table(run_id, "cells")), [cells]).fetchone()
            out.update(cells_table_mb=round(size / 2**20, 1), cells_entries=int(entries))
        g = int(doc.get("graph_degree_effective") or 0)
        if cfg.recall_sample <= 0 or g < 1:
            return out
        cid = db.collection_info(name)["id"]
        ids = _binary.decode([("id", "int8", 0)], _binary.copy_out(
            conn, "SELECT id FROM pm_vector.items WHERE collection_id = %s ORDER BY id", [int(cid)]))["id"]
        X, _ = clustered(n, cfg.dim, N_FINE, seed=cfg.seed + 2)
        rng = np.random.default_rng(cfg.seed + 3)
        rows = np.sort(rng.choice(n, min(int(cfg.recall_sample), n), replace=False))
        # the items were ingested in order (one ingest): check that position i is the i-th id
        stored = _binary.decode([("id", "int8", 0), ("features", "vector", cfg.dim)], _binary.copy_out(
            conn, "SELECT id, features FROM pm_vector.items WHERE id = ANY(%s) ORDER BY id", [ids[rows].tolist()]))
        if not np.allclose(stored["features"], X[rows], atol=1e-6):
            raise InvalidInputError("the items' ids are not in ingest order; the recall cannot be checked.")
        lists = dict(conn.execute(sql.SQL("SELECT item_id, array_agg(neighbor_id) FROM {} WHERE item_id = ANY(%s) "
                                          "GROUP BY item_id").format(run_table(run_id, "neighbors")),
                                  [ids[rows].tolist()]).fetchall())
        exact = ids[exact_neighbors(X, rows, g)]
        hit = [len(set(lists.get(int(ids[r]), ())) & set(exact[i].tolist())) / g for i, r in enumerate(rows)]
    out.update(graph_recall=round(float(np.mean(hit)), 4), recall_sample=int(rows.size))
    return out
