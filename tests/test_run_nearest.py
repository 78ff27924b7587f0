"""The exact search of :mod:`pm_vector.db.runs.run_nearest` (the delta's estimate of a new item):
the g nearest rows other than the item itself, ``(distance, id)`` ascending, as a brute force in
numpy gives them, for every metric, with ties (duplicate rows) cut by id and with the float32
pre-selection's margin too small to hold them (the exact fallback)."""

from __future__ import annotations

import numpy as np
import pytest

from pm_vector.db.runs import run_nearest


def _brute(E, ids, q, qid, g, metric):
    E = E.astype(np.float64)
    q = q.astype(np.float64)
    if metric == "l2":
        d = np.sqrt(((E - q) ** 2).sum(1))
    elif metric == "cosine":
        d = 1 - E @ q / (np.linalg.norm(E, axis=1) * np.linalg.norm(q))
    else:
        d = -(E @ q)
    d[ids == qid] = np.inf
    return [int(i) for i in ids[np.lexsort((ids, np.round(d, 12)))][:g]]


@pytest.mark.parametrize("metric", ["l2", "cosine", "ip"])
@pytest.mark.parametrize("margin", [run_nearest.MARGIN, 0])
def test_the_exact_g_nearest_ties_by_id(metric, margin, monkeypatch):
    monkeypatch.setattr(run_nearest, "MARGIN", margin)
    rng = np.random.default_rng(3)
    E = rng.normal(size=(3000, 16)).astype(np.float32)
    E[1000:1400] = E[7]  # 400 duplicates of one row (and its ties at every cut)
    E[2000:2100] = E[11] * 2.0  # (the same direction: cosine ties)
    ids = np.sort(rng.choice(10**6, size=E.shape[0], replace=False)).astype(np.int64)
    qpos = np.array([7, 11, 1005, 2050, 5, 2999])
    Q = np.concatenate([E[qpos], rng.normal(size=(3, 16)).astype(np.float32)])
    qids = np.concatenate([ids[qpos], np.array([-1, -2, -3], np.int64)])
    got = run_nearest.nearest(E, ids, Q, qids, 32, metric)
    for i in range(Q.shape[0]):
        assert [int(j) for j in ids[got[i]]] == _brute(E, ids, Q[i], qids[i], 32, metric), (metric, i)


def test_a_run_smaller_than_g_gives_every_other_row():
    E = np.eye(5, dtype=np.float32)
    ids = np.arange(10, 15, dtype=np.int64)
    got = run_nearest.nearest(E, ids, E[:2], ids[:2], 32, "l2")
    assert [ids[g].tolist() for g in got] == [[11, 12, 13, 14], [10, 12, 13, 14]]


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("offset", [3.0, 10.0, 30.0, 300.0, 3000.0, 10000.0])
def test_the_exact_g_nearest_far_from_the_origin(metric, offset):
    """Rows far from the origin and close together: the pre-selection's matrix product
    (``|q|^2 + |x|^2 - 2 q.x`` in float32; for ip, of the rows lifted by one dimension) loses most of
    their distances' digits, and the answer is still the exact one (the cut decided within the float32
    error bound, else over every row). With a bound of 0, l2 fails at offsets 3 and 10, ip at 3,000 and
    10,000."""
    rng = np.random.default_rng(5)
    E = (offset + rng.normal(size=(4000, 16)) * 1e-2).astype(np.float32)
    ids = np.arange(4000, dtype=np.int64) * 3 + 1
    Q = np.concatenate([E[:30], (offset + rng.normal(size=(30, 16)) * 1e-2).astype(np.float32)])
    qids = np.concatenate([ids[:30], -np.arange(1, 31)])
    got = run_nearest.nearest(E, ids, Q, qids, 32, metric)
    for i in range(Q.shape[0]):
        assert [int(j) for j in ids[got[i]]] == _brute(E, ids, Q[i], qids[i], 32, metric), (metric, i)
