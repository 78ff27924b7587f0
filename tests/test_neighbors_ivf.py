"""The blocked approximate graph (:func:`pm_vector.neighbors.ivf_graph`): exact search within each
k-means cell's nearest cells, with the probe chosen on a sample to reach a target recall."""

from __future__ import annotations

import numpy as np
import pytest

from pm_vector.bench.latency import clustered
from pm_vector.errors import InvalidInputError
from pm_vector.neighbors import ivf_graph, neighbor_graph


def _recall(a, b) -> float:
    return float(np.mean([len(set(a[i].tolist()) & set(b[i].tolist())) / a.shape[1] for i in range(a.shape[0])]))


@pytest.fixture(scope="module")
def data():
    X, _ = clustered(6000, 24, 30, seed=3)
    return X, neighbor_graph(X, 16, method="exact")


def test_lists_are_other_rows_without_repeats_and_recall_the_exact_graph(data):
    X, exact = data
    info = {}
    G = ivf_graph(X, 16, cell_rows=100, info=info)
    assert G.shape == (6000, 16) and G.dtype == np.int64
    assert not (G == np.arange(6000)[:, None]).any() and all(len(set(r.tolist())) == 16 for r in G)
    assert ((G >= 0) & (G < 6000)).all()
    rec = _recall(G, exact)
    print(f"blocked graph: {info}, recall against exact {rec:.4f}")
    assert info["cells"] == 60 and info["probe"] in (8, 12, 16, 24, 32, 48, 64, 96, 128)
    assert rec >= 0.95 and abs(rec - info["sample_recall"]) < 0.05  # the sample's estimate is close
    # nearest first: each list's distances do not decrease
    d = np.linalg.norm(X[G] - X[:, None, :], axis=2)
    assert (np.diff(d, axis=1) >= -1e-5).all()


def test_the_probe_widens_until_the_sample_reaches_the_target(data):
    X, exact = data
    lo, hi = {}, {}
    g_lo = ivf_graph(X, 16, cell_rows=100, probes=(1, 2, 4, 60), target_recall=0.01, info=lo)
    g_hi = ivf_graph(X, 16, cell_rows=100, probes=(1, 2, 4, 60), target_recall=1.0, info=hi)
    assert lo["probe"] == 1 and hi["probe"] > 1 and hi["sample_recall"] > lo["sample_recall"]
    assert _recall(g_hi, exact) > _recall(g_lo, exact)
    # every cell probed: exact lists (up to float32 ties)
    full = ivf_graph(X, 16, cell_rows=100, probes=(60,))
    assert _recall(full, exact) > 0.999


def test_duplicates_and_tiny_inputs():
    rng = np.random.default_rng(0)
    X = np.repeat(rng.standard_normal((50, 8)).astype(np.float32), 4, axis=0)  # every row 4 times
    G = ivf_graph(X, 5, cell_rows=20)
    assert not (G == np.arange(200)[:, None]).any()
    # each row's 3 copies are at distance 0: they are its first neighbours
    for i in range(0, 200, 17):
        assert set(G[i, :3].tolist()) == {j for j in range(4 * (i // 4), 4 * (i // 4) + 4)} - {i}
    assert ivf_graph(X[:1], 5).shape == (1, 0)
    small = ivf_graph(X[:7], 10)  # g capped at n - 1; cells smaller than a list fall back to exact
    assert small.shape == (7, 6) and not (small == np.arange(7)[:, None]).any()


def test_bad_parameters_are_refused():
    X = np.zeros((100, 4), np.float32)
    with pytest.raises(InvalidInputError):
        ivf_graph(X, 5, probes=())
    with pytest.raises(InvalidInputError):
        ivf_graph(X, 5, target_recall=0.0)


def test_knn_rows_searches_as_the_job_built_its_graph():
    """Exact: the float64 search itself (ties by position); else an exact float32 search, which on
    rows without near ties finds the same neighbours, each row first among its own."""
    from pm_vector.neighbors import knn_rows, knn_search

    X = np.random.default_rng(3).normal(size=(2_000, 24)).astype(np.float32)
    q = np.array([0, 7, 1_999, 512])
    exact = knn_rows(X, q, 9, True)
    assert np.array_equal(exact, knn_search(X[q], X, 9))
    fast = knn_rows(X, q, 9, False)
    assert np.array_equal(fast, exact) and np.array_equal(fast[:, 0], q)
    assert knn_rows(X, np.zeros(0, np.int64), 9, False).shape == (0, 0)
