"""`pm-vector bench latency`: what a private query costs against plain pgvector k-NN.

On the database (the embedded server by default) the benchmark builds, for every request
size C in ``rows``, a temporary collection of ``items`` server items with ``anchors`` public
anchors, runs the server's embedding job, and measures, over ``repeats`` queries:

(a) ``client``: the client's PrivateMail step (dummies, private first iteration, release,
    post-processing) -- :meth:`pm_vector.client.PrivateMail.request`;
(b) ``resolve``: the server's resolution of one request, as received (JSON text):
    parse, checks, Kabsch-Umeyama alignment, the C query rows answered by ONE statement
    (``pm_knn_batch`` joined with the items' payloads), and the request-log row, committed --
    :func:`pm_vector.db.resolve.resolution.resolve` on a kept connection, as a server would;
(b') ``pm_vector``: the default protocol -- the client's request (one noised row per class,
    :class:`pm_vector.client.query.PrivateKNN`, built from the published class frames) and its
    resolve: every row's retained prior from ONE pgvector k-NN statement, ranked on the run's
    graph (:mod:`pm_vector.db.resolve.run_graph`), the ``k'`` = ``shortlist`` candidates of every row
    with their items from ONE statement, and the request log;
(c) ``plain``: the same number C of plain pgvector k-NN queries on the *raw* features, one
    statement each (prepared), through an HNSW index on the raw features that the
    benchmark creates (a table ``pm_vector.bench_raw_<id>`` with id, external id, label,
    payload and ``vector(d)`` features; default HNSW options, ``ef_search`` 40 as pm_knn_batch).

(c') ``plain_kprime``: the same C plain queries returning ``k'`` items each (``ef_search`` k'),
    as many items as a pm_vector answer carries.

(b'') ``cells`` (with ``release="cells"`` or ``"both"``, the default: the cell release is the
    default release below eps 512): the cell release -- the client's
    request (one reported public cell per class, :class:`pm_vector.client.cell_client.PrivateCellKNN`
    on the published cells, K by the public rule for eps) and its resolve: the ``k'`` candidates
    of every row ranked and joined with their items by ONE statement
    (:mod:`pm_vector.db.resolve.cell_resolution`), and the request log. ``release="cells"`` skips (b').

The pm_vector answers (b') and (b'') are the default **compact** answer (``answer="compact"``:
ids and code prefixes, ``k'`` and the prefix by the public rule
:func:`~pm_vector.manifold.codes.compact_answer_shape` of each release: 130 x 32 B for the cell
release and 69 x 64 B for the Gaussian at C = 10), or with ``answer="full"`` ``k'`` =
``shortlist`` with external ids, labels and payloads.

``setup.shared_buffers`` is the database's buffer cache (the embedded server's: a quarter of the
machine's memory within [128 MB, 4 GB]): at 10^6 items it decides whether the candidates' pages
are still in it once the plain queries have passed.

``ratio = resolve_p50 / plain_p50`` (and ``pm_vector.ratio`` for (b'), ``pm_vector.ratio_kprime``
against (c')). Everything the benchmark creates is dropped at the end.

Data: ``synthetic`` (default) -- unit-norm Gaussian clusters in ``dim`` dimensions, 100 fine
classes (C = 100 uses them; C = 10 merges them ten by ten, so both collections hold the same
features and share one raw-feature index); or ``fashion-mnist`` (784 pixels, 10 classes, at
most 70,000 images, so only C = 10).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
from psycopg import sql

from ..errors import InvalidInputError
from ..shortlist import MAX_PRIOR
from .latency_clients import TIMED, Requests, client_requests
import pm_vector.db as db
from ..datasets import Dataset, load_dataset, split_dataset
from ..db.resolve import run_graph as _run_graph
from ..db.resolve.resolution import client_frame, public_anchor, resolve
from ..db.runs.jobs import anchor_frame_embed_fn, index_build_mem_mb

N_FINE = 100


@dataclass
class LatencyConfig:
    items: int = 100_000
    anchors: int = 1000
    rows: tuple = (10, 100)
    data: str = "synthetic"
    dim: int = 128
    k: int = 8
    repeats: int = 50
    warmup: int = 5
    epsilon: float = 1.0
    delta: float = 1e-5
    n_components: int = 16  # AnchorFrame's default
    shortlist: int = 128
    graph_degree: int = 16
    max_prior: int = MAX_PRIOR
    seed: int = 0
    release: str = "all"  # which pm_vector release(s) to time: location (the default release), cells, gaussian,
    # both (cells and gaussian) or all
    # the pm_vector answers timed: "compact" (the default answer: ids and code prefixes, k' and the
    # prefix by the public rule compact_answer_shape per release) or "full" (k' = shortlist, with
    # external ids, labels and payloads)
    answer: str = "compact"


def clustered(n: int, dim: int, n_classes: int = N_FINE, *, spread: float = 0.9, seed: int = 0):
    """``n`` unit-norm rows in ``n_classes`` Gaussian clusters (labels balanced), float32."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((n_classes, dim))
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    y = np.arange(n) % n_classes
    rng.shuffle(y)
    X = np.empty((n, dim), dtype=np.float32)
    for s in range(0, n, 100_000):  # in chunks: no float64 copy of the whole matrix
        e = min(n, s + 100_000)
        blk = centers[y[s:e]] + spread * rng.standard_normal((e - s, dim)) / np.sqrt(dim)
        X[s:e] = blk / np.linalg.norm(blk, axis=1, keepdims=True)
    return X, y.astype(np.int64)


