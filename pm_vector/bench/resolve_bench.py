"""`pm-vector bench resolve`: the location release's resolve from a FRESH process, over reports drawn
from the release's law (issue 36: no answer is built on a miss).

The benchmark builds a temporary collection of ``items`` synthetic items (the data of
``bench latency``: unit-norm Gaussian clusters, :func:`pm_vector.bench.latency.clustered`), runs the
embedding job, and draws ``reports`` location requests at ``epsilon`` with the real client
(:class:`pm_vector.client.location.PrivateLocationKNN`: one held-out query each, its report drawn from
the release's law: the true cell with probability ``p``, any other with ``q``; the public plan's level,
the finest at eps 16). Then, for each phase:

* ``base``: no delta;
* ``delta`` (with ``delta_changes`` > 0): that many items changed through
  :func:`pm_vector.db.update_items` (in batches of :data:`UPDATE_BATCH`: a tombstone for each old
  version, each new version placed in the delta), no merge;

it starts a NEW Python process (:func:`main`, ``python -m pm_vector.bench.resolve_bench``: an empty
answer cache, as a freshly started service) that resolves every request once on a kept connection
(as a service's pool does, each with its request-log row) and reports each resolve's time and
whether its answer was built (a miss of the process's cache); then resolves every request again,
its answer cache emptied before each (``built_again``: every answer built, on the base rows, top
hubs and code slices the first pass left it holding, :mod:`pm_vector.db.resolve.location_cache`: what
a warm service does under a stream of writes, whose every sync pass changes the answers' key). The
result: per phase p50/p95/p99 in ms, the share of misses and the misses' own p50/p99, the process's
CPU time per report (on a loaded machine the times measure the wait for a core as much as the
work), and ``built_again``'s p50/p99 and CPU time per report. Everything the benchmark creates is dropped at
the end. With ``collection`` (``--collection NAME``) it times an existing collection instead (say the one
``bench writes --reuse`` keeps at 10^6 items): queries drawn near its own items, nothing written, one
phase: ``delta`` (with its size) when the active run has a delta (say, what ``bench writes --reuse
--no-merge`` left), else ``base``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
from psycopg import sql

import pm_vector.db as db
from ..db.core.collection import collection_row
from ..db.core.features import feature_filter, feature_sql
from ..client.location import PrivateLocationKNN
from ..errors import InvalidInputError, PMVectorError
from ..manifold.public_cells import PublicCells
from ..privacy import secure_generator
from ..protocol.published_codes import unpack
from ..db.resolve.location_cache import CACHE
from ..db.resolve.resolution import public_anchor, resolve
from ..db.runs.jobs import anchor_frame_embed_fn
from .latency import LatencyConfig, build_collection, pct, split_data

#: changes a call of update_items writes in the delta phase
UPDATE_BATCH = 1_000


@dataclass
class ResolveConfig:
    items: int = 100_000
    anchors: int = 1000
    dim: int = 128
    epsilon: float = 16.0
    reports: int = 1000
    delta_changes: int = 0  # > 0: a second phase after that many changes written to the delta (no merge)
    seed: int = 0
    collection: str | None = None  # an existing collection instead of a temporary one (kept; no delta phase)


def check_config(cfg: ResolveConfig) -> None:
    if cfg.items < 1000 or cfg.anchors < 2 or cfg.reports < 1 or cfg.delta_changes < 0:
        raise InvalidInputError("items must be >= 1000, anchors >= 2, reports >= 1 and delta changes >= 0.")
    if cfg.collection is not None and cfg.delta_changes:
        raise InvalidInputError("--delta-changes writes through update_items into a temporary collection; with "
                                "--collection (an existing one, which the benchmark never writes) leave it out.")
    if cfg.collection is None and cfg.delta_changes > cfg.items:
        raise InvalidInputError(f"--delta-changes {cfg.delta_changes} is more than the {cfg.items} items.")
    if not (cfg.epsilon > 0) or cfg.epsilon == float("inf"):
        raise InvalidInputError(f"epsilon must be a positive number, got {cfg.epsilon}.")


def _requests(name: str, n_items: int, Xq: np.ndarray, cfg: ResolveConfig) -> tuple[list[str], dict[str, Any]]:
    """One location request (JSON) per query, each report drawn by the client from the release's law."""
    _, info = public_anchor(name)
    pc = unpack(info["product_codes"], info["class_rows"]["codes"]["digest"])
    client = PrivateLocationKNN(PublicCells.from_dict(info["public_locations"]), cfg.epsilon, n_items=n_items,
                                widths=pc.widths_, collection=name)
    client._inject_generator(secure_generator(cfg.seed + 23))
    reqs = [client.request(Xq[i]).to_json() for i in range(Xq.shape[0])]
    p = client.plan_
    return reqs, {"level": int(p.level), "candidates": int(p.candidates), "code_bytes": int(p.code_bytes),
                  "max_bytes": int(p.max_bytes), "distinct_reports": len({json.loads(r)["report"] for r in reqs})}


