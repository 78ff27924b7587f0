"""`bench privacy`'s cell-release methods: ``pm_vector_cells`` (the cell release, K by the public
rule) and ``download_lists`` (the zero-eps baseline: the public table of every (class, cell) answer,
downloaded once, looked up at the true cell).

A cell answer depends only on (class, reported cell), so the whole set of answers at level K is a
public table of C x K lists. A client that downloads it looks up its true cell at eps 0 and gets
the cell release's eps = inf figure at that K, for the table's bytes (the union of the listed items'
ids and features, plus C K k' ids, as msgpack), reusable for every later query. The benchmark puts both side by
side; the cell release is worth its eps where one request is much cheaper than the table.
"""

from __future__ import annotations

import math

import numpy as np

from .._validation import normalize_rows
from ..client.cell_client import PrivateCellKNN
from ..manifold.public_cells import PublicCells
from ..privacy import secure_generator
from ..privacy.cell_release import cell_level_for_epsilon, max_cells_for, rr_probabilities
from ..shortlist import CellShortlist
from .metrics import wire_bytes
from ..errors import InvalidInputError


def cell_state(ctx):
    """``(PublicCells, CellShortlist)`` of the benchmark's split (cached on ``ctx``)."""
    cells = ctx.get("public cells", lambda: PublicCells(levels=ctx.cfg.cell_levels, random_state=ctx.cfg.seed)
                    .fit(ctx.Xa, ctx.ya))
    sl = ctx.get("cell shortlist", lambda: CellShortlist(ctx.cfg.cell_graph_degree).fit(cells, ctx.Xs, ctx.ys))
    return cells, sl


def level_for(ctx, eps, shortlist: int | None = None) -> int:
    """The public rule's K at ``eps`` for ``shortlist`` candidates per row (default the configured k'), or
    the configured fixed level."""
    cells, _ = cell_state(ctx)
    fixed = ctx.cfg.n_cells
    if fixed is not None:
        if fixed not in cells.levels_:
            raise InvalidInputError(f"--cells {fixed} is not a usable level; the anchor allows {list(cells.levels_)}.")
        return int(fixed)
    max_cells = max_cells_for(len(ctx.ys), cells.classes_.size, int(shortlist or ctx.cfg.shortlist))
    return cell_level_for_epsilon(eps, cells.levels_, max_cells)


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    return np.lexsort((np.arange(scores.size), -scores))[:k]


def answer_table(ctx, K: int, eps, shortlist: int | None = None) -> np.ndarray:
    """``(C, K, k')``: the server's answer to every (class, report) at level K and ``eps`` -- a
    cell answer is a function of these two alone (cached on ``ctx``)."""
    cells, sl = cell_state(ctx)
    shortlist, C = int(shortlist or ctx.cfg.shortlist), cells.classes_.size

    def build():
        t = np.empty((C, K, shortlist), dtype=np.int64)
        for c in range(C):
            for r in range(K):
                t[c, r] = _top(sl.scores(c, K, r, eps), shortlist)
        return t
    return ctx.get(f"cell answers K={K} eps={eps:g} k'={shortlist}", build)


def expected_nn_recall(ctx, K: int, eps, located, true_idx, k: int) -> float:
    """The exact expectation of nn_recall@k over the release's randomness for these queries:
    ``sum_r T(a, r) recall(answer(c, r))`` (``located``: each query's ``(row, true cell a)``;
    ``T``: the RR law; the uniform dummy rows do not change the real row's answer)."""
    table = answer_table(ctx, K, eps)
    p, q = rr_probabilities(eps, K)
    Xs = np.asarray(ctx.Xs, dtype=np.float64)
    sq = (Xs * Xs).sum(1)
    total = 0.0
    for i, (c, a) in enumerate(located):
        lists = table[c]  # (K, k')
        x = np.asarray(ctx.Xq[i], dtype=np.float64)
        d = (sq - 2.0 * (Xs @ x))[lists]  # the squared distance up to |x|^2: the same order
        top = np.take_along_axis(lists, np.argsort(d, axis=1, kind="stable")[:, :k], axis=1)
        rec = np.isin(top, true_idx[i]).sum(1) / len(set(true_idx[i].tolist()))
        total += q * rec.sum() + (p - q) * rec[a]
    return total / len(located)