def pct(v, q) -> float:
    return float(np.percentile(np.asarray(v, dtype=np.float64), q))


def split_data(cfg: LatencyConfig, n_query: int):
    """(dataset, split) with the query, anchor and dummy parts disjoint from the items."""
    n_dummy = max(4 * N_FINE, 200)
    if cfg.data == "synthetic":
        total = cfg.items + cfg.anchors + n_dummy + n_query
        X, y = clustered(total, cfg.dim, N_FINE, seed=cfg.seed)
        ds = Dataset("synthetic", X, y)
    elif cfg.data == "fashion-mnist":
        ds = load_dataset("fashion-mnist")
        avail = ds.n_items - cfg.anchors - n_dummy - n_query
        if cfg.items > avail:
            raise InvalidInputError(f"Fashion-MNIST has {ds.n_items} images: at most --items {avail} with "
                                    f"{cfg.anchors} anchors, {n_dummy} dummies and {n_query} queries.")
    else:
        raise InvalidInputError(f"--data must be synthetic or fashion-mnist, got {cfg.data!r}.")
    return ds, split_dataset(ds, cfg.items, cfg.anchors, n_dummy, n_query, seed=cfg.seed)


class _CountingConn:
    """A connection proxy counting the statements that run the batched k-NN."""

    def __init__(self, conn):
        self._conn = conn
        self.knn_statements = 0
        self.shortlist_statements = 0
        self.prior_knn_statements = 0
        self.cell_statements = 0
        self.statements = 0

    def execute(self, query, *a, **kw):
        self.statements += 1
        if "pm_knn_batch" in str(query):
            self.knn_statements += 1
        if "pm_cell_shortlist" in str(query):  # the cell release's one statement (ranking and items)
            self.cell_statements += 1
        elif "WHERE it.id = s.item_id" in str(query):  # the rows' candidates with their items
            self.shortlist_statements += 1
        if "coords <->" in str(query):  # the rows' prior k-NN
            self.prior_knn_statements += 1
        return self._conn.execute(query, *a, **kw)

    def __getattr__(self, name):
        return getattr(self._conn, name)

    @property
    def autocommit(self) -> bool:
        return self._conn.autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        self._conn.autocommit = value


