"""``pm-vector bench writes-recall``: what the write path's delta costs the answers (issue 36's
recall and answer-time figures), on ``bench writes``' collection and change stream.

Set-up: ``bench writes``' data and collection (:class:`~pm_vector.bench.writes_targets.PmVectorTarget`,
the attached path; with ``reuse`` the collection kept by ``bench writes --reuse`` of the same
``--items``, ``--dim``, ``--anchors`` and ``--seed``, and kept again), its delta empty (a delta
left by a run that was cut is merged first). Then:

1. **changes**: ``changes`` of ``bench writes``' mixed stream (:class:`~pm_vector.bench.writes_stream.Stream`:
   a third each inserts, vector updates and deletes of initial items, each key once) committed to the
   attached table ``batch`` a transaction, each transaction applied by :func:`pm_vector.db.sync`
   (the write path: tombstones, new items placed in the delta), no merge;
2. the three **states** measured on the same final data: ``delta`` (the base with the changes'
   delta), ``merged`` (after :func:`pm_vector.db.merge`, timed) and ``full`` (a new embedding job of
   the set-up's parameters on the final data, timed).

**Recall** per state and eps (``epsilons``), the default plan (:func:`pm_vector.privacy.location.plan`
at ``max_bytes``, 50 kB, the collection's published item count): every report ``r`` of the plan's
level is resolved by the server (:func:`pm_vector.db.resolve.resolution.resolve`, the answer a
client gets: ids and code prefixes) and re-ranked as the client does (the asymmetric distance of
the query to each candidate's code, :func:`pm_vector.bench.location_methods.code_ranks`); a query's
nn_recall@8 against the exact 8 nearest live items of the final data (raw features,
:func:`pm_vector.neighbors.knn_search`) is then its **expectation over the release's law**
(:func:`pm_vector.bench.location_methods.expected_recall`, as ``bench privacy``'s
``pm_vector_location``): every report weighted by its exact probability given the query's true
cell. So the three states are compared on the same law (no sampling noise from the reports), over
the same ``queries`` query vectors (fresh rows of the data's law); ``se`` is the standard error
over the queries, and each difference's ``se`` the paired one (the same queries). ``sampled`` is
the recall of one report per query drawn from the law (by the mechanism's exact sampler on a
CSPRNG seeded by the bench, once, and given to the three states).

**Answer time** per state and eps: ``latency_reports`` reports drawn from the law as above (the
same for every state), each resolved and logged as the service does after this process's answer
cache was cleared (every answer built: the work a delta adds; the process's tombstone sets are kept, as
a serving process keeps them: :class:`~pm_vector.db.resolve.location_cache.TombstoneSets`, read by
the first answer of a state), p50 / p99 ms; ``ratio_p50_vs_merged``
and ``ratio_p50_vs_full``: the delta state's p50 over that of the states with an empty delta on the
same data (the merged one measured right after the merge dropped the superseded run's delta rows,
the full one later).

**Answer bytes**: the wire bytes of the answers (:func:`pm_vector.bench.metrics.wire_bytes`) over
every report, mean and max. **Delta size**: the delta's new items and tombstones before the merge
(:func:`pm_vector.db.runs.delta.status`) and its entry rows.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from ..errors import InvalidInputError
import pm_vector.db as db
from . import writes_reuse
from .latency import N_FINE, clustered
from .location_methods import code_ranks, expected_recall
from .metrics import wire_bytes
from .writes_bench import WritesConfig
from .writes_stream import Stream
from .writes_targets import PmVectorTarget
from .._validation import normalize_rows
from ..client.location import PrivateLocationKNN
from ..db.core.collection import collection_row, load_items
from ..db.resolve.location_cache import CACHE
from ..db.resolve.resolution import public_anchor, resolve
from ..db.runs import delta as _delta
from ..db.runs.jobs import anchor_frame_embed_fn, anchor_frame_extend_fn
from ..manifold.public_cells import PublicCells
from ..neighbors import knn_search
from ..privacy import secure_generator
from ..protocol.location import LocationRequest
from ..protocol.published_codes import unpack

K = 8
STATES = ("delta", "merged", "full")


@dataclass
class RecallConfig:
    items: int = 20_000
    dim: int = 128
    changes: int = 10_000
    epsilons: tuple = (4.0, 16.0)
    queries: int = 1000
    latency_reports: int = 200
    max_bytes: int = 50_000
    batch: int = 100
    anchors: int = 1000
    seed: int = 0
    reuse: bool = False


def check_config(cfg: RecallConfig) -> None:
    """Refuse a configuration the benchmark cannot run, before anything is built."""
    if cfg.items < 200 or cfg.dim < 2 or cfg.anchors < 20:
        raise InvalidInputError("the benchmark needs at least 200 items, 2 dimensions and 20 anchors.")
    if cfg.changes < 1 or cfg.changes * 2 // 3 + 1 > cfg.items - 1:
        raise InvalidInputError(f"--changes must be between 1 and about 1.5 x the items ({cfg.items}): each update "
                                "and delete takes a distinct initial item.")
    if not cfg.epsilons or any(not (e > 0) or e == float("inf") for e in cfg.epsilons):
        raise InvalidInputError("each epsilon must be a positive number.")
    if cfg.queries < 2 or cfg.latency_reports < 1 or cfg.batch < 1:
        raise InvalidInputError("--queries must be >= 2, --latency-reports and --batch >= 1.")


def _ms(v, q) -> float | None:
    return round(1e3 * float(np.percentile(v, q)), 1) if len(v) else None


class Published:
    """What a client reads of the active run: the location cells, the product codes, the item count."""

    def __init__(self, name: str):
        info = public_anchor(name)[1]
        self.cells = PublicCells.from_dict(info["public_locations"])
        self.pc = unpack(info["product_codes"], info["class_rows"]["codes"]["digest"])
        self.n_items = int(info["class_rows"]["n_items"])
        self.run_id = int(info["run_id"])

    def client(self, name: str, eps: float, max_bytes: int) -> PrivateLocationKNN:
        return PrivateLocationKNN(self.cells, eps, n_items=self.n_items, widths=tuple(self.pc.widths_),
                                  max_bytes=max_bytes, collection=name)


def answer_lists(name: str, client: PrivateLocationKNN, conn, reports) -> dict[str, Any]:
    """Every report of ``reports`` resolved (unlogged): ``{"lists": [ids (S,)], "codes": {id: code},
    "bytes": [wire bytes]}``."""
    p = client.plan_
    lists, codes, sizes = [], {}, []
    for r in reports:
        req = client_request(client, int(r))
        ans = resolve(name, req, conn=conn, log=False)
        ids = np.asarray(ans["item_ids"]).astype(np.int64)
        C = np.frombuffer(ans["codes_data"], np.uint8).reshape(ids.size, p.code_bytes)
        codes.update(zip(ids.tolist(), C))
        lists.append(ids)
        sizes.append(wire_bytes({k: v for k, v in ans.items() if k not in ("timings_ms", "cached", "request_log_id")}))
    return {"lists": lists, "codes": codes, "bytes": sizes}


def client_request(client: PrivateLocationKNN, report: int):
    """The location request of ``report`` at ``client``'s plan (a report from the law, drawn by the bench)."""
    p = client.plan_
    return LocationRequest(report=int(report), level=p.level, epsilon=client.mechanism.epsilon,
                           locations_digest=client.digest, candidates=p.candidates, code_bytes=p.code_bytes,
                           collection=client.collection)


