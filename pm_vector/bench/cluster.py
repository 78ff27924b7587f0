"""`pm-vector bench cluster`: one node against a local cluster (shards + a replica), side by side.

In a private ``PM_VECTOR_HOME`` the benchmark starts a local cluster (a coordinator, ``shards``
shards, ``replicas`` replicas: :mod:`pm_vector.db.postgres.cluster`) and, as the single node, a second
database ``pm_single`` on the coordinator's server with no shard registered. For each request
size C in ``rows`` it loads the same synthetic collection (``items`` unit-norm rows in C
classes, :func:`pm_vector.bench.latency.clustered`) into both and measures, per configuration:

* ``ingest_rows_per_s``: :func:`pm_vector.db.ingest` of the items;
* ``embed_seconds``: the embedding job (SMLQ frame embedding and class rows: the prior, graph and
  hubs, which the cluster writes to its shards and indexes there);
* ``resolve``: p50 / p95 of :func:`pm_vector.db.resolve.resolution.resolve` of private class-rows
  requests (one row per class, eps ``epsilon``, ``shortlist`` candidates per row), on a kept
  connection to the node that answers (the request log is written on the primary);
* for the cluster, ``replica_shortlist``: p50 / p95 of the same ``pm_shortlist`` statement read
  on a replica, and ``fanout_overhead_ms``: the coordinator's ``pm_shortlist`` p50 minus the p50
  of the slowest shard's own part of it (``pm_shortlist_core`` timed on each shard with its rows:
  the coordinator's cost of fanning out, collecting and joining the items);
* ``same_answers``: every row of every request gets the same candidates (external ids) in the
  same order from the single node and from the cluster; ``agreement``: per C, the share of
  identical candidates and of identical rows, cluster vs single node and single node vs itself
  after its class HNSW indexes are rebuilt (a class larger than ``max_prior`` retains its prior
  through an approximate HNSW scan: two builds of one index can retain a few different items, on
  one node as across nodes).

``release`` picks the parts: ``"class_rows"`` (the above), ``"location"`` (the default release on the
collection of the first C: :mod:`pm_vector.bench.cluster_location`, before and after ``changes``
writes; per configuration ``location_resolve``, for the cluster ``replica_location_resolve``, and
``location_same_answers``, ``location_deleted_in_answers``, ``location`` in full) or ``"both"``.

All nodes share this machine's cores: the figures show the fan-out's cost and the per-shard work,
not a speed-up that needs one machine per shard (``per_shard_scan_ms`` is what each node would
spend; see ``projection``).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
from psycopg import sql

from ..db.run_tables import run_table

import pm_vector.db as db
from ..client.query import PrivateKNN
from ..db import postgres
from ..db.postgres import cluster, dispose_engines
from ..db.resolve.resolution import resolve
from ..db.runs.jobs import anchor_frame_embed_fn
from ..manifold.class_frames import ClassFrames
from ..privacy import secure_generator
from ._home import private_home
from .cluster_location import run_location
from .latency import clustered
import psycopg


@dataclass(frozen=True)
class Timed:
    """What one ``--release`` choice times: the location release, the class-rows path, or both."""

    location: bool
    class_rows: bool


#: ``--release``'s choices (a benchmark option, not a release: the table of releases is
#: :mod:`pm_vector.protocol.releases`)
PARTS = {"location": Timed(True, False), "class_rows": Timed(False, True), "both": Timed(True, True)}


@dataclass
class ClusterBenchConfig:
    items: int = 200_000
    anchors: int = 1000
    dim: int = 64
    rows: tuple = (10, 100)
    shards: int = 2
    replicas: int = 1
    repeats: int = 30
    warmup: int = 3
    epsilon: float = 4.0
    delta: float = 1e-5
    shortlist: int = 128
    n_components: int = 8
    seed: int = 0
    release: str = "both"  # a key of PARTS: "location" (the default release), "class_rows" or "both"
    changes: int = 200  # writes between the location part's two measurements (0: none)
    feature_updates: bool = True  # the changes include feature / label updates (else payload updates instead)
    location_epsilons: tuple = (1.0, 4.0, 16.0)
    location_max_bytes: int = 50_000


def _pct(v, q) -> float:
    return round(float(np.percentile(np.asarray(v, dtype=np.float64), q)), 3)


def _use(url: str) -> None:
    os.environ["PM_VECTOR_DATABASE_URL"] = url
    dispose_engines()


def _agreement(a: list, b: list) -> dict[str, float]:
    """Per request row: the share of identical candidates, and of rows with the identical ordered list."""
    share, same = [], []
    for ra, rb in zip(a, b):
        for x, y in zip(ra, rb):
            share.append(len(set(x) & set(y)) / max(1, len(x)))
            same.append(x == y)
    return {"candidates_shared": round(float(np.mean(share)), 6), "rows_identical": round(float(np.mean(same)), 6)}


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def _data(cfg: ClusterBenchConfig, n_query: int):
    """The benchmark's features and fine labels, and the positions of its items, anchors, dummies
    (4 of every fine class) and queries."""
    n_fine = max(cfg.rows)
    total = cfg.items + cfg.anchors + 4 * n_fine + n_query
    X, y_fine = clustered(total, cfg.dim, n_fine, seed=cfg.seed)
    perm = np.random.default_rng(cfg.seed).permutation(total)
    # 4 public dummies of every fine class (a request needs a dummy of every class), the rest split
    dummy = np.concatenate([perm[y_fine[perm] == c][:4] for c in range(n_fine)])
    rest = perm[~np.isin(perm, dummy)]
    items, anchors, queries = np.split(rest, np.cumsum([cfg.items, cfg.anchors]))
    return X, y_fine, n_fine, [items, anchors, dummy, queries]


def _build(cfg: ClusterBenchConfig, name: str, C: int, which: str, url: str, rec: dict, data: tuple,
           say) -> tuple[dict, dict]:
    """On one deployment (``which``: single or cluster): the collection built (ingest, anchors,
    embedding job). Returns (the job, the run's class rows document)."""
    Xs, ys, Xa, ya, Xd, yd = data[:6]
    _use(url)
    db.drop_collection(name, missing_ok=True)
    db.create_collection(name, cfg.dim, list(range(C)), allow_raw_features=True)
    say(f"C={C} {which}: ingest {cfg.items} rows")
    t = time.perf_counter()
    db.ingest(name, Xs, ys, external_ids=[f"s{i}" for i in range(len(ys))])
    ingest_s = time.perf_counter() - t
    db.register_anchor_set(name, Xa, ya)
    db.register_anchor_set(name, Xd, yd, role="dummy")
    say(f"C={C} {which}: embedding job")
    t = time.perf_counter()
    job = db.run_embedding_job(name, {"n_components": cfg.n_components}, cfg.seed,
                               embed_fn=anchor_frame_embed_fn)
    embed_s = time.perf_counter() - t
    rec.setdefault("ingest_rows_per_s", []).append(round(cfg.items / ingest_s, 1))
    rec.setdefault("embed_seconds", []).append(round(embed_s, 3))
    with psycopg.connect(url) as c:
        cr = c.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [job["run_id"]]).fetchone()[0]
    return job, cr