def _labels_for(rows: int, y_fine: np.ndarray, n_classes: int) -> np.ndarray:
    if rows == n_classes:
        return y_fine
    if n_classes % rows == 0:
        return y_fine // (n_classes // rows)
    raise InvalidInputError(f"a request has one row per class: C = {rows} needs a collection of {rows} classes; "
                            f"the data has {n_classes} (C must divide it).")


def _check_config(cfg: LatencyConfig) -> None:
    """Refuse a configuration the benchmark cannot run, before anything is built."""
    if cfg.items < 1 or cfg.anchors < 2 or cfg.repeats < 1 or not cfg.rows:
        raise InvalidInputError("items, repeats must be >= 1, anchors >= 2, and rows non-empty.")
    if cfg.release not in TIMED:
        raise InvalidInputError(f"release must be location, gaussian, cells, both or all, got {cfg.release!r}.")
    if cfg.answer not in ("compact", "full"):
        raise InvalidInputError(f"answer must be compact or full, got {cfg.answer!r}.")


def build_collection(db, name: str, C: int, d: int, split, n_classes: int, cfg: LatencyConfig) -> float:
    """Create the C-class collection ``name`` with the items, anchors and dummies; returns the seconds taken."""
    Xs, ys = split.server
    Xa, ya = split.anchor
    Xd, yd = split.dummy
    labels = np.arange(C)
    t = time.perf_counter()
    db.create_collection(name, d, labels.tolist(), settings={"class_rows": {
        "graph_degree": int(cfg.graph_degree), "max_prior": int(cfg.max_prior)}})
    db.ingest(name, Xs, _labels_for(C, ys, n_classes), external_ids=[f"s{i}" for i in range(len(ys))],
              payloads=[{"i": i} for i in range(len(ys))], batch_size=50_000)
    db.register_anchor_set(name, Xa, _labels_for(C, ya, n_classes))
    db.register_anchor_set(name, Xd, _labels_for(C, yd, n_classes), role="dummy")
    return time.perf_counter() - t


def _build_raw_index(db, conn, ident, name: str, d: int, n_items: int, q0: np.ndarray, k: int,
                     setup: dict) -> tuple[str, bool]:
    """(c)'s table: the items' raw features copied out of ``name`` with an HNSW index, as a plain
    pgvector user has them. Records the copy and index times in ``setup``; returns the plain k-NN
    statement and whether its plan uses the index."""
    t = time.perf_counter()
    cid = db.collection_info(name)["id"]
    conn.execute(sql.SQL("CREATE TABLE {} AS SELECT id, external_id, label, payload, features::vector({}) "
                         "AS features FROM pm_vector.items WHERE collection_id = {}").format(
        ident, sql.Literal(d), sql.Literal(cid)))
    conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(ident))
    setup["raw_copy_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    # room for the 1,000,000-item graph (a fixed 1 GB did not hold it: the build went on on disk)
    conn.execute("SELECT set_config('maintenance_work_mem', %s, false)", [f"{int(index_build_mem_mb(n_items, d))}MB"])
    conn.execute(sql.SQL("CREATE INDEX ON {} USING hnsw (features vector_l2_ops)").format(ident))
    conn.execute(sql.SQL("ANALYZE {}").format(ident))
    setup["raw_index_s"] = round(time.perf_counter() - t, 3)
    plain = sql.SQL("SELECT id, external_id, label, payload, features <-> %s AS distance FROM {} "
                    "ORDER BY features <-> %s LIMIT %s").format(ident)
    plan = "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN {}").format(plain), [q0, q0, k]).fetchall())
    return plain.as_string(conn), "Index Scan using" in plan and "Order By: (features <-> " in plan