def measure(name: str, cfg: RecallConfig, Xq: np.ndarray, truth_ids: np.ndarray, draws: dict, say) -> dict[str, Any]:
    """One state's figures per eps (module doc). ``truth_ids``: ``(q, 8)`` item ids; ``draws``: per eps
    ``(reports of the queries, latency reports)``, drawn by the first state and kept for the others."""
    pub = Published(name)
    out: dict[str, Any] = {"run_id": pub.run_id, "n_items": pub.n_items}
    with db.connect() as conn:
        for eps in cfg.epsilons:
            client = pub.client(name, float(eps), cfg.max_bytes)
            p, mech = client.plan_, client.mechanism
            true_cell = pub.cells.assign(normalize_rows(Xq), 0, p.level).astype(np.int64)
            if eps not in draws:
                rng = secure_generator(cfg.seed + 17 + int(1000 * eps))
                lat_q = rng.integers(Xq.shape[0], size=cfg.latency_reports)
                draws[eps] = (np.array([mech.release(int(a), rng) for a in true_cell]),
                              np.array([mech.release(int(true_cell[i]), rng) for i in lat_q]), p.level)
            reports, lat_reports, level = draws[eps]
            if level != p.level:
                raise InvalidInputError(f"the plan's level changed between states ({level} -> {p.level}).")
            t = time.perf_counter()
            got = answer_lists(name, client, conn, range(p.level))
            say(f"{name}: eps {eps:g}, {p.level} answers built in {time.perf_counter() - t:.1f} s")
            U = np.array(sorted(got["codes"]), np.int64)  # every item some answer holds
            ranks = code_ranks(pub.pc, np.stack([got["codes"][i] for i in U.tolist()]), Xq)
            pos = {int(i): j for j, i in enumerate(U.tolist())}
            truth = np.vectorize(lambda i: pos.get(int(i), -1), otypes=[np.int64])(truth_ids)
            lists = [np.array([pos[int(i)] for i in L.tolist()], np.int64) for L in got["lists"]]
            per_q, hits = expected_recall(lists, ranks, truth, true_cell, mech.p_, mech.q_, K)
            sampled = hits[reports, np.arange(Xq.shape[0])]
            CACHE.clear()
            times = []
            for r in lat_reports.tolist():
                CACHE.clear()  # every answer built: the work the delta adds to an answer
                t = time.perf_counter()
                resolve(name, client_request(client, r), conn=conn, log=True)
                times.append(time.perf_counter() - t)
            out[f"eps_{eps:g}"] = {
                "level": p.level, "candidates": p.candidates, "code_bytes": p.code_bytes,
                f"nn_recall_at_{K}": round(float(per_q.mean()), 5),
                "se": round(float(per_q.std(ddof=1) / np.sqrt(per_q.size)), 5), "per_query": per_q,
                "sampled": round(float(sampled.mean()), 5), "sampled_per_query": sampled,
                "true_cell_nn_recall": round(float(hits[true_cell, np.arange(Xq.shape[0])].mean()), 5),
                "answer_bytes_mean": round(float(np.mean(got["bytes"])), 1), "answer_bytes_max": int(max(got["bytes"])),
                "answer_p50_ms": _ms(times, 50), "answer_p99_ms": _ms(times, 99), "latency_reports": len(times),
                "load_average": [round(v, 2) for v in os.getloadavg()]}
            x = out[f"eps_{eps:g}"]
            say(f"{name}: eps {eps:g}: nn_recall@{K} {x[f'nn_recall_at_{K}']} (se {x['se']}), answer p50 / p99 "
                f"{x['answer_p50_ms']} / {x['answer_p99_ms']} ms, {x['answer_bytes_mean']:.0f} B")
    CACHE.clear()
    return out


