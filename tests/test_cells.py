"""Public cells, the cell request (wire type and client) and the server's cell ranking."""

import json

import numpy as np
import pytest

from pm_vector.client.cell_client import PrivateCellKNN
from pm_vector.client.request import CellRequest
from pm_vector.errors import BudgetExceededError, InvalidInputError
from pm_vector.manifold.public_cells import PublicCells, nearest_centroid
from pm_vector.privacy import PrivacyAccountant, secure_generator
from pm_vector.privacy.cell_release import MAX_CELL_WEIGHT, cell_weight, rr_probabilities
from pm_vector.shortlist import CellShortlist, cell_hub_counts


@pytest.fixture(scope="module")
def cells(digits_split):
    Xa, ya = digits_split.anchor
    return PublicCells(levels=(2, 4, 8, 16, 1000)).fit(Xa, ya)


@pytest.fixture(scope="module")
def server(cells, digits_split):
    Xs, ys = digits_split.server
    return CellShortlist().fit(cells, Xs, ys), Xs, ys


def test_cells_are_kmeans_of_each_class_anchor(cells, digits_split):
    from sklearn.cluster import KMeans

    Xa, ya = digits_split.anchor
    smallest = int(np.bincount(ya).min())
    # 1000 > the smallest class: not usable; the finest level the anchor allows takes its place
    assert cells.levels_ == (2, 4, 8, 16, smallest)
    assert PublicCells(levels=(2, 4, 1000), finest=False).fit(Xa, ya).levels_ == (2, 4)
    assert cells.classes_.tolist() == sorted(set(ya.tolist()))
    for K in cells.levels_:
        assert cells.centroids_[K].shape == (cells.classes_.size, K, Xa.shape[1])
    c = cells.classes_[3]
    km = KMeans(n_clusters=8, random_state=0, n_init=10).fit(np.asarray(Xa[ya == c], dtype=np.float64))
    np.testing.assert_array_equal(cells.centroids_[8][3], km.cluster_centers_)
    # the fit is reproducible: the cells are a public function of the anchor
    again = PublicCells(levels=(2, 4, 8, 16, 1000)).fit(Xa, ya)
    assert again.digest() == cells.digest()


def test_assign_is_the_nearest_centroid_of_the_class(cells, digits_split):
    Xs, ys = digits_split.server
    ci = cells.class_index(ys)
    got = cells.assign(Xs, ci, 8)
    for i in range(0, len(ys), 37):
        d = ((cells.centroids_[8][ci[i]] - Xs[i]) ** 2).sum(1)
        assert got[i] == int(np.argmin(d))
    # a scalar class index applies to every row
    np.testing.assert_array_equal(cells.assign(Xs[:5], 2, 4), nearest_centroid(Xs[:5], cells.centroids_[4][2]))
    with pytest.raises(InvalidInputError):
        cells.assign(Xs[:5], 2, 3)  # not a published level
    with pytest.raises(InvalidInputError):
        cells.assign(Xs[:5], cells.classes_.size, 4)
    with pytest.raises(InvalidInputError):
        cells.class_index([99])


def test_cells_round_trip_exactly_and_digest_changes_with_content(cells):
    doc = json.loads(json.dumps(cells.to_dict()))
    back = PublicCells.from_dict(doc)
    assert back.digest() == cells.digest() and len(cells.digest()) == 64
    for K in cells.levels_:
        np.testing.assert_array_equal(back.centroids_[K], cells.centroids_[K])
    doc["centroids"]["4"][0][0][0] += 1e-12
    assert PublicCells.from_dict(doc).digest() != cells.digest()
    with pytest.raises(InvalidInputError):
        PublicCells.from_dict({**cells.to_dict(), "extra": 1})
    bad = cells.to_dict()
    bad["centroids"]["2"] = bad["centroids"]["2"][:1]
    with pytest.raises(InvalidInputError):
        PublicCells.from_dict(bad)


def test_too_small_classes_are_refused():
    X = np.eye(4)[[0, 1, 2, 3]]
    with pytest.raises(InvalidInputError, match="smallest class"):
        PublicCells(levels=(4,), finest=False).fit(X, [0, 0, 1, 1])
    assert PublicCells(levels=(4,)).fit(X, [0, 0, 1, 1]).levels_ == (2,)  # the finest the anchor allows
    with pytest.raises(InvalidInputError, match="smallest class"):
        PublicCells(levels=(4,)).fit(X, [0, 0, 0, 1])
    with pytest.raises(InvalidInputError):
        PublicCells(levels=(1,)).fit(X, [0, 0, 1, 1])


def test_cell_hub_counts_count_in_neighbour_lists():
    nb = np.array([[1, 2], [0, 2], [0, 1], [2, 1]])
    y = np.array([0, 0, 1, 1])
    cell = np.array([0, 1, 1, 1])
    m = cell_hub_counts(nb, y, cell, 4, n_classes=2, n_cells=2).toarray()
    assert m.shape == (4, 4)
    np.testing.assert_array_equal(m[0], [0, 1, 1, 0])  # class 0, cell 0: item 0's neighbours
    np.testing.assert_array_equal(m[1], [1, 0, 1, 0])  # class 0, cell 1: item 1's
    np.testing.assert_array_equal(m[2], [0, 0, 0, 0])
    np.testing.assert_array_equal(m[3], [1, 2, 1, 0])  # class 1, cell 1: items 2 and 3