def _resolve_vs_plain(db, cfg: LatencyConfig, name: str, C: int, conn, plain_sql: str, r: Requests,
                      Xq: np.ndarray, yq_c: np.ndarray, n_query: int) -> dict[str, Any]:
    """The timed loop: every request resolved on a kept connection, interleaved with the C plain
    queries (k items, then k' items), so that both see the same machine load. Returns the times
    and resolve parts after the warm-up, the hits and the statements counted per request."""
    shape = r.shape
    rconn = _CountingConn(db.connect())
    kconn = db.connect(autocommit=True)  # (c'): ef_search k', so that the index returns k' rows
    kconn.execute("SELECT set_config('hnsw.ef_search', %s, false)", [str(max(40, int(cfg.shortlist)))])
    resolve_ms, parts, plain_ms, hits, pmv_ms, pmv_parts, plain_kp_ms = [], [], [], [], [], [], []
    cell_ms, cell_parts, loc_ms, loc_parts, loc_miss_ms = [], [], [], [], []
    try:
        # interleaved, so that both see the same machine load
        for i in range(n_query):
            t = time.perf_counter()
            res = resolve(name, r.reqs[i], k=cfg.k, conn=rconn)
            dt_res = (time.perf_counter() - t) * 1e3
            real = r.secrets[i].pick(res["rows"])
            t = time.perf_counter()
            for j in range(C):  # C plain queries: the real query and C - 1 others, one statement each
                q = Xq[(i + j) % n_query]
                conn.execute(plain_sql, [q, q, cfg.k], prepare=True).fetchall()
            dt_plain = (time.perf_counter() - t) * 1e3
            t = time.perf_counter()
            for j in range(C):  # (c'): k' items each
                q = Xq[(i + j) % n_query]
                kconn.execute(plain_sql, [q, q, int(cfg.shortlist)], prepare=True).fetchall()
            if i >= cfg.warmup:
                plain_kp_ms.append((time.perf_counter() - t) * 1e3)
            if r.pmv is not None:
                t = time.perf_counter()
                pres = resolve(name, r.pmv_reqs[i], conn=rconn, code_bytes=shape["gaussian"][1],
                               compact=shape["gaussian"][1] is not None)
                if i >= cfg.warmup:
                    pmv_ms.append((time.perf_counter() - t) * 1e3)
                    pmv_parts.append(pres["timings_ms"])
            if r.loc_client is not None:
                t = time.perf_counter()
                lres = resolve(name, r.loc_reqs[i], conn=rconn)
                dt_loc = (time.perf_counter() - t) * 1e3
                if not lres["cached"]:
                    loc_miss_ms.append(dt_loc)
                if i >= cfg.warmup:
                    loc_ms.append(dt_loc)
                    loc_parts.append(lres["timings_ms"])
            if r.cells_client is not None:
                t = time.perf_counter()
                cres = resolve(name, r.cell_reqs[i], conn=rconn, code_bytes=shape["cells"][1],
                               compact=shape["cells"][1] is not None)
                if i >= cfg.warmup:
                    cell_ms.append((time.perf_counter() - t) * 1e3)
                    cell_parts.append(cres["timings_ms"])
            if i >= cfg.warmup:
                resolve_ms.append(dt_res)
                plain_ms.append(dt_plain)
                parts.append(res["timings_ms"])
                hits.append(np.mean(np.asarray(real["labels"]) == yq_c[i]))

        return {
            "resolve_ms": resolve_ms, "parts": parts, "plain_ms": plain_ms, "hits": hits,
            "pmv_ms": pmv_ms, "pmv_parts": pmv_parts, "plain_kp_ms": plain_kp_ms,
            "cell_ms": cell_ms, "cell_parts": cell_parts,
            "loc_ms": loc_ms, "loc_parts": loc_parts, "loc_miss_ms": loc_miss_ms,
            "run_graph_mb": _run_graph.cached_bytes() / 2**20,  # the run's graph this process holds
            "knn_per_request": rconn.knn_statements / n_query,
            "shortlist_per_request": rconn.shortlist_statements / n_query,
            "prior_knn_per_request": rconn.prior_knn_statements / n_query,
            "cell_statements_per_request": rconn.cell_statements / n_query,
        }
    finally:
        rconn.close()
        kconn.close()


