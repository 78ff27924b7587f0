"""The erasure plan's quick refill (an attached table's sync above ``graph_exact_max_items``): each
refilled list keeps ``graph_degree`` entries, holds no erased item, keeps most of the exact refill's
entries, and the hub-count changes are exactly the lists' changes."""

from __future__ import annotations

import numpy as np


def test_quick_refill_keeps_full_lists_without_erased_items():
    from pm_vector.bench.latency import N_FINE, clustered
    from pm_vector.db.runs.erase_plan import plan
    from pm_vector.neighbors import knn_search

    X, y = clustered(3000, 32, N_FINE, seed=2)
    y = np.asarray(y) % 3
    ids = np.arange(1, X.shape[0] + 1, dtype=np.int64)
    nb = knn_search(X, X, 17)[:, 1:]
    lists = {int(ids[i]): ids[nb[i]] for i in range(ids.size)}
    erased = ids[np.random.default_rng(3).choice(ids.size, 40, replace=False)]
    stored = {j: lst for j, lst in lists.items() if j in set(erased.tolist()) or set(erased.tolist()) & set(lst.tolist())}
    doc = {"status": "ready", "classes": [0, 1, 2], "graph_degree": 16, "graph_exact_max_items": 100}
    exact = plan(None, 1, doc, ids, y, X, erased, neighbor_lists=stored)
    quick = plan(None, 1, doc, ids, y, X, erased, neighbor_lists=stored, quick=True)
    assert sorted(quick.new_lists) == sorted(exact.new_lists)
    gone = set(erased.tolist())
    shared = []
    for j, lst in quick.new_lists.items():
        assert lst.shape == (16,) and not gone & set(lst.tolist()) and j not in lst
        shared.append(len(set(lst.tolist()) & set(exact.new_lists[j].tolist())) / 16)
    assert np.mean(shared) >= 0.95
    # the hub counts change by the lists' changes: -1 per old entry, +1 per new, per class
    want: dict = {}
    for j, lst in stored.items():
        c = int(y[j - 1])
        for i in lst.tolist():
            want[(c, i)] = want.get((c, i), 0.0) - 1.0
        for i in quick.new_lists.get(j, np.zeros(0, np.int64)).tolist():
            want[(c, i)] = want.get((c, i), 0.0) + 1.0
    assert {k: v for k, v in want.items() if v} == quick.hub_delta
