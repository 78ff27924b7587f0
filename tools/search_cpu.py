"""CPU time of the float32 flat searches the sync and the merge run (``pm_vector.neighbors``), side by side.

Two parts, each on seeded synthetic rows (the figures depend on the machine, not on the data):

- ``search``: the sync's pre-selection shape (``--queries`` new items against ``--items`` run
  embeddings of ``--dim`` floats, their ``--k`` nearest): ``product_knn`` against ``faiss.knn``, the
  flat search by its SIMD loops (below ``distance_compute_blas_threshold`` queries) and by its own
  product path (that process-wide threshold at 0, turned here and restored), for l2 and the inner product;
  the median CPU of ``--repeat`` calls, and whether each path's items equal ``product_knn``'s.
- ``graph``: the merge's neighbour graph (``ivf_graph``) of ``--graph-items`` clustered rows of 128
  floats, its per-cell searches by ``product_knn`` (the code) against ``faiss.knn``'s SIMD search (the
  code before, put in its place here), with the share of list entries the two agree on.

``time.process_time`` counts every thread of the process. ``--threads 1,2``: the search part with
the numerical libraries' pools at each size (threadpoolctl: BLAS and OpenMP, faiss's included).
``--busy N``: N processes busy-looping at normal priority meanwhile (a machine whose cores are
taken, as under a stream of writes): there a pool's threads spin at every parallel region.

    python tools/search_cpu.py [--json] [--no-graph] [--threads 1,2] [--busy 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from pm_vector import neighbors


def _cpu(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return 1e3 * statistics.median(times)


def _faiss_knn(Q, X, k, ip=False):
    """``faiss.knn`` as the code used it before ``product_knn``: ``(D, I)``."""
    import faiss

    return faiss.knn(Q, X, int(k), metric=faiss.METRIC_INNER_PRODUCT if ip else faiss.METRIC_L2)


def _faiss_product(Q, X, k, ip):
    import faiss

    before = faiss.cvar.distance_compute_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = 0
    try:
        return _faiss_knn(Q, X, k, ip)
    finally:
        faiss.cvar.distance_compute_blas_threshold = before


def _spin() -> None:
    while True:
        pass


def search(queries: int, items: int, dim: int, k: int, repeat: int, threads: int) -> list[dict]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((items, dim)).astype(np.float32)
    Q = rng.standard_normal((queries, dim)).astype(np.float32)
    rows = []
    for ip in (False, True):
        mine = neighbors.product_knn(Q, X, k, inner_product=ip)[1]
        for name, fn in (("faiss SIMD (faiss.knn)", lambda: _faiss_knn(Q, X, k, ip)),
                         ("faiss product (threshold 0)", lambda: _faiss_product(Q, X, k, ip)),
                         ("product_knn", lambda: neighbors.product_knn(Q, X, k, inner_product=ip))):
            with threadpool_limits(limits=threads):
                cpu = _cpu(fn, repeat)
            rows.append({"metric": "ip" if ip else "l2", "path": name, "threads": threads, "cpu_ms": round(cpu, 1),
                         "same_items": bool(np.array_equal(fn()[1], mine))})
    return rows


def graph(items: int, g: int) -> list[dict]:
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(200, 128)).astype(np.float32) * 3
    X = (centres[rng.integers(0, 200, items)] + rng.normal(size=(items, 128))).astype(np.float32)
    out, lists = [], {}
    for name, search_fn in (("faiss SIMD (before)", _faiss_knn),
                            ("product_knn", neighbors.product_knn)):
        saved = neighbors.product_knn
        neighbors.product_knn = search_fn
        try:
            t = time.process_time()
            lists[name] = neighbors.ivf_graph(X, g)
            cpu = time.process_time() - t
        finally:
            neighbors.product_knn = saved
        out.append({"path": name, "items": items, "g": g, "cpu_s": round(cpu, 1)})
    a, b = lists.values()
    out[-1]["same_entries"] = round(float(np.mean(a == b)), 5)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=360)
    ap.add_argument("--items", type=int, default=300_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--graph-items", type=int, default=130_000)
    ap.add_argument("--graph-degree", type=int, default=32)
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--threads", default="1", help="pool sizes of the search part, comma-separated")
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes meanwhile")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(a.busy)]
    for p in busy:
        p.start()
    try:
        res = {"busy": a.busy, "search": [r for t in a.threads.split(",")
                                          for r in search(a.queries, a.items, a.dim, a.k, a.repeat, int(t))]}
        if not a.no_graph:
            with threadpool_limits(limits=1):
                res["graph"] = graph(a.graph_items, a.graph_degree)
    finally:
        for p in busy:
            p.terminate()
    if a.json:
        print(json.dumps(res))
        return
    print(f"{a.queries} queries against {a.items:,} items of {a.dim} floats, k {a.k}: median CPU a search"
          f" ({a.busy} busy processes beside)")
    for r in res["search"]:
        print(f"  {r['metric']:3s} {r['path']:28s} {r['threads']} thread(s) {r['cpu_ms']:8.1f} ms"
              f"   same items as product_knn: {r['same_items']}")
    for r in res.get("graph", []):
        extra = f"   same entries: {r['same_entries']:.3%}" if "same_entries" in r else ""
        print(f"  ivf_graph of {r['items']:,} x 128, g {r['g']}, one thread, {r['path']:20s} {r['cpu_s']:6.1f} s{extra}")


if __name__ == "__main__":
    main()