def _parts_p50(parts: list[dict]) -> dict[str, float]:
    """The median of every resolve part (the keys of the first request's timings, but the total)."""
    return {kk: round(pct([p[kk] for p in parts if kk in p], 50), 3)
            for kk in (parts[0] if parts else {}) if kk != "total"}


def _summary(cfg: LatencyConfig, C: int, r: Requests, m: dict[str, Any], ingest_s: float,
             job: dict) -> dict[str, Any]:
    """One request size's result row: percentiles, ratios against plain pgvector, parts and setup."""
    shape = r.shape
    resolve_ms, plain_ms, plain_kp_ms = m["resolve_ms"], m["plain_ms"], m["plain_kp_ms"]
    pmv_ms, cell_ms, loc_ms, loc_miss_ms = m["pmv_ms"], m["cell_ms"], m["loc_ms"], m["loc_miss_ms"]
    loc_client = r.loc_client
    r_p50, p_p50 = pct(resolve_ms, 50), pct(plain_ms, 50)
    return {
        "rows": C, "client_p50_ms": round(pct(r.client_ms, 50), 3), "client_p95_ms": round(pct(r.client_ms, 95), 3),
        "resolve_p50_ms": round(r_p50, 3), "resolve_p95_ms": round(pct(resolve_ms, 95), 3),
        "plain_p50_ms": round(p_p50, 3), "plain_p95_ms": round(pct(plain_ms, 95), 3),
        "plain_kprime_p50_ms": round(pct(plain_kp_ms, 50), 3),
        "ratio": round(r_p50 / p_p50, 3),
        "resolve_parts_p50_ms": {kk: round(pct([p[kk] for p in m["parts"] if kk in p], 50), 3)
                                 for kk in m["parts"][0] if kk != "total"},
        "knn_statements_per_request": m["knn_per_request"],
        "precision_at_k": round(float(np.mean(m["hits"])), 4), "repeats": len(resolve_ms),
        "pm_vector": None if r.pmv is None else {
            "shortlist": shape["gaussian"][0], "answer": cfg.answer, "code_bytes": shape["gaussian"][1],
            "client_p50_ms": round(pct(r.pmv_client_ms, 50), 3),
            "resolve_p50_ms": round(pct(pmv_ms, 50), 3), "resolve_p95_ms": round(pct(pmv_ms, 95), 3),
            "ratio": round(pct(pmv_ms, 50) / p_p50, 3),
            "ratio_kprime": round(pct(pmv_ms, 50) / pct(plain_kp_ms, 50), 3), "max_prior": int(cfg.max_prior),
            "resolve_parts_p50_ms": _parts_p50(m["pmv_parts"]),
            "shortlist_statements_per_request": m["shortlist_per_request"],
            "run_graph_mb": round(m["run_graph_mb"], 1),
            "prior_knn_statements_per_request": m["prior_knn_per_request"]},
        "cells": None if r.cells_client is None else {
            "shortlist": shape["cells"][0], "answer": cfg.answer, "code_bytes": shape["cells"][1],
            "n_cells": int(r.cells_client.n_cells),
            "client_p50_ms": round(pct(r.cell_client_ms, 50), 3),
            "resolve_p50_ms": round(pct(cell_ms, 50), 3), "resolve_p95_ms": round(pct(cell_ms, 95), 3),
            "ratio": round(pct(cell_ms, 50) / p_p50, 3),
            "ratio_kprime": round(pct(cell_ms, 50) / pct(plain_kp_ms, 50), 3),
            "resolve_parts_p50_ms": _parts_p50(m["cell_parts"]),
            "statements_per_request": m["cell_statements_per_request"]},
        "location": None if loc_client is None else {
            "level": loc_client.plan_.level, "candidates": loc_client.plan_.candidates,
            "code_bytes": loc_client.plan_.code_bytes, "max_bytes": loc_client.plan_.max_bytes,
            "client_p50_ms": round(pct(r.loc_client_ms, 50), 3),
            "resolve_p50_ms": round(pct(loc_ms, 50), 3), "resolve_p95_ms": round(pct(loc_ms, 95), 3),
            # a report's first answer is built (then cached: a public function of the report)
            "answers_built": len(loc_miss_ms),
            "build_p50_ms": round(pct(loc_miss_ms, 50), 3) if loc_miss_ms else None,
            "ratio": round(pct(loc_ms, 50) / p_p50, 3),
            "resolve_parts_p50_ms": _parts_p50(m["loc_parts"])},
        "setup": {"ingest_s": round(ingest_s, 3), "job_s": job.get("duration"), "job_timings": job.get("timings")},
    }


