"""The erasure benchmark: delete a share of a collection in one call, then check exhaustively that
no published list and no answer holds a deleted id.

``python -m pm_vector.bench.erase_bench --items 100000 --dim 128 --fraction 0.01 [--shards-ok]``

Data: :func:`pm_vector.bench.latency.clustered` (the ``bench scale`` generator), 10 classes; the
items, 1,000 public anchors and the held-out queries are one draw of the same clusters; the default
job (AnchorFrame, 16 components). Then:

* ``delete_s``: one :func:`pm_vector.db.delete_items` call deleting ``fraction`` of the items
  (chosen at random);
* ``tables_before_merge``: deleted ids found in each table of the active run (items, codes, prior
  rows and their ``nbrs``, neighbour pairs, hub counts, every cell row at every level) while they are
  tombstones (:mod:`pm_vector.db.runs.delta`: in no answer, their rows purged by the next merge);
  ``merge_s``: :func:`pm_vector.db.merge` (run after the answers below are checked), and ``tables``:
  the same count in the merged run -- all must be 0;
* ``answers``: cell requests for EVERY (level, cell) of every class at eps 1, 4, 16 and inf
  (noise-free), k' = 1000, and class-rows requests of random items at eps 1, 4, 16: deleted ids
  found (must be 0) and answers with fewer than k' candidates in a row of a class that has k'
  items (a class-rows answer drops a tombstoned candidate without a refill until the merge);
* ``location``: location requests (the default release) for EVERY (level, cell) at eps 1, 4, 16
  and inf, each with the plan's candidates and code width: deleted ids found (must be 0) and
  answers shorter than ``min(S, N - deleted)`` (must be 0); ``tables`` counts the location rows;
* ``graph_recall``: the share of the 16 exact nearest remaining items of 1,000 random remaining
  items that their stored lists hold, after the erasure;
* ``nn_recall``: nn_recall@8 of the default release (location report, the answer's codes
  re-ranked) on ``n_queries`` held-out queries at eps 1, 4, 16 and inf, after the erasure and on a
  collection of the remaining items only given a full job (same anchors, same seed: the same
  public cells and codebooks, so each query draws the same report in both), side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid

import numpy as np
from psycopg import sql

from ..db.run_tables import run_table

import pm_vector.db as db
from ..client.location import PrivateLocationKNN
from ..client.query import PrivateKNN
from ..client.rerank import rank
from ..db.resolve.resolution import class_frames, public_anchor, resolve
from ..db.runs.jobs import anchor_frame_embed_fn
from ..manifold.public_cells import PublicCells
from ..neighbors import knn_search
from ..privacy import secure_generator
from ..protocol.cell_request import CellRequest
from ..protocol.location import LocationRequest
from ..protocol.published_codes import row_codes, unpack
from .latency import N_FINE, clustered


def _table_hits(conn, rid: int, gone: list[int]) -> dict[str, int]:
    q = {
        "items": "SELECT count(*) FROM {} WHERE item_id = ANY(%(g)s::bigint[])",
        "codes": "SELECT count(*) FROM {} WHERE item_id = ANY(%(g)s::bigint[])",
        "prior": "SELECT count(*) FROM {} WHERE item_id = ANY(%(g)s::bigint[]) OR nbrs && %(g)s::bigint[]",
        "neighbors": "SELECT count(*) FROM {} WHERE item_id = ANY(%(g)s::bigint[]) OR neighbor_id = ANY(%(g)s::bigint[])",
        "hubs": "SELECT count(*) FROM {} WHERE item_id = ANY(%(g)s::bigint[])",
        "cells": "SELECT count(*) FROM {} WHERE item_ids && %(g)s::bigint[]",
        "locations": "SELECT count(*) FROM {} WHERE item_ids && %(g)s::bigint[]",
    }
    return {k: int(conn.execute(sql.SQL(v).format(run_table(rid, k)), {"g": gone}).fetchone()[0]) for k, v in q.items()}


EPSILONS = (1.0, 4.0, 16.0, float("inf"))


def _location_client(name: str, eps: float, seed: int):
    _, info = public_anchor(name)
    pc = unpack(info["product_codes"], info["class_rows"]["codes"]["digest"])
    c = PrivateLocationKNN(PublicCells.from_dict(info["public_locations"]), eps,
                           n_items=int(info["class_rows"]["n_items"]), widths=pc.widths_, collection=name)
    return c._inject_generator(secure_generator(seed)), pc


def _location_sweep(name: str, gone: set[int], seed: int) -> dict:
    """Every (level, cell) at every eps of :data:`EPSILONS`: deleted ids and short answers."""
    hits = short = n = 0
    for eps in EPSILONS:
        c, _ = _location_client(name, eps, seed)
        p = c.plan_
        want = min(p.candidates, c.n_items)
        for K in c.cells.levels_:
            for r in range(int(K)):
                req = LocationRequest(report=r, level=int(K), epsilon=eps, locations_digest=c.digest,
                                      candidates=p.candidates, code_bytes=p.code_bytes, collection=name, seeded=True)
                ids = resolve(name, req, log=False)["item_ids"]
                n += 1
                hits += len(gone.intersection(int(i) for i in ids))
                short += len(ids) < want
    return {"requests": n, "deleted_ids_found": hits, "short_answers": short}


def _nn_recall(name: str, Xq: np.ndarray, truth: list[set[int]], seed: int, k: int = 8) -> dict[str, float]:
    """nn_recall@k of the default release: one seeded report per query, the answer re-ranked by its
    codes (``truth``: each query's exact k nearest ids in this collection)."""
    out = {}
    for eps in EPSILONS:
        c, pc = _location_client(name, eps, seed)
        rec = []
        for q, want in zip(Xq, truth):
            res = resolve(name, c.request(q), log=False)
            ids = np.asarray(res["item_ids"], np.int64)
            codes = row_codes(res["codes_data"], ids.size, c.plan_.code_bytes)
            qn = q / max(float(np.linalg.norm(q)), 1e-12)
            order, _ = rank(qn, codes=codes, product_codes=pc)
            rec.append(len(want & set(ids[order[:k]].tolist())) / k)
        out[str(eps)] = round(float(np.mean(rec)), 4)
    return out


def _answers_after(out: dict, name: str, X, y, Xd, yd, keep, gset: set, classes: int, n_row_requests: int,
                   seed: int, rng) -> None:
    """After the delete: every cell request of every level and report, and ``n_row_requests``
    class-rows requests per epsilon; records how many deleted ids came back and how many rows were
    short (``out["cell_requests"]``, ``out["answers"]``)."""
    cells = PublicCells.from_dict(public_anchor(name)[1]["public_cells"])
    sizes = np.bincount(y[keep], minlength=classes)
    hits = short = n_req = 0
    for eps in (1.0, 4.0, 16.0, float("inf")):
        for K in cells.levels_:
            for r in range(int(K)):
                req = CellRequest(reports=[r] * len(cells.classes_), n_cells=int(K), epsilon=eps,
                                  cells_digest=cells.digest(), shortlist=1000, collection=name)
                rows = resolve(name, req, log=False)["rows"]
                n_req += 1
                for c, row in zip(cells.classes_, rows):
                    hits += len(gset.intersection(row["item_ids"]))
                    short += len(row["item_ids"]) < min(1000, int(sizes[int(c)]))
    out["cell_requests"] = n_req
    frames = class_frames(name)
    for eps in (1.0, 4.0, 16.0):
        c = PrivateKNN(frames, Xd.astype(np.float64), yd, epsilon=eps, shortlist=1000,
                       collection=name)._inject_generator(secure_generator(seed))
        for i in rng.choice(np.flatnonzero(keep), n_row_requests, replace=False):
            rows = resolve(name, c.request(X[i].astype(np.float64), int(y[i]))[0], log=False)["rows"]
            n_req += 1
            for row in rows:
                hits += len(gset.intersection(row["item_ids"]))
                short += len(row["item_ids"]) < 1000
    out["answers"] = {"requests": n_req, "deleted_ids_found": hits, "short_rows": short}


def _graph_recall(rid: int, ids, X, rem, rng) -> float:
    """The run's stored neighbour lists against the exact 16 nearest remaining items, on 1,000
    sampled remaining items: the mean recall."""
    sample = rng.choice(rem, 1000, replace=False)
    exact = knn_search(X[sample], X[rem], 17)
    with db.connect() as conn:
        stored = dict(conn.execute(sql.SQL("SELECT item_id, nbrs FROM {} WHERE item_id = ANY(%s)").format(
            run_table(rid, "prior")), [ids[sample].tolist()]).fetchall())
    rec = []
    for s, row in zip(sample, exact):
        want = set([int(i) for i in ids[rem[row]] if int(i) != int(ids[s])][:16])
        rec.append(len(want & set(stored[int(ids[s])])) / len(want))
    return round(float(np.mean(rec)), 4)


def _fresh_job(out: dict, fresh_name: str, dim: int, classes: int, X, y, Xa, ya, Xq, exact, seed: int) -> None:
    """A full job on the remaining items only, in a new collection: its nn_recall, and the
    difference from the erased run's (``out["nn_recall"]``)."""
    db.create_collection(fresh_name, dim, list(range(classes)), keep_previous_runs=0)
    ids2 = np.asarray(db.ingest(fresh_name, X, y, batch_size=50_000)["item_ids"])
    db.register_anchor_set(fresh_name, Xa, ya)
    db.register_anchor_set(fresh_name, Xa[:300], ya[:300], role="dummy")
    t = time.perf_counter()
    db.run_embedding_job(fresh_name, {"n_components": 16}, seed, embed_fn=anchor_frame_embed_fn)
    out["fresh_job_s"] = round(time.perf_counter() - t, 1)
    out["nn_recall"]["fresh_job"] = _nn_recall(fresh_name, Xq, [set(ids2[r].tolist()) for r in exact], seed)
    a, b = out["nn_recall"]["after_delete"], out["nn_recall"]["fresh_job"]
    out["nn_recall"]["difference"] = {e: round(a[e] - b[e], 4) for e in a}


def run(items: int = 100_000, dim: int = 128, fraction: float = 0.01, seed: int = 0, n_row_requests: int = 30,
        n_queries: int = 300, fresh: bool = True, say=lambda m: None) -> dict:
    name = f"bench_erase_{uuid.uuid4().hex[:8]}"
    fresh_name = name + "_fresh"
    classes = 10
    out: dict = {"items": items, "dim": dim, "fraction": fraction}
    try:
        db.create_collection(name, dim, list(range(classes)), keep_previous_runs=0)
        # one population: the items, the public anchor and the held-out queries are drawn from the
        # same clusters (an anchor or queries of other clusters would measure nothing)
        XX, yy = clustered(items + 1000 + n_queries, dim, N_FINE, seed=seed + 2)
        yy = yy // (N_FINE // classes)
        X, y = XX[:items], yy[:items]
        Xa, ya = XX[items:items + 1000], yy[items:items + 1000]
        Xq = XX[items + 1000:]
        ids = np.asarray(db.ingest(name, X, y, batch_size=50_000)["item_ids"])
        db.register_anchor_set(name, Xa, ya)
        db.register_anchor_set(name, Xa[:300], ya[:300], role="dummy")
        say("job")
        t = time.perf_counter()
        rid = db.run_embedding_job(name, {"n_components": 16}, seed, embed_fn=anchor_frame_embed_fn)["run_id"]
        out["job_s"] = round(time.perf_counter() - t, 1)
        rng = np.random.default_rng(seed + 3)
        gone = np.sort(rng.choice(ids, int(round(fraction * items)), replace=False))
        say(f"delete {gone.size}")
        t = time.perf_counter()
        res = db.delete_items(name, item_ids=gone.tolist())
        out["delete_s"] = round(time.perf_counter() - t, 2)
        out["deleted"] = res["deleted"]
        gl = gone.tolist()
        gset = set(gl)
        with db.connect() as conn:  # tombstoned: in no answer, their rows still in the run's tables until the merge
            out["tables_before_merge"] = _table_hits(conn, rid, gl)
            out["table_sizes"] = {"cells_rows": conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                run_table(rid, "cells"))).fetchone()[0]}
        say("answers")
        keep = ~np.isin(ids, gone)
        _answers_after(out, name, X, y, Xa[:300], ya[:300], keep, gset, classes, n_row_requests, seed, rng)
        say("graph recall")
        rem = np.flatnonzero(keep)
        out["graph_recall_after"] = _graph_recall(rid, ids, X, rem, rng)
        say("location answers at every level and cell")
        out["location"] = _location_sweep(name, gset, seed)
        say("nn_recall after the erasure")
        exact = knn_search(Xq, X[rem], 8)
        out["nn_recall"] = {"after_delete": _nn_recall(name, Xq, [set(ids[rem[r]].tolist()) for r in exact], seed)}
        say("merge")
        t = time.perf_counter()
        merged = db.merge(name)
        out["merge_s"] = round(time.perf_counter() - t, 1)
        with db.connect() as conn:  # the merged run: the deleted items' rows are gone from every derived table
            out["tables"] = _table_hits(conn, int(merged["run_id"]), gl)
        if fresh:
            say("a full job on the remaining items only")
            _fresh_job(out, fresh_name, dim, classes, X[rem], y[rem], Xa, ya, Xq, exact, seed)
    finally:
        db.drop_collection(name, missing_ok=True)
        db.drop_collection(fresh_name, missing_ok=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--fraction", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--queries", type=int, default=300, help="held-out queries of the nn_recall comparison")
    ap.add_argument("--no-fresh", action="store_true", help="skip the full job on the remaining items")
    a = ap.parse_args()
    print(json.dumps(run(a.items, a.dim, a.fraction, a.seed, n_queries=a.queries, fresh=not a.no_fresh,
                         say=lambda m: print(m, file=sys.stderr, flush=True))))


if __name__ == "__main__":
    main()