def _class_rows_resolve(cfg: ClusterBenchConfig, name: str, C: int, which: str, url: str, rec: dict,
                        data: tuple, n_query: int, say) -> tuple[list, list]:
    """The client's class-rows requests on the collection built by :func:`_build`, and their timed
    resolves. Returns (the requests, every request's answered lists)."""
    Xs, ys, Xa, ya, Xd, yd, Xq, yq = data
    _use(url)
    with psycopg.connect(url) as c:
        frames_doc = c.execute("SELECT r.class_frames FROM pm_vector.embedding_runs r JOIN pm_vector.collections k "
                               "ON k.active_run_id = r.id WHERE k.name = %s", [name]).fetchone()[0]
    client = PrivateKNN(ClassFrames.from_dict(frames_doc), Xd.astype(np.float64), yd, cfg.epsilon,
                        cfg.delta, shortlist=cfg.shortlist, collection=name)
    client._inject_generator(secure_generator(cfg.seed + C))
    reqs = [client.request(Xq[i].astype(np.float64), int(yq[i]))[0] for i in range(n_query)]
    say(f"C={C} {which}: {n_query} resolves")
    ms, lists = [], []
    with db.connect() as conn:
        for i, req in enumerate(reqs):
            t = time.perf_counter()
            res = resolve(name, req, k=8, conn=conn)
            if i >= cfg.warmup:
                ms.append((time.perf_counter() - t) * 1e3)
            lists.append([r["external_ids"] for r in res["rows"]])
    rec["resolve"].append({"rows": C, "p50_ms": _pct(ms, 50), "p95_ms": _pct(ms, 95)})
    return reqs, lists