def run_cells(ctx, eps, labels, X, seed: int, classifier=None, row: str = "nearest", true_idx=None, k: int = 8,
              shortlist: int | None = None):
    """One cell request per query (real row scored; the others are uniform reports whose answers
    the client discards). ``row``: the client's row choice (:class:`PrivateCellKNN`); ``labels``:
    the queries' labels (``None``: ask ``classifier``). With ``true_idx`` the result also has the
    exact expected nn_recall@k over the release's randomness (with the configured k' only). The
    request's bytes are its msgpack document's (:func:`~pm_vector.bench.metrics.wire_bytes`)."""
    cells, _ = cell_state(ctx)
    shortlist, q = int(shortlist or ctx.cfg.shortlist), len(X)
    K = level_for(ctx, eps, shortlist)
    client = PrivateCellKNN(cells, eps, n_cells=K, shortlist=shortlist, classifier=classifier, row=row)
    client._inject_generator(secure_generator(seed))
    table = answer_table(ctx, K, eps, shortlist)  # the same answers as sl.scores per request (tests compare)
    cand = np.empty((q, shortlist), dtype=np.int64)
    json_bytes = wire = 0
    located = []
    for i in range(q):
        req, sec = client.request(X[i], None if labels is None else int(labels[i]))
        cand[i] = table[sec.real_row, req.reports[sec.real_row]]
        json_bytes += len(req.to_json())
        wire += wire_bytes(req.to_dict())
        located.append((sec.real_row, client.locate(normalize_rows(np.asarray(X[i], dtype=np.float64).reshape(1, -1)),
                                                None if labels is None else int(labels[i]))[1]))
    C = cells.classes_.size
    extra = {"release": "cells", "n_cells": K, "row": row, "request_json_bytes": round(json_bytes / q, 1)}
    if true_idx is not None and shortlist == ctx.cfg.shortlist:
        extra[f"expected_nn_recall_at_{k}"] = expected_nn_recall(ctx, K, eps, located, true_idx, k)
    if not math.isinf(eps):
        extra["rr_p"] = round(client.mechanism.p_, 6)
    return cand, wire / q, C, extra


def download_lists(ctx, K: int, dim: int):
    """``(candidates (q, k'), table bytes, extra)``: every query looks up its true cell's list in
    the public table of C x K lists (eps 0)."""
    cells, _ = cell_state(ctx)
    shortlist = ctx.cfg.shortlist
    C = cells.classes_.size
    table = answer_table(ctx, K, math.inf)
    # the client's lookup: its nearest public cell over every class, as the release's real row
    finder = PrivateCellKNN(cells, 1.0, n_cells=K)
    loc = [finder.nearest_cell(normalize_rows(np.asarray(x, dtype=np.float64).reshape(1, -1))) for x in ctx.Xq]
    cand = np.stack([table[c, a] for c, a in loc])
    n_unique = int(np.unique(table).size)
    # on the wire (msgpack): the listed items' uint32 ids and float32 features, and the C x K x k' lists
    table_bytes = wire_bytes({"item_ids": np.zeros(n_unique, np.uint32),
                              "features": np.zeros((n_unique, dim), np.float32),
                              "lists": np.zeros((C, K, shortlist), np.uint32)})
    return cand, float(table_bytes), {"n_cells": K, "table_items": n_unique, "table_lists": C * K}


def class_hubs(ctx) -> np.ndarray:
    """``(q, k')``: the ``k'`` hubs of each query's class (``h_c`` descending, ties by id): what
    the label alone gives, the answer of the cell release (and of the Gaussian one) as eps -> 0."""
    cells, sl = cell_state(ctx)
    ci = cells.class_index(ctx.yq)
    top = {c: _top(sl.hubs_[c], ctx.cfg.shortlist) for c in np.unique(ci).tolist()}
    return np.stack([top[c] for c in ci.tolist()])
