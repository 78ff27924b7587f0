"""Properties the KAHM paper proves: Theorem 1 (lambda fixed point), the kernel of eqs 35-36,
Theorem 2 (bounded image), Theorem 3 (distance ratio), Theorems 4-5 (deep / wide distances),
and a counterexample to Theorem 2's positivity step when lambda* is tiny."""

import numpy as np
import pytest
import torch
from scipy.optimize import brentq

from pm_vector.kahm import KAHM, DeepKAHM, WideKAHM, fit_core, kernel_matrix, lambda_star, residual_dense
from pm_vector.kahm.kernel import eigh, fit_encoder, sq_dists


def _data(seed=0, N=80, p=6, scale=1.0, shift=0.0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(p, p))
    return (rng.normal(size=(N, p)) @ A) * scale + shift


# ---------------------------------------------------------------- Theorem 1
@pytest.mark.parametrize("seed,shift", [(0, 0.0), (1, 3.0), (2, -1.0)])
def test_lambda_iteration_converges_to_the_unique_fixed_point(seed, shift):
    Y = torch.tensor(_data(seed, shift=shift))
    N, p = Y.shape
    enc = fit_encoder(Y, 3)
    Z = enc.encode(Y)
    K = kernel_matrix(Z, Z, 3)
    mu, U = eigh(K)
    c = ((U.T @ Y) ** 2).sum(1)
    normsq = float((Y * Y).sum())
    res = lambda_star(mu, c, normsq, N, p, record=True)
    upper = normsq / (p * N)
    tau = 2 * upper
    assert res.converged and res.iterations < 200
    assert res.tau == pytest.approx(tau)
    assert 0 < res.e_hat < upper                                   # eq 22
    # the fixed point of R(., tau) computed straight from eq 21 with linear solves
    assert residual_dense(K, Y, res.e_hat, tau) == pytest.approx(res.e_hat, rel=1e-10)
    root = brentq(lambda e: residual_dense(K, Y, e, tau) - e, 1e-12, upper, xtol=1e-14)
    assert res.e_hat == pytest.approx(root, rel=1e-8)
    assert res.lam == pytest.approx(root + tau, rel=1e-10)        # eq 28
    # contraction: the distance to the fixed point shrinks at every step, whatever e_0 (eq 26)
    for e0 in (1e-6 * upper, 0.5 * upper, 0.999 * upper):
        r = lambda_star(mu, c, normsq, N, p, e0=e0, record=True)
        gaps = np.abs(np.array(r.history) - res.e_hat)
        assert np.all(np.diff(gaps[gaps > 1e-13]) < 0)
        assert r.e_hat == pytest.approx(res.e_hat, rel=1e-9)
    # derivative bounds of eq 23 at a few points
    for e in np.linspace(0.05, 0.95, 5) * upper:
        h = 1e-6 * upper
        d = (residual_dense(K, Y, e + h, tau) - residual_dense(K, Y, e - h, tau)) / (2 * h)
        assert 0 < d < 2 / (e + tau) * upper


def test_lambda_star_rejects_bad_start():
    from pm_vector.errors import InvalidInputError
    Y = torch.tensor(_data())
    c = fit_core(Y, 3)
    with pytest.raises(InvalidInputError, match="e0"):
        lambda_star(torch.ones(80, dtype=torch.float64), torch.ones(80, dtype=torch.float64), 1.0, 80, 6, e0=10.0)
    assert c.lam > c.tau > 0