def _rebuilt_answers(name: str, job: dict, reqs: list) -> list:
    """The same node, its class HNSW indexes rebuilt: the requests' answered lists again (what an
    approximate index alone changes)."""
    with db.connect(autocommit=True) as ac:  # REINDEX of a partitioned table: no transaction
        ac.execute(sql.SQL("REINDEX TABLE {}").format(run_table(job["run_id"], "prior")))
    with db.connect() as conn:
        return [[r["external_ids"] for r in resolve(name, req, k=8, conn=conn, log=False)["rows"]]
                for req in reqs]


def _fanout(cfg: ClusterBenchConfig, name: str, C: int, coord: str, replicas: list, shard_urls: dict, job: dict,
            cr: dict, reqs: list, rec: dict) -> None:
    """On the cluster: the shortlist statement timed on the coordinator, on the first replica (once
    it has caught up) and, its core, on every shard; records the fan-out overhead (the coordinator's
    median minus the slowest shard's)."""
    stmt = ("SELECT count(*) FROM pm_vector.pm_shortlist(%s, %s::float8[], %s::float8[], %s)")
    args = [[name, r.rows.tolist(), list(r.sigmas), cfg.shortlist] for r in reqs]
    with psycopg.connect(coord) as c:
        coord_ms = [_timed(lambda a=a: c.execute(stmt, a).fetchone()) for a in args][cfg.warmup:]
        lsn = c.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    if replicas:
        deadline = time.monotonic() + 60
        while cluster.replica_lag_bytes(replicas[0], lsn) not in (0,) and time.monotonic() < deadline:
            time.sleep(0.1)
        with psycopg.connect(replicas[0]) as r:
            rep_ms = [_timed(lambda a=a: r.execute(stmt, a).fetchone()) for a in args][cfg.warmup:]
        rec["replica_shortlist"].append({"rows": C, "p50_ms": _pct(rep_ms, 50), "p95_ms": _pct(rep_ms, 95)})
    place = cr["shards"]
    shard_ms: dict[str, list[float]] = {}
    for s, ks in place.items():
        pos = list(ks)
        core = ("SELECT count(*) FROM pm_vector.pm_shortlist_core(%s, %s, %s::float8[], %s::float8[], "
                "%s::bigint[], %s::bigint[], %s, %s)")
        with psycopg.connect(shard_urls[s]) as sc:
            shard_ms[s] = [_timed(lambda r=r: sc.execute(core, [
                job["run_id"], cr["n_components"], r.rows[pos].tolist(), [r.sigmas[k] for k in pos],
                [cr["classes"][k] for k in pos], [cr["class_sizes"][k] for k in pos], cfg.shortlist,
                cr["max_prior"]]).fetchone()) for r in reqs][cfg.warmup:]
    slowest = max(statistics.median(v) for v in shard_ms.values())
    rec["fanout"].append({"rows": C, "coordinator_shortlist_p50_ms": _pct(coord_ms, 50),
                          "slowest_shard_p50_ms": round(slowest, 3),
                          "overhead_ms": round(statistics.median(coord_ms) - slowest, 3)})
    rec["per_shard_scan_ms"].append({"rows": C, **{s: _pct(v, 50) for s, v in shard_ms.items()}})


def _record_agreement(out: dict, answers: dict, C: int, ys: np.ndarray, cr: dict) -> None:
    """Whether the cluster answered as the single node, and how closely (also the single node against
    itself with its indexes rebuilt)."""
    same = answers[("single", C)] == answers[("cluster", C)]
    out["same_answers"] = out["same_answers"] and same
    out.setdefault("same_answers_by_rows", {})[str(C)] = same
    out.setdefault("agreement", {})[str(C)] = {
        "cluster_vs_single": _agreement(answers[("single", C)], answers[("cluster", C)]),
        "single_rebuilt_vs_single": _agreement(answers[("single", C)], answers[("rebuilt", C)]),
        "largest_class": int(np.bincount(ys).max()), "max_prior": int(cr["max_prior"])}


