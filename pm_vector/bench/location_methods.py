"""`bench privacy`'s location-release method: ``pm_vector_location`` (the default release: one report
of the query's public cell over the whole collection, by M-ary randomized response; the plan --
level, candidates, code width -- by the public rule for eps, N and the byte budget).

Each query's request is built by the real client (:class:`~pm_vector.client.location.PrivateLocationKNN`,
seeded: a benchmark, not a release), answered by the server's ranking
(:func:`pm_vector.shortlist.location_list` on the rows :func:`pm_vector.db.runs.locations.build`
computes, the same rows the embedding job stores) and re-ranked by the published codes' prefix.
Every row also has ``expected_nn_recall_at_k``: the exact expectation over the release's randomness
(every possible report weighted by its exact probability), which is what the headline figures quote,
and ``expected_nn_recall_at_k_raw_rerank``: the same answers re-ranked by raw features instead of
the codes (collections of up to :data:`RAW_RERANK_MAX_ITEMS` items; else None): the gap between the
two is what the codes cost, the rest what the location and the list cost.
"""

from __future__ import annotations

import math

import numpy as np

from ..client.location import PrivateLocationKNN
from ..privacy import secure_generator
from .metrics import wire_bytes
from ..db.runs.locations import build
from ..neighbors import neighbor_graph
from ..privacy.location import location_weight
from ..shortlist import CELL_GRAPH_DEGREE, location_list


def location_state(ctx):
    """``(LocationsData, ProductCodes, codes)`` of the benchmark's split (cached on ``ctx``)."""
    def fit():
        graph = neighbor_graph(ctx.Xs, CELL_GRAPH_DEGREE)
        return build(ctx.Xa, ctx.Xs, np.arange(len(ctx.Xs)), neighbors=graph)

    data = ctx.get("location rows", fit)
    pc, codes = ctx.codes
    return data, pc, codes


def answer_table(ctx, M: int, eps: float, S: int) -> list[np.ndarray]:
    """The server's answer to every report at level M (positions): a location answer is a public
    function of the report (cached on ``ctx``)."""
    data, _, _ = location_state(ctx)

    def build():
        w = location_weight(eps)
        top_ids, _, top_h = data.row(0, 0)
        return [location_list(*data.row(M, r), top_ids, top_h, w, S)[0] for r in range(M)]

    return ctx.get(f"location answers {M} {eps} {S}", build)


def code_ranks(pc, codes, Xq, block: int = 256) -> np.ndarray:
    """``(q, N)`` int32: the rank of each of ``N`` coded items (``codes``: ``(N, b)`` uint8, one
    published width) by the client's asymmetric distance to each query of ``Xq`` (the order
    :func:`pm_vector.client.rerank.rank` gives a list of them; queries in blocks of ``block``)."""
    codes = np.asarray(codes, np.uint8)
    rec = pc.decode(codes)
    R = pc.rotate(np.asarray(Xq, np.float64), codes.shape[1])
    sq = (rec * rec).sum(1)[None, :]
    out = np.empty((R.shape[0], rec.shape[0]), np.int32)
    for a in range(0, R.shape[0], block):
        d = -2.0 * R[a:a + block] @ rec.T + sq
        out[a:a + block] = np.argsort(np.argsort(d, axis=1, kind="stable"), axis=1)
    return out


def _ranks(ctx, width: int) -> np.ndarray:
    """``(q, N)`` int32: every item's rank by asymmetric distance to each query at ``width`` bytes."""
    def build():
        _, pc, codes = location_state(ctx)
        return code_ranks(pc, pc.select(codes, width), ctx.Xq)

    return ctx.get(f"code ranks {width}", build)


#: the raw-feature re-rank of the same lists (what the codes cost) is computed up to this many items
RAW_RERANK_MAX_ITEMS = 200_000


def _raw_ranks(ctx) -> np.ndarray:
    """``(q, N)`` int32: every item's rank by exact distance to each query (raw features)."""
    def build():
        Q = np.asarray(ctx.Xq, np.float64)
        X = np.asarray(ctx.Xs, np.float64)
        d = -2.0 * Q @ X.T + (X * X).sum(1)[None, :]
        return np.argsort(np.argsort(d, axis=1, kind="stable"), axis=1).astype(np.int32)

    return ctx.get("raw ranks", build)