def run(cfg: LatencyConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the JSON-able result (see the module doc)."""
    say = progress or (lambda _m: None)
    _check_config(cfg)
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    n_query = cfg.repeats + cfg.warmup
    say("data")
    ds, split = split_data(cfg, max(n_query, 2 * N_FINE))  # queries of every class, in random order
    n_classes = ds.n_classes
    for C in cfg.rows:
        _labels_for(int(C), ds.classes, n_classes)  # refuse impossible C before building anything
    Xs, ys = split.server
    Xa, _ = split.anchor
    Xq, yq = split.query
    pick = np.random.default_rng(cfg.seed + 11).permutation(len(yq))[:n_query]
    Xq, yq = Xq[pick], yq[pick]
    tag = uuid.uuid4().hex[:10]
    raw_table = f"bench_raw_{tag}"
    names: list[str] = []
    results = []
    setup: dict[str, float] = {}
    conn = None
    try:
        conn = db.connect(autocommit=True)
        setup["shared_buffers"] = conn.execute("SELECT current_setting('shared_buffers')").fetchone()[0]
        d = Xs.shape[1]
        ident = sql.Identifier("pm_vector", raw_table)
        plain_sql = None
        for C in cfg.rows:
            C = int(C)
            name = f"bench_latency_{tag}_c{C}"
            names.append(name)
            say(f"C={C}: collection")
            ingest_s = build_collection(db, name, C, d, split, n_classes, cfg)
            if plain_sql is None:
                say("raw-feature HNSW index")
                plain_sql, plain_uses_index = _build_raw_index(db, conn, ident, name, d, len(ys), Xq[0], cfg.k, setup)
            say(f"C={C}: embedding job")
            job = db.run_embedding_job(name, {"n_components": cfg.n_components}, cfg.seed,
                                       embed_fn=anchor_frame_embed_fn)
            pa, info = public_anchor(name)
            frame = client_frame(name, pa, info)
            yq_c = _labels_for(C, yq, n_classes)

            say(f"C={C}: client requests")
            reqs = client_requests(cfg, name, C, len(ys), pa, info, frame, Xq, yq_c, n_query)

            say(f"C={C}: resolve vs plain")
            measured = _resolve_vs_plain(db, cfg, name, C, conn, plain_sql, reqs, Xq, yq_c, n_query)
            results.append(_summary(cfg, C, reqs, measured, ingest_s, job))
            db.drop_collection(name, missing_ok=True)
    finally:
        for name in names:
            try:
                db.drop_collection(name, missing_ok=True)
            except Exception:  # noqa: BLE001 - best effort
                pass
        if conn is not None:
            try:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier("pm_vector", raw_table)))
            finally:
                conn.close()
    return {"items": int(Xs.shape[0]), "anchors": int(Xa.shape[0]), "dim": int(Xs.shape[1]), "data": cfg.data,
            "k": cfg.k, "epsilon": cfg.epsilon, "config": {**asdict(cfg), "rows": list(cfg.rows)},
            "plain_uses_hnsw_index": plain_uses_index, "setup": setup, "results": results,
            "load_average": {"before": [round(v, 2) for v in load_before],
                             "after": [round(v, 2) for v in os.getloadavg()]},
            "seconds": round(time.perf_counter() - t_start, 1)}