def _summarise(out: dict, per: dict, loc: dict | None) -> None:
    """The per-deployment rows (ingest, embed, resolve, fan-out, the location release), the per-shard
    projection and the machine note, into ``out``."""
    rows = "fanout" in per["cluster"] and bool(per["cluster"]["fanout"])
    for which in ("single", "cluster"):
        rec = per[which]
        row = {"shards": rec["shards"], "replicas": rec["replicas"],
               "ingest_rows_per_s": statistics.median(rec["ingest_rows_per_s"]),
               "embed_seconds": round(sum(rec["embed_seconds"]), 3), "resolve": rec["resolve"],
               "fanout_overhead_ms": (None if which == "single" or not rows
                                      else round(statistics.median(f["overhead_ms"] for f in rec["fanout"]), 3))}
        if which == "cluster" and rows:
            row.update({"fanout": rec["fanout"], "per_shard_scan_ms": rec["per_shard_scan_ms"],
                        "replica_shortlist": rec["replica_shortlist"]})
        if loc is not None:
            phases = [p for p in ("before", "after") if p in loc]
            row["location_resolve"] = {p: {k: loc[p][which][k] for k in ("p50_ms", "p95_ms")} for p in phases}
            if which == "cluster" and "replica" in loc["before"]:
                row["replica_location_resolve"] = {p: {k: loc[p]["replica"][k] for k in ("p50_ms", "p95_ms")}
                                                   for p in phases}
        out["configs"].append(row)
    if rows:
        out["projection"] = {
            str(r["rows"]): {"per_shard_scan_ms": {k: v for k, v in r.items() if k != "rows"},
                             "note": "with one machine per shard, a request's shard time is the slowest shard's, "
                                     "plus the coordinator's fan-out overhead"}
            for r in out["configs"][1]["per_shard_scan_ms"]}
    if loc is not None:
        phases = [loc[p] for p in ("before", "after") if p in loc]
        out["location_same_answers"] = all(p["same_answers"] for p in phases)
        out["location_deleted_in_answers"] = sum(v for p in phases for v in p["deleted_in_answers"].values())
        out["location"] = loc
    out["machine"] = {"cpus": os.cpu_count(),
                      "note": "every node runs on this machine: shards compete for the same cores"}


def run(cfg: ClusterBenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    timed = PARTS.get(cfg.release)
    if timed is None:
        raise ValueError(f"release must be one of {', '.join(PARTS)}; got {cfg.release!r}")
    say = progress or (lambda s: None)
    rows_part = timed.class_rows
    out: dict[str, Any] = {"config": asdict(cfg), "configs": []}
    if rows_part:
        out["same_answers"] = True
    with private_home("pm_bench_cluster_", stop=postgres.stop_cluster):
        say(f"starting a coordinator, {cfg.shards} shard(s) and {cfg.replicas} replica(s)")
        st = cluster.start(cfg.shards, cfg.replicas)
        coord = cluster.coordinator_url()
        single = cluster.standalone_database(coord)
        replicas = cluster.replica_urls()
        shard_urls = {n["name"]: cluster.node_url(n) for n in cluster.topology()["nodes"] if n["role"] == "shard"}
        n_query = cfg.repeats + cfg.warmup
        X, y_fine, n_fine, parts = _data(cfg, n_query)
        Xs, Xa, Xd, Xq = (X[p] for p in parts)
        per = {"single": {"shards": 1, "replicas": 0, "resolve": []},
               "cluster": {"shards": cfg.shards, "replicas": len(replicas), "resolve": [], "replica_shortlist": [],
                           "fanout": [], "per_shard_scan_ms": []}}
        answers: dict[tuple[str, int], list] = {}
        loc = None
        for C in (cfg.rows if rows_part else cfg.rows[:1]):
            lab = y_fine // (n_fine // C) if n_fine % C == 0 else None
            if lab is None:
                raise ValueError(f"C = {C} must divide {n_fine}")
            ys, ya, yd, yq = (lab[p] for p in parts)
            name = f"bench_cluster_{C}"
            data = (Xs, ys, Xa, ya, Xd, yd, Xq, yq)
            for which, url in (("single", single), ("cluster", coord)):
                rec = per[which]
                job, cr = _build(cfg, name, C, which, url, rec, data, say)
                if not rows_part:
                    continue
                reqs, answers[(which, C)] = _class_rows_resolve(cfg, name, C, which, url, rec, data, n_query, say)
                if which == "single":
                    say(f"C={C} single: prior indexes rebuilt, the same requests again")
                    answers[("rebuilt", C)] = _rebuilt_answers(name, job, reqs)
                else:
                    _fanout(cfg, name, C, coord, replicas, shard_urls, job, cr, reqs, rec)
            if rows_part:
                _record_agreement(out, answers, C, ys, cr)
            if loc is None and timed.location:
                loc = run_location(cfg, name, C, {"single": single, "cluster": coord},
                                   replicas[0] if replicas else None, Xq, [f"s{i}" for i in range(len(ys))],
                                   _use, say)
        _summarise(out, per, loc)
        return out
