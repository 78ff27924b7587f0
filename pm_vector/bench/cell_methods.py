"""`bench privacy`'s cell-release methods: ``pm_vector_cells`` (the cell release, K by the public
rule) and ``download_lists`` (the zero-eps baseline: the public table of every (class, cell) answer,
downloaded once, looked up at the true cell).

A cell answer depends only on (class, reported cell), so the whole set of answers at level K is a
public table of C x K lists. A client that downloads it looks up its true cell at eps 0 and gets
the cell release's eps = inf figure at that K, for the table's bytes (the union of the listed items'
ids and features, plus C K k' ids), reusable for every later query. The benchmark puts both side by
side; the cell release is worth its eps where one request is much cheaper than the table.
"""

from __future__ import annotations

import math

import numpy as np

from ..client.cells import PrivateCellKNN
from ..manifold.cells import PublicCells
from ..privacy import secure_generator
from ..privacy.cells import cell_level_for_epsilon, max_cells_for
from ..shortlist import CellShortlist
from .metrics import FEATURE_BYTES, ID_BYTES, float_payload_bytes

#: the bytes of a cell request besides its C reports: epsilon, K, k' and the cells' digest (64 hex)
_CELL_REQUEST_FIXED = float_payload_bytes(3) + 64


def cell_state(ctx):
    """``(PublicCells, CellShortlist)`` of the benchmark's split (cached on ``ctx``)."""
    cells = ctx.get("public cells", lambda: PublicCells(levels=ctx.cfg.cell_levels, random_state=ctx.cfg.seed)
                    .fit(ctx.Xa, ctx.ya))
    sl = ctx.get("cell shortlist", lambda: CellShortlist(ctx.cfg.cell_graph_degree).fit(cells, ctx.Xs, ctx.ys))
    return cells, sl


def level_for(ctx, eps) -> int:
    """The public rule's K at ``eps`` (or the configured fixed level)."""
    cells, _ = cell_state(ctx)
    fixed = ctx.cfg.n_cells
    if fixed is not None:
        if fixed not in cells.levels_:
            from ..errors import InvalidInputError
            raise InvalidInputError(f"--cells {fixed} is not a usable level; the anchor allows {list(cells.levels_)}.")
        return int(fixed)
    max_cells = max_cells_for(len(ctx.ys), cells.classes_.size, ctx.cfg.shortlist)
    return cell_level_for_epsilon(eps, cells.levels_, max_cells)


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    return np.lexsort((np.arange(scores.size), -scores))[:k]


def run_cells(ctx, eps, labels, X, seed: int, classifier=None):
    """One cell request per query (real row scored; the others are uniform reports whose answers
    the client discards). ``labels``: the queries' labels (``None`` entries: ask ``classifier``)."""
    cells, sl = cell_state(ctx)
    kp, q = ctx.cfg.shortlist, len(X)
    K = level_for(ctx, eps)
    client = PrivateCellKNN(cells, eps, n_cells=K, shortlist=kp, classifier=classifier)
    client._inject_generator(secure_generator(seed))
    cand = np.empty((q, kp), dtype=np.int64)
    json_bytes = 0
    for i in range(q):
        req, sec = client.request(X[i], None if labels is None else int(labels[i]))
        cand[i] = _top(sl.scores(sec.row, K, req.reports[sec.row], eps), kp)
        json_bytes += len(req.to_json())
    C = cells.classes_.size
    extra = {"release": "cells", "n_cells": K, "request_json_bytes": round(json_bytes / q, 1)}
    if not math.isinf(eps):
        extra["rr_p"] = round(client.mechanism.p_, 6)
    return cand, _CELL_REQUEST_FIXED + float_payload_bytes(0, n_ids=C), C, extra


def download_lists(ctx, K: int, dim: int):
    """``(candidates (q, k'), table bytes, extra)``: every query looks up its true cell's list in
    the public table of C x K lists (eps 0)."""
    cells, sl = cell_state(ctx)
    kp = ctx.cfg.shortlist
    C = cells.classes_.size
    table = np.empty((C, K, kp), dtype=np.int64)
    for c in range(C):
        for r in range(K):
            table[c, r] = _top(sl.scores(c, K, r, math.inf), kp)
    ci = cells.class_index(ctx.yq)
    a = cells.assign(ctx.Xq, ci, K)
    cand = table[ci, a]
    n_unique = int(np.unique(table).size)
    table_bytes = n_unique * (ID_BYTES + FEATURE_BYTES * dim) + C * K * kp * ID_BYTES
    return cand, float(table_bytes), {"n_cells": K, "table_items": n_unique, "table_lists": C * K}