def _hits(lists: list[np.ndarray], ranks: np.ndarray, truth: np.ndarray, k: int) -> np.ndarray:
    """``(M, q)``: for every list and query, the share of the true k nearest among the list's top k by
    code rank (``truth``: positions, -1 for a true neighbour that is in no list). Only the queries
    with a true neighbour in a list are ranked in it (the others hold 0)."""
    q, N = ranks.shape
    tm = np.zeros((q, N + 1), bool)  # (column N: a true neighbour in no list)
    tm[np.arange(q)[:, None], np.where(truth < 0, N, truth)] = True
    out = np.zeros((len(lists), q))
    for r, L in enumerate(lists):
        if L.size == 0:
            continue
        rows = np.flatnonzero(tm[:, L].any(1))
        if rows.size == 0:
            continue
        kk = min(k, L.size)
        P = ranks[rows][:, L]
        top = np.argpartition(P, kk - 1, axis=1)[:, :kk]
        out[r, rows] = tm[rows[:, None], L[top]].sum(1) / k
    return out


def expected_recall(lists: list[np.ndarray], ranks: np.ndarray, truth: np.ndarray, true_cell: np.ndarray,
                    p: float, q: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(expected (q,), hits (M, q))``: each query's nn_recall@k expected over the release's law
    (report its true cell with probability ``p``, each other cell with ``q``: every answer ``lists[r]``
    weighted by the exact probability of its report), and every list's recall of every query."""
    hits = _hits(lists, ranks, truth, k)
    idx = np.arange(ranks.shape[0])
    own = hits[true_cell, idx]
    return p * own + q * (hits.sum(0) - own), hits


def run_location(ctx, eps: float, max_bytes: int, seed: int):
    """``(candidates list, retrieved (q, k), request bytes, answer bytes, extra)`` of the location
    release at ``eps`` under ``max_bytes`` per request."""
    data, pc, codes = location_state(ctx)
    k = int(ctx.cfg.k)
    client = PrivateLocationKNN(data.cells, eps, n_items=len(ctx.Xs), max_bytes=int(max_bytes),
                                widths=pc.widths_)
    client._inject_generator(secure_generator(seed))
    p = client.plan_
    lists = answer_table(ctx, p.level, eps, p.candidates)
    ranks = _ranks(ctx, p.code_bytes)
    true_cell = data.cells.assign(ctx.Xq, 0, p.level)
    pr, qr = client.mechanism.p_, client.mechanism.q_
    per_query, hits = expected_recall(lists, ranks, ctx.true_idx, true_cell, pr, qr, k)
    expected = float(np.mean(per_query))
    idx = np.arange(len(ctx.Xq))
    raw_expected = None
    if len(ctx.Xs) <= RAW_RERANK_MAX_ITEMS:  # the same answers re-ranked by raw features: what the codes cost
        raw_expected = float(np.mean(expected_recall(lists, _raw_ranks(ctx), ctx.true_idx, true_cell, pr, qr, k)[0]))
    retrieved, cands, req_bytes = [], [], 0
    for i, x in enumerate(ctx.Xq):
        req = client.request(x)
        L = lists[req.report]
        order = np.argsort(ranks[i, L], kind="stable")[:k]
        retrieved.append(np.pad(L[order], (0, k - order.size), constant_values=L[0] if L.size else 0))
        cands.append(L)
        req_bytes += wire_bytes(req.to_dict())
    S = int(max(len(L) for L in lists))
    answer = {"release": "location", "level": p.level, "report": 0, "run_id": 1, "candidates": p.candidates,
              "item_ids": np.zeros(S, np.uint32), "codes_data": bytes(S * p.code_bytes),
              "codes": {"bytes": p.code_bytes, "digest": pc.digest()}}
    extra = {"release": "location", "level": p.level, "candidates": p.candidates, "code_bytes": p.code_bytes,
             "max_bytes": int(max_bytes), f"expected_nn_recall_at_{k}": expected,
             "true_cell_nn_recall": float(np.mean(hits[true_cell, idx])),
             f"expected_nn_recall_at_{k}_raw_rerank": raw_expected}
    if not math.isinf(eps):
        extra["rr_p"] = round(pr, 6)
    return cands, np.stack(retrieved), req_bytes / len(ctx.Xq), float(wire_bytes(answer)), extra
