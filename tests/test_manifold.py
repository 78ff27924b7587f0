import numpy as np
import pytest
import torch

from pm_vector.errors import InvalidInputError
from pm_vector.manifold import (SMLQ, AnchorFrame, cross_laplacian, feature_laplacian, label_laplacian, public_init,
                                smlq_objective, smlq_step)
from pm_vector.manifold.laplacian import LabelLaplacian, to_tensor


def unit_rows(rng, n, d):
    X = rng.standard_normal((n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def dense_gaussian_laplacian(Z, s):
    d2 = ((Z[:, None, :] - Z[None, :, :]) ** 2).sum(-1)
    W = np.exp(-d2 / (2 * s * s))
    np.fill_diagonal(W, 0)
    return np.diag(W.sum(1)) - W


def test_feature_laplacian_uses_the_appendix_kernel():
    rng = np.random.default_rng(0)
    X = unit_rows(rng, 40, 5)
    L = feature_laplacian(X, 0.7).dense().numpy()
    np.testing.assert_allclose(L, dense_gaussian_laplacian(X, 0.7), atol=1e-12)
    # rows of a Laplacian sum to zero, and it is symmetric PSD
    np.testing.assert_allclose(L.sum(1), 0, atol=1e-12)
    assert np.linalg.eigvalsh(L).min() > -1e-10


def test_knn_laplacian_is_symmetric_and_keeps_the_nearest_weights():
    rng = np.random.default_rng(1)
    X = unit_rows(rng, 200, 6)
    L = feature_laplacian(X, 0.5, graph="knn", n_neighbors=7).dense().numpy()
    W = -L.copy()
    np.fill_diagonal(W, 0)
    np.testing.assert_allclose(W, W.T, atol=1e-12)
    full = -dense_gaussian_laplacian(X, 0.5)
    np.fill_diagonal(full, 0)
    for i in range(0, 200, 37):
        nearest = np.argsort(-full[i])[:7]
        np.testing.assert_allclose(W[i, nearest], full[i, nearest], atol=1e-12)
        # every kept weight is a true kernel weight, not a doubled one
        kept = np.flatnonzero(W[i])
        np.testing.assert_allclose(W[i, kept], full[i, kept], atol=1e-12)
    assert ((W > 0).sum(1) >= 7).all()


@pytest.mark.parametrize("encoding", ["integer", "onehot"])
@pytest.mark.parametrize("kind", ["same", "between"])
def test_label_laplacian_class_sums_equal_the_dense_kernel(encoding, kind):
    rng = np.random.default_rng(2)
    y = rng.integers(0, 5, 60)
    LY = label_laplacian(y, 1.3, encoding=encoding, kind=kind)
    Yv = y[:, None].astype(float) if encoding == "integer" else np.eye(5)[y]
    Lref = dense_gaussian_laplacian(Yv, 1.3)
    if kind == "between":
        W = 1 - np.exp(-((Yv[:, None] - Yv[None]) ** 2).sum(-1) / (2 * 1.3 ** 2))
        np.fill_diagonal(W, 0)
        Lref = np.diag(W.sum(1)) - W
    Z = rng.standard_normal((60, 3))
    np.testing.assert_allclose(LY.apply(to_tensor(Z, "cpu")).numpy(), Lref @ Z, atol=1e-10)
    np.testing.assert_allclose(LY.dense().numpy(), Lref, atol=1e-12)


def test_between_graph_has_no_within_class_edges():
    LY = label_laplacian(np.array([0, 0, 1, 1, 2]), 1.0, kind="between").dense().numpy()
    assert LY[0, 1] == 0 and LY[2, 3] == 0 and LY[0, 2] < 0


@pytest.mark.parametrize("label_graph", ["same", "between"])
@pytest.mark.parametrize("normalize", [False, True])
def test_theorem1_each_step_does_not_increase_the_objective(digits_split, label_graph, normalize):
    Xa, ya = digits_split.anchor
    for alpha in (0.0, 0.3, 2.0):
        s = SMLQ(6, sigma=0.3, alpha=alpha, n_iter=8, label_graph=label_graph, normalize=normalize,
                 label_encoding="integer").fit(Xa, ya)
        for before, after in s.objective_pairs_:
            assert after <= before + 1e-9 * max(1.0, abs(before))


def test_theorem1_checked_independently_with_dense_matrices():
    # the MM step of eq. 4 against v(X) = Tr(X'L_X X) - alpha Tr(X'L_Y X) in plain numpy
    rng = np.random.default_rng(3)
    X = unit_rows(rng, 50, 4)
    y = rng.integers(0, 3, 50)
    LX = dense_gaussian_laplacian(X, 0.6)
    LY = dense_gaussian_laplacian(y[:, None].astype(float), 0.6)
    D = np.diag(LX)
    Z = rng.standard_normal((50, 2))
    v = lambda Z: np.trace(Z.T @ LX @ Z) - 0.5 * np.trace(Z.T @ LY @ Z)
    for _ in range(20):
        Zn = Z + 0.5 * ((0.5 * LY - LX) @ Z) / D[:, None]
        assert v(Zn) <= v(Z) + 1e-9
        Z = Zn
    # ... and the library's step is that same map
    LXo = feature_laplacian(X, 0.6)
    LYo = label_laplacian(y, 0.6, encoding="integer", kind="same")
    Z0 = rng.standard_normal((50, 2))
    ours = smlq_step(to_tensor(Z0, "cpu"), LXo, LYo, 0.5).numpy()
    np.testing.assert_allclose(ours, Z0 + 0.5 * ((0.5 * LY - LX) @ Z0) / D[:, None], atol=1e-10)
    assert smlq_objective(to_tensor(Z0, "cpu"), LXo, LYo, 0.5) == pytest.approx(v(Z0), rel=1e-10)


def test_smlq_is_deterministic_under_a_seed_and_normalised(digits_split):
    Xa, ya = digits_split.anchor
    a = SMLQ(4, random_state=3).fit_transform(Xa, ya)
    b = SMLQ(4, random_state=3).fit_transform(Xa, ya)
    c = SMLQ(4, random_state=4).fit_transform(Xa, ya)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    np.testing.assert_allclose(a.mean(0), 0, atol=1e-10)
    assert np.sqrt((a ** 2).sum(1).mean()) == pytest.approx(1.0)


def test_unnormalised_iterate_is_a_power_iteration_that_blows_up(digits_split):
    # NOTES 3: without normalisation the linear iterate grows without bound
    Xa, ya = digits_split.anchor
    s = SMLQ(2, sigma=0.1, alpha=1.0, alpha_scale="absolute", n_iter=30, normalize=False,
             label_graph="same", label_encoding="integer").fit(Xa, ya)
    assert not np.isfinite(s.embedding_).all() or np.abs(s.embedding_).max() > 1e6


def test_anchor_frame_is_reproducible_from_public_data_and_seed(digits_split):
    Xa, ya = digits_split.anchor
    f1 = AnchorFrame(8, seed=11).fit(Xa, ya)
    f2 = AnchorFrame(8, seed=11).fit(Xa.copy(), ya.copy())
    np.testing.assert_array_equal(f1.anchor_embedding_, f2.anchor_embedding_)
    assert 0.05 < f1.sigma_ < 1.0  # public bandwidth: median nearest-anchor distance


def test_extension_places_items_by_class(digits_split, frame):
    Xs, ys = digits_split.server
    items = frame.extend(Xs, ys)
    assert items.shape == (len(ys), 8) and np.isfinite(items).all()
    # leave-one-out 1-NN in the embedding recovers the class far above chance (0.1)
    d = np.linalg.norm(items[:, None] - items[None], axis=-1)
    np.fill_diagonal(d, np.inf)
    assert (ys[d.argmin(1)] == ys).mean() > 0.85
    # batching does not change the out-of-sample extension (rows are independent)
    np.testing.assert_allclose(frame.extend(Xs, ys, batch_size=97), items, atol=1e-10)


def test_bad_input_is_refused(digits_split, frame):
    Xs, ys = digits_split.server
    with pytest.raises(InvalidInputError, match="NaN"):
        bad = Xs.copy()
        bad[3, 2] = np.nan
        frame.extend(bad, ys)
    with pytest.raises(InvalidInputError, match="features"):
        frame.extend(Xs[:, :10], ys)
    with pytest.raises(InvalidInputError, match="not in the anchor set"):
        frame.extend(Xs[:3], np.array([0, 1, 99]))
    with pytest.raises(InvalidInputError, match="alpha"):
        SMLQ(alpha=-1).fit(Xs[:20], ys[:20])
    with pytest.raises(InvalidInputError, match="sigma"):
        feature_laplacian(Xs[:5], 0.0)
    with pytest.raises(InvalidInputError, match="not fitted"):
        AnchorFrame().extend(Xs, ys)
    with pytest.raises(InvalidInputError, match="two classes"):
        AnchorFrame(2).fit(Xs[:30], np.zeros(30, dtype=int))


def test_public_init_depends_only_on_the_seed():
    np.testing.assert_array_equal(public_init(5, 3, 7), public_init(5, 3, 7))
    assert not np.allclose(public_init(5, 3, 7), public_init(5, 3, 8))