# ---------------------------------------------------------------- kernel (eqs 35-36)
def test_kernel_is_mahalanobis_on_the_pca_encoding_with_the_1_over_2n_factor():
    Yn = _data(3, N=50, p=7)
    n = 4
    Y = torch.tensor(Yn)
    # the paper's recipe in numpy: P = top-n eigenvectors of the sample covariance (rows),
    # theta = sample covariance of P y (eq 36), k = exp(-(1/2n) (x_i-x_j)^T theta^-1 (x_i-x_j))
    C = np.cov(Yn, rowvar=False)
    w, V = np.linalg.eigh(C)
    P = V[:, ::-1][:, :n].T
    X = Yn @ P.T
    Xc = X - X.mean(0)
    theta = Xc.T @ Xc / (len(X) - 1)
    ti = np.linalg.inv(theta)
    diff = X[:, None, :] - X[None, :, :]
    K_ref = np.exp(-np.einsum("ijk,kl,ijl->ij", diff, ti, diff) / (2 * n))
    enc = fit_encoder(Y, n)
    Z = enc.encode(Y)
    np.testing.assert_allclose(kernel_matrix(Z, Z, n).numpy(), K_ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(enc.eigvals.numpy(), np.diag(theta), rtol=1e-9)
    # same through the Gram route (p > N)
    Yw = torch.tensor(np.random.default_rng(4).normal(size=(12, 40)))
    e1 = fit_encoder(Yw, 5)
    e2 = fit_encoder(Yw, 5, gram=Yw @ Yw.T)
    Zw = e1.encode(Yw)
    Cw = np.cov(Yw.numpy(), rowvar=False)
    ww, Vw = np.linalg.eigh(Cw)
    Pw = Vw[:, ::-1][:, :5].T
    Xw = Yw.numpy() @ Pw.T
    tw = np.cov(Xw, rowvar=False)
    dw = Xw[:, None] - Xw[None]
    Kw = np.exp(-np.einsum("ijk,kl,ijl->ij", dw, np.linalg.inv(tw), dw) / 10)
    np.testing.assert_allclose(kernel_matrix(Zw, Zw, 5).numpy(), Kw, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(sq_dists(e2.encode(Yw), e2.encode(Yw)).numpy(), sq_dists(Zw, Zw).numpy(),
                               rtol=1e-8, atol=1e-9)


# ---------------------------------------------------------------- Theorems 2 and 3
def _queries(rng, Y, m=300):
    centre = Y.mean(0)
    spread = Y.std()
    scales = rng.choice([0.1, 1.0, 5.0, 100.0], size=(m, 1))
    near = Y[rng.integers(0, len(Y), m)] + 0.3 * spread * rng.normal(size=(m, Y.shape[1]))
    far = centre + scales * spread * rng.normal(size=(m, Y.shape[1]))
    return np.concatenate([near, far, Y])


@pytest.mark.parametrize("seed,N,p,n,shift", [(0, 60, 5, 3, 0.0), (1, 120, 12, 6, 2.0), (2, 40, 30, 10, -0.5)])
def test_theorem2_image_bounded_and_theorem3_ratio_bound(seed, N, p, n, shift):
    rng = np.random.default_rng(seed)
    Y = _data(seed, N=N, p=p, shift=shift)
    m = KAHM(n).fit(Y)
    Q = _queries(rng, Y)
    img = m.predict(Q)
    assert np.all(np.isfinite(img))
    norms = np.linalg.norm(img, axis=1)
    ratio = m.ratio_bound_
    spec = np.linalg.norm(Y, 2)
    assert np.all(norms < spec * ratio)                                      # eq 46, first bound
    assert spec * ratio < spec * (1 + p * N ** 2 / (2 * np.sum(Y ** 2)))     # eq 46, second bound
    assert m.image_bound() == pytest.approx(spec * ratio)
    # image lies in the affine hull of the samples: A(y) - y_1 in span{y_i - y_1}
    B = (Y - Y[0]).T
    coef, *_ = np.linalg.lstsq(B, (img - Y[0]).T, rcond=None)
    np.testing.assert_allclose(B @ coef, (img - Y[0]).T, atol=1e-8 * (1 + np.abs(img).max()))
    # Theorem 3: Gamma(y) / ||[y - y_1 ... y - y_N]||_2 < ratio
    gam = m.distance(Q)
    denom = np.array([np.linalg.norm(q[:, None] - Y.T, 2) for q in Q])
    assert np.all(gam / denom < ratio)
    assert np.all(gam >= 0)


def test_theorem4_deep_distance_not_larger_than_first_layer_and_theorem5_wide():
    Y = _data(5, N=300, p=10)
    rng = np.random.default_rng(5)
    Q = _queries(rng, Y, 100)
    single = KAHM(6).fit(Y)
    deep = DeepKAHM(6, 3).fit(Y)
    assert np.all(deep.distance(Q) <= single.distance(Q) + 1e-10)             # eq 166
    np.testing.assert_allclose(deep.layers_[0].image(torch.tensor(Q)).numpy(), single.predict(Q), rtol=1e-10)
    wide = WideKAHM(6, 3, branch_size=100, random_state=0).fit(Y)
    assert len(wide.branches_) == 3 and sum(wide.branch_sizes_) == 300
    d = wide.distance(Q)
    # eq 167: the wide distance is the minimum over the branches' deep distances
    per = []
    for layers in wide.branches_:
        from pm_vector.kahm.model import deep_forward
        per.append(deep_forward(layers, torch.tensor(Q))[1].numpy())
    np.testing.assert_allclose(d, np.min(per, axis=0))
    # Theorem 5 (eq 61) with the Frobenius norm
    fro = np.sqrt(((Q[:, None, :] - Y[None]) ** 2).sum((1, 2)))
    sizes = np.array(wide.branch_sizes_)
    bounds = []
    for layers in wide.branches_:
        c = layers[0]
        bounds.append(1 + 10 * c.N ** 2 / (2 * c.y_fro2))
    assert np.all(d / fro < min(bounds))
    assert sizes.min() >= 7


# ---------------------------------------------------------------- a gap in Theorem 2's proof
def test_sum_of_h_can_be_negative_when_lambda_is_tiny_and_the_model_says_so():
    """Theorem 2's proof needs sum_i h^i(Py) > 0 (eq 148), derived from 'the product of two PSD
    matrices is PSD' (eq 140), which is false. With small-magnitude data lambda* = e + 2||Y||^2/(pN)
    is tiny while the (scale-free) kernel is not, and sum_i h^i(Py) goes negative; by continuity it
    crosses 0, where ||A(y)|| is unbounded. The model reports such points as 'no image'
    (NaN image, infinite distance) instead of a garbage number."""
    from pm_vector.manifold.laplacian import single_threaded
    with single_threaded():            # hundreds of tiny tensor ops: threads only add overhead
        _negative_sum_of_h()


def _negative_sum_of_h():
    rng = np.random.default_rng(2)
    N, p, n = 45, 5, 4
    Y = rng.normal(size=(N, p)) * 1e-2
    core = fit_core(torch.tensor(Y), n)
    assert core.lam < 1e-3
    z = (core.Z[rng.integers(0, N, 64)] + torch.tensor(rng.normal(size=(64, n)))).clone().requires_grad_(True)
    opt = torch.optim.Adam([z], lr=0.05)
    for _ in range(300):
        d2 = sq_dists(z, core.Z)
        d2 = d2 - d2.min(1, keepdim=True).values
        den = torch.exp(-d2 / (2 * n)) @ core.b
        opt.zero_grad()
        den.sum().backward()
        opt.step()
    z = z.detach()
    W = core.enc.W
    lift = torch.linalg.pinv(W)                                   # y = mean + W^+ z has encoding z
    ys = core.enc.mean + z @ lift.T
    img, den = core.image_and_den(ys)
    neg = torch.nonzero(den < 0).flatten()
    assert neg.numel() > 0, "expected a point with sum_i h^i(Py) < 0"
    y_bad = ys[neg[0]]
    m = KAHM(n).fit(Y)
    assert np.isinf(m.distance(y_bad[None].numpy())[0])
    assert np.all(np.isnan(m.predict(y_bad[None].numpy())))
    # bisect towards the zero crossing from a training point: ||A(y)|| exceeds Theorem 2's bound
    lo, hi = torch.tensor(Y[0]), y_bad
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if core.image_and_den(mid[None])[1][0] > 0:
            lo = mid
        else:
            hi = mid
    a = core.image(lo[None])[0]
    bound = np.linalg.norm(Y, 2) * core.ratio_bound()
    assert float(torch.linalg.vector_norm(a)) > bound


# ---------------------------------------------------------------- the two CPU code paths agree
@pytest.mark.parametrize("N,p", [(60, 8), (30, 90)])
def test_numpy_and_torch_fit_paths_agree(N, p):
    from pm_vector.kahm import fit_deep
    Y = torch.tensor(_data(7, N=N, p=p) if p <= N else np.random.default_rng(7).normal(size=(N, p)))
    Q = torch.tensor(np.random.default_rng(8).normal(size=(40, p)))
    a = fit_core(Y, 5, backend="numpy", keep_eig=True, record_lambda=True)
    b = fit_core(Y, 5, backend="torch", keep_eig=True, record_lambda=True)
    assert a.lam == pytest.approx(b.lam, rel=1e-10) and a.lambda_iterations == b.lambda_iterations
    np.testing.assert_allclose(a.image(Q).numpy(), b.image(Q).numpy(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(a.h(Q).numpy(), b.h(Q).numpy(), rtol=1e-7, atol=1e-10)
    da = fit_deep(Y, 5, 3, backend="numpy")
    db = fit_deep(Y, 5, 3, backend="torch")
    for x, y in zip(da, db):
        np.testing.assert_allclose(x.image(Q).numpy(), y.image(Q).numpy(), rtol=1e-8, atol=1e-10)
    from pm_vector.errors import InvalidInputError
    with pytest.raises(InvalidInputError, match="backend"):
        fit_core(Y, 5, backend="jax")