def _fresh_process(name: str, reqs: list[str]) -> tuple[list[tuple[float, bool]], float, list[float], float]:
    """Every request resolved once by a new process (:func:`main`): ``(ms, built)`` per request, and the
    process's CPU seconds over them (less bent by a loaded machine than the times); then the ms of
    each built again, the answer cache emptied before each, and the CPU seconds of those."""
    doc = json.dumps({"collection": name, "requests": reqs})
    # run from the directory that holds this package: `python -m` puts its working directory first on
    # the path, and the new process must run the code this one runs
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    got = subprocess.run([sys.executable, "-m", "pm_vector.bench.resolve_bench"], input=doc, text=True,
                         capture_output=True, env=dict(os.environ), cwd=here, check=False)
    if got.returncode != 0:
        raise PMVectorError(f"the fresh resolve process failed ({got.stderr.strip()[-2000:]}); run the benchmark "
                            "again, or look at the database's log.")
    out = json.loads(got.stdout)
    return ([(float(ms), bool(built)) for ms, built in out["times"]], float(out["cpu_s"]),
            [float(ms) for ms in out["again"]], float(out["again_cpu_s"]))


def _phase(times: list[tuple[float, bool]], cpu_s: float, again: list[float], again_cpu_s: float) -> dict[str, Any]:
    ms = np.array([t for t, _ in times])
    built = np.array([b for _, b in times], bool)
    out = {"reports": int(ms.size), "p50_ms": round(pct(ms, 50), 3), "p95_ms": round(pct(ms, 95), 3),
           "p99_ms": round(pct(ms, 99), 3), "max_ms": round(float(ms.max()), 3),
           "miss_share": round(float(built.mean()), 4), "misses": int(built.sum()),
           "cpu_ms_per_report": round(cpu_s * 1e3 / max(1, ms.size), 3)}
    if built.any():
        out.update(miss_p50_ms=round(pct(ms[built], 50), 3), miss_p99_ms=round(pct(ms[built], 99), 3))
    a = np.array(again)
    out["built_again"] = {"p50_ms": round(pct(a, 50), 3), "p99_ms": round(pct(a, 99), 3),
                          "cpu_ms_per_report": round(again_cpu_s * 1e3 / max(1, a.size), 3)}
    return out


def _write_delta(name: str, n: int, Xq: np.ndarray, seed: int) -> float:
    """``n`` items changed through update_items (new features: held-out points), in batches; seconds."""
    rng = np.random.default_rng(seed + 29)
    ids = np.array([r[0] for r in db.connect(autocommit=True).execute(
        "SELECT i.id FROM pm_vector.items i JOIN pm_vector.collections c ON c.id = i.collection_id "
        "WHERE c.name = %s ORDER BY i.id", [name]).fetchall()], np.int64)
    pick = rng.choice(ids, size=n, replace=False)
    t = time.perf_counter()
    for s in range(0, n, UPDATE_BATCH):
        part = pick[s:s + UPDATE_BATCH]
        X = Xq[rng.integers(0, Xq.shape[0], part.size)]
        db.update_items(name, item_ids=part.tolist(), features=X)
    return time.perf_counter() - t