def _diff(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    d = np.asarray(a) - np.asarray(b)
    return {"diff": round(float(d.mean()), 5), "se": round(float(d.std(ddof=1) / np.sqrt(d.size)), 5)}


def _ratio(a, b) -> float | None:
    return round(a / b, 3) if a and b else None


def summarise(states: dict[str, dict], cfg: RecallConfig) -> dict[str, Any]:
    """The differences to the full job (paired over the queries), the targets, the answer-time ratio;
    the per-query arrays dropped."""
    out: dict[str, Any] = {}
    for eps in cfg.epsilons:
        e = f"eps_{eps:g}"
        s = {st: states[st][e] for st in STATES}
        d = {f"{st}_minus_full": _diff(s[st]["per_query"], s["full"]["per_query"]) for st in ("delta", "merged")}
        d.update({f"{st}_minus_full_sampled": _diff(s[st]["sampled_per_query"], s["full"]["sampled_per_query"])
                  for st in ("delta", "merged")})
        out[e] = {**d, "delta_within_02": abs(d["delta_minus_full"]["diff"]) <= 0.02,
                  "merged_within_005": abs(d["merged_minus_full"]["diff"]) <= 0.005,
                  **{f"ratio_p50_vs_{st}": _ratio(s["delta"]["answer_p50_ms"], s[st]["answer_p50_ms"])
                     for st in ("merged", "full")}}
        for st in STATES:
            for key in ("per_query", "sampled_per_query"):
                s[st].pop(key)
    return out


def run(cfg: RecallConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The benchmark (module doc); returns the JSON-able result."""
    say = progress or (lambda _m: None)
    check_config(cfg)
    t_start = time.perf_counter()
    say("data")
    X, y = clustered(cfg.items + writes_reuse.NEW_ROWS, cfg.dim, N_FINE, seed=cfg.seed)
    anchor, anchor_y = clustered(cfg.anchors, cfg.dim, N_FINE, seed=cfg.seed + 1)
    Xq = clustered(cfg.queries, cfg.dim, N_FINE, seed=cfg.seed + 7)[0]
    tag = writes_reuse.tag(_as_writes(cfg)) if cfg.reuse else uuid.uuid4().hex[:8]
    out: dict[str, Any] = {"config": asdict(cfg), "setup": {}}
    pm = PmVectorTarget(tag, X, y // 10, cfg.items, anchor, anchor_y // 10, path="attached", epsilon=16.0,
                        seed=cfg.seed, sync_interval_s=1.0, say=say, reuse=cfg.reuse)
    try:
        out["setup"] = dict(pm.setup)
        with db.connect() as conn:
            st = _delta.status(conn, pm.name)
        if st and (st["delta_items"] or st["pending_purge"]):
            say(f"{pm.name}: a delta left by a run before ({st['delta_items']} items, {st['pending_purge']} "
                "tombstones): merged first")
            _merge(pm.name)
        rng = np.random.default_rng(cfg.seed + 5)
        stream = Stream(cfg.items, X.shape[0], rng.permutation(pm.state["untouched"]).tolist(), rng,
                        next_key=pm.state["next_key"])
        out["stream"] = apply_changes(pm, stream.take(cfg.changes), cfg.batch, say)
        with db.connect() as conn:
            st = _delta.status(conn, pm.name)
            entries = conn.execute("SELECT count(*) FROM pm_vector.delta_entries WHERE run_id = %s",
                                   [st["run_id"]]).fetchone()[0]
            coll = collection_row(conn, pm.name)
            live = load_items(conn, coll)
            conn.rollback()
        out["delta_size"] = {"new_items": int(st["delta_items"] or 0), "tombstones": int(st["pending_purge"] or 0),
                             "entry_rows": int(entries)}
        say(f"ground truth: exact {K} nearest of {Xq.shape[0]} queries among {live['id'].size:,} live items")
        truth_ids = live["id"][knn_search(Xq, np.asarray(live["features"], np.float64), K)]
        states, draws = {}, {}
        say("state delta: measured")
        states["delta"] = measure(pm.name, cfg, Xq, truth_ids, draws, say)
        say("state merged: the merge")
        out["merge_s"] = _merge(pm.name)
        states["merged"] = measure(pm.name, cfg, Xq, truth_ids, draws, say)
        say("state full: a new embedding job on the final data")
        t = time.perf_counter()
        db.run_embedding_job(pm.name, {"n_components": 16}, cfg.seed, embed_fn=anchor_frame_embed_fn)
        out["full_job_s"] = round(time.perf_counter() - t, 1)
        states["full"] = measure(pm.name, cfg, Xq, truth_ids, draws, say)
        out["compare"] = summarise(states, cfg)
        out["states"] = states
    finally:
        pm.close()
    out["seconds_total"] = round(time.perf_counter() - t_start, 1)
    return out


def _as_writes(cfg: RecallConfig):
    """``bench writes``' configuration of the same collection (its ``--reuse`` tag)."""
    return WritesConfig(items=cfg.items, dim=cfg.dim, anchors=cfg.anchors, seed=cfg.seed, path="attached", reuse=True)


def _merge(name: str) -> float:
    t = time.perf_counter()
    db.merge(name, embed_fn=anchor_frame_embed_fn, embed_fn_extend=anchor_frame_extend_fn)
    return round(time.perf_counter() - t, 1)


def apply_changes(pm: PmVectorTarget, ops: list, batch: int, say) -> dict[str, Any]:
    """``ops`` committed to the attached table ``batch`` a transaction, each applied by a sync."""
    t0 = time.perf_counter()
    sync_s, applied = 0.0, 0
    with db.connect() as conn:
        for j in range(0, len(ops), batch):
            pm.apply(conn, ops[j:j + batch])
            t = time.perf_counter()
            applied += db.sync(pm.name)["applied"]
            sync_s += time.perf_counter() - t
            if (j // batch) % 10 == 9 or j + batch >= len(ops):
                say(f"changes: {min(j + batch, len(ops)):,} of {len(ops):,} applied ({time.perf_counter() - t0:.0f} s)")
    kinds = {k: sum(1 for c in ops if c.kind == k) for k in ("insert", "update", "delete")}
    return {"changes": len(ops), "applied": applied, "by_kind": kinds, "batch": batch,
            "seconds": round(time.perf_counter() - t0, 1), "sync_s": round(sync_s, 1)}