def test_scores_are_hubs_plus_weighted_cell_hubs(server, cells):
    sl, Xs, ys = server
    K, c = 8, 4
    idx = np.flatnonzero(sl.y_index_ == c)
    cell = sl.cells_of_items_[K][idx]
    for r in (0, 5):
        for eps in (0.5, 3.0):
            p, q = rr_probabilities(eps, K)
            # the RR likelihood of every item of class c, summed over who has i as a neighbour
            w = np.where(cell == r, p, q)
            direct = np.zeros(sl.n_items_)
            np.add.at(direct, sl.neighbors_[idx].ravel(), np.repeat(w, sl.neighbors_.shape[1]))
            np.testing.assert_allclose(sl.scores(c, K, r, eps) * q, direct, rtol=1e-12, atol=1e-12)


def test_infinite_epsilon_ranks_cell_hubs_then_class_hubs(server):
    sl, _, _ = server
    assert cell_weight(float("inf")) == MAX_CELL_WEIGHT == cell_weight(100.0)
    req = CellRequest(reports=[3] * 10, n_cells=8, epsilon=float("inf"), cells_digest="x", shortlist=20)
    ids = sl.shortlist(req)[2]
    h = sl.cell_hubs_[8].getrow(2 * 8 + 3).toarray().ravel()
    key = sorted(range(sl.n_items_), key=lambda i: (-h[i], -sl.hubs_[2][i], i))[:20]
    assert ids.tolist() == key


def test_shortlist_fills_by_id_when_few_items_score(server):
    sl, _, _ = server
    req = CellRequest(reports=[0] * 10, n_cells=2, epsilon=1.0, cells_digest="x", shortlist=sl.n_items_)
    ids = sl.shortlist(req)[0]
    s = sl.scores(0, 2, 0, 1.0)
    zero = ids[s[ids] == 0]
    assert np.all(np.diff(zero) > 0) and np.all(s[ids[: (s > 0).sum()]] > 0)


def test_cell_request_is_strict():
    ok = dict(reports=[0, 1, 2], n_cells=4, epsilon=2.0, cells_digest="ab" * 32)
    r = CellRequest(**ok)
    assert r.delta == 0.0 and r.release == "cells" and r.n_rows == 3
    back = CellRequest.from_json(r.to_json())
    assert back == r
    inf = CellRequest.from_dict({**r.to_dict(), "epsilon": "inf"})
    assert inf.epsilon == float("inf")
    for bad in ({"reports": [0, 4, 1]}, {"reports": []}, {"reports": [True]}, {"n_cells": 1},
                {"epsilon": 0}, {"epsilon": float("nan")}, {"delta": 1e-5}, {"release": "gaussian"},
                {"shortlist": 0}, {"cells_digest": ""}, {"reports": [0.5]}):
        with pytest.raises(InvalidInputError):
            CellRequest(**{**ok, **bad})
    with pytest.raises(InvalidInputError, match="unknown"):
        CellRequest.from_dict({**r.to_dict(), "label": 3})
    with pytest.raises(InvalidInputError, match="missing"):
        CellRequest.from_dict({k: v for k, v in r.to_dict().items() if k != "reports"})
    with pytest.raises(InvalidInputError):
        CellRequest.from_dict({**r.to_dict(), "format": "pm_vector.class-rows/1"})


def test_client_request_reports_its_cell_and_charges_pure_eps(cells, digits_split):
    Xq, yq = digits_split.query
    acc = PrivacyAccountant(epsilon_budget=5.0, delta_budget=1e-6)
    cl = PrivateCellKNN(cells, 2.0, n_cells=8, accountant=acc, row="label")
    req, sec = cl.request(Xq[0], int(yq[0]))
    assert acc.spends[-1].epsilon == 2.0 and acc.spends[-1].delta == 0.0
    assert req.n_cells == 8 and len(req.reports) == cells.classes_.size and not req.seeded
    assert req.cells_digest == cells.digest() and sec.real_row == int(cells.class_index([yq[0]])[0])
    cl.request(Xq[1], int(yq[1]))
    with pytest.raises(BudgetExceededError):
        cl.request(Xq[2], int(yq[2]))
    assert len(acc.spends) == 2
    # at eps = inf the real row reports the true cell
    cl = PrivateCellKNN(cells, float("inf"), n_cells=16, row="label")._inject_generator(secure_generator(0))
    for x, label in zip(Xq[:20], yq[:20]):
        req, sec = cl.request(x, int(label))
        assert req.seeded and req.reports[sec.real_row] == cl.true_cell(x, int(label))[1]
    with pytest.raises(InvalidInputError):
        PrivateCellKNN(cells, 1.0, n_cells=3)
    with pytest.raises(InvalidInputError):
        PrivateCellKNN(cells, 1.0, row="label").request(Xq[0])  # no label, no classifier
    with pytest.raises(InvalidInputError):
        PrivateCellKNN(cells, 1.0, row="classifier")


def test_default_row_is_the_nearest_public_cell_of_any_class(cells, digits_split):
    Xq, yq = digits_split.query
    cl = PrivateCellKNN(cells, float("inf"), n_cells=8)._inject_generator(secure_generator(0))
    cen = cells.centroids_[8].reshape(-1, Xq.shape[1])
    for x in Xq[:30]:
        req, sec = cl.request(x)  # no label needed
        xn = np.asarray(x, dtype=np.float64) / np.linalg.norm(x)
        flat = int(np.argmin(((cen - xn) ** 2).sum(1)))
        assert (sec.real_row, req.reports[sec.real_row]) == (flat // 8, flat % 8)
        assert sec.label == int(cells.classes_[sec.real_row])