def _existing(cfg: ResolveConfig, say) -> dict[str, Any]:
    """The benchmark on an existing collection ``cfg.collection`` (kept, never written; its phase ``delta``
    when its active run has a delta, with its tombstones and new items, else ``base``): the queries are
    ``cfg.reports`` of its items' features, each moved by a little Gaussian noise (1% of the features'
    spread), read from wherever its features live (its items or its attached table)."""
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    name = cfg.collection
    with db.connect() as conn:
        coll = collection_row(conn, name)
        rows = conn.execute(sql.SQL("SELECT ({f})::real[] FROM pm_vector.items AS i WHERE i.collection_id = {c}{ok} "
                                    "ORDER BY i.id LIMIT {n}").format(
            f=feature_sql(coll, "i"), c=sql.Literal(int(coll["id"])), ok=feature_filter(coll, "i"),
            n=sql.Literal(20 * cfg.reports))).fetchall()
        n_items = int(conn.execute("SELECT n_items FROM pm_vector.embedding_runs WHERE id = %s",
                                   [coll["active_run_id"]]).fetchone()[0])
        dead, entries = conn.execute(
            "SELECT (SELECT count(*) FROM pm_vector.delta_tombstones WHERE run_id = %(r)s), "
            "(SELECT count(DISTINCT item_id) FROM pm_vector.delta_entries WHERE run_id = %(r)s)",
            {"r": int(coll["active_run_id"])}).fetchone()
    if not rows:
        raise InvalidInputError(f"collection {name!r} has no items to draw queries from.")
    F = np.asarray([r[0] for r in rows], np.float64)
    rng = np.random.default_rng(cfg.seed + 41)
    Xq = F[rng.choice(F.shape[0], size=cfg.reports, replace=F.shape[0] < cfg.reports)]
    Xq = Xq + 0.01 * F.std(axis=0, keepdims=True) * rng.normal(size=Xq.shape)
    reqs, plan = _requests(name, n_items, Xq, cfg)
    say("fresh process")
    # the phase is named by the state it finds: "delta" when the run has one (say, what a stream of
    # `bench writes --reuse --no-merge` left), with its size
    got = _phase(*_fresh_process(name, reqs))
    phases = {"delta": {**got, "tombstones": int(dead), "new_items": int(entries)}} if dead or entries else {"base": got}
    return {"items": n_items, "dim": int(F.shape[1]), "epsilon": cfg.epsilon, "plan": plan, "config": asdict(cfg),
            "phases": phases, "setup": {"collection": name},
            "load_average": {"before": [round(v, 2) for v in load_before],
                             "after": [round(v, 2) for v in os.getloadavg()]},
            "seconds": round(time.perf_counter() - t_start, 1)}


def run(cfg: ResolveConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the JSON-able result (module doc)."""
    say = progress or (lambda _m: None)
    check_config(cfg)
    if cfg.collection is not None:
        return _existing(cfg, say)
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    lcfg = LatencyConfig(items=cfg.items, anchors=cfg.anchors, dim=cfg.dim, seed=cfg.seed, rows=(10,))
    say("data")
    ds, split = split_data(lcfg, cfg.reports)
    Xs, _ = split.server
    Xq, _ = split.query
    name = f"bench_resolve_{uuid.uuid4().hex[:10]}"
    phases: dict[str, Any] = {}
    try:
        say("collection")
        ingest_s = build_collection(db, name, 10, Xs.shape[1], split, ds.n_classes, lcfg)
        say("embedding job")
        job = db.run_embedding_job(name, {"n_components": 16}, cfg.seed, embed_fn=anchor_frame_embed_fn)
        reqs, plan = _requests(name, int(Xs.shape[0]), Xq, cfg)
        say("fresh process, no delta")
        phases["base"] = _phase(*_fresh_process(name, reqs))
        if cfg.delta_changes:
            say(f"{cfg.delta_changes} changes into the delta")
            write_s = _write_delta(name, cfg.delta_changes, Xq, cfg.seed)
            say("fresh process, with the delta")
            phases["delta"] = {**_phase(*_fresh_process(name, reqs)), "changes": int(cfg.delta_changes),
                               "write_s": round(write_s, 1)}
    finally:
        db.drop_collection(name, missing_ok=True)
    return {"items": int(Xs.shape[0]), "dim": int(Xs.shape[1]), "epsilon": cfg.epsilon, "plan": plan,
            "config": asdict(cfg), "phases": phases,
            "setup": {"ingest_s": round(ingest_s, 1), "job_s": job.get("duration")},
            "load_average": {"before": [round(v, 2) for v in load_before],
                             "after": [round(v, 2) for v in os.getloadavg()]},
            "seconds": round(time.perf_counter() - t_start, 1)}


def main() -> None:
    """The fresh process: ``{"collection", "requests"}`` on stdin, ``{"times": [[ms, built], ...], "cpu_s",
    "again": [ms, ...], "again_cpu_s"}`` out (module doc)."""
    doc = json.load(sys.stdin)
    name = doc["collection"]
    conn = db.connect()
    times = []
    cpu = time.process_time()
    try:
        for r in doc["requests"]:
            t = time.perf_counter()
            res = resolve(name, r, conn=conn)
            times.append([(time.perf_counter() - t) * 1e3, not res["cached"]])
        cpu_s = time.process_time() - cpu
        again = []
        cpu = time.process_time()
        for r in doc["requests"]:
            CACHE.clear()
            t = time.perf_counter()
            resolve(name, r, conn=conn)
            again.append((time.perf_counter() - t) * 1e3)
    finally:
        conn.close()
    json.dump({"times": times, "cpu_s": cpu_s, "again": again, "again_cpu_s": time.process_time() - cpu}, sys.stdout)


if __name__ == "__main__":
    main()
