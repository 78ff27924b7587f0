"""The job's one neighbour graph serves the class rows and the cell release (exact: the smaller
graph is a prefix of the wider one, ties by position), and the cell rows keep only the entries an
answer with k' <= the maximum can use, with answers identical to the whole rows."""

from __future__ import annotations

import numpy as np


def test_the_exact_graph_is_a_prefix_of_the_wider_one_with_ties():
    from pm_vector.neighbors import knn_search, neighbor_graph

    rng = np.random.default_rng(0)
    base = rng.integers(0, 3, size=(40, 2)).astype(np.float64)  # many equal distances
    X = np.concatenate([base, base[:15]])  # and duplicate rows
    g32 = neighbor_graph(X, 32, method="exact")
    for g in (1, 5, 16):
        np.testing.assert_array_equal(neighbor_graph(X, g, method="exact"), g32[:, :g])
    for k in (3, 9, 20):  # ties by the lower index: the k nearest are the first k by (distance, index)
        got = knn_search(X, X, k)
        d = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
        want = np.stack([np.lexsort((np.arange(len(X)), r))[:k] for r in d])
        np.testing.assert_array_equal(got, want)


def _ranked(ids, h, hc, w, kp, top_ids, top_hc, fill):
    """The cell statement's ranking of one row: the row's entries, the class's top hubs (h = 0)
    and the fill (h = hc = 0), max per item, top k' by (score desc, id)."""
    cand: dict[int, list[float]] = {}
    for i, a, b in zip(ids, h, hc):
        cand[int(i)] = [a, b]
    for i, b in zip(top_ids[:kp], top_hc[:kp]):
        v = cand.setdefault(int(i), [0.0, 0.0])
        v[1] = max(v[1], b)
    for i in fill[:kp]:
        cand.setdefault(int(i), [0.0, 0.0])
    items = sorted(cand, key=lambda i: (-(cand[i][1] + w * cand[i][0]), i))
    return items[:kp]


def test_the_cell_rows_keep_what_the_answers_use():
    from pm_vector.db.runs.cell_data import useful_entries

    rng = np.random.default_rng(1)
    n_items, k_max = 400, 12
    hc_all = rng.integers(0, 30, n_items).astype(np.float64)  # the class hub counts
    groups, items, hs = [], [], []
    for gi in range(6):  # rows of 0 .. ~300 entries, small integer counts with many ties
        m = int(rng.integers(0, 300))
        it = np.sort(rng.choice(n_items, m, replace=False))
        groups.append(np.full(m, gi))
        items.append(it)
        hs.append(rng.integers(1, 8, m).astype(np.float64))
    group, item, h = np.concatenate(groups), np.concatenate(items), np.concatenate(hs)
    hc = hc_all[item]
    keep = useful_entries(group, item, h, hc, k_max)
    assert keep.sum() < keep.size  # something is dropped
    # a superset of the entries with fewer than k_max dominators
    for gi in range(6):
        sel = np.flatnonzero(group == gi)
        for e in sel:
            dom = np.sum((h[sel] >= h[e]) & (hc[sel] >= hc[e]) & ((hc[sel] > hc[e]) | (item[sel] < item[e])))
            if dom < k_max:
                assert keep[e]
    order = np.lexsort((np.arange(n_items), -hc_all))
    top_ids, top_hc = order, hc_all[order]
    fill = np.arange(n_items)
    for gi in range(6):
        sel = np.flatnonzero(group == gi)
        kept = sel[keep[sel]]
        for w in (1e-6, 0.05, 0.7, 1.0, 3.3, 54.6, 2.0 ** 20):
            for kp in (1, 5, k_max):
                full = _ranked(item[sel], h[sel], hc[sel], w, kp, top_ids, top_hc, fill)
                cut = _ranked(item[kept], h[kept], hc[kept], w, kp, top_ids, top_hc, fill)
                assert full == cut, (gi, w, kp)
