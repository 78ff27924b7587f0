"""Kernel Affine Hull Machines: the KAHM (Definition 1), conditionally deep KAHM (Definition 3)
and wide conditionally deep KAHM (Definition 5), with their distance functions (Defs 2, 4, 6).

Fitting a KAHM on ``Y`` (``N x p``) with subspace dimension ``n``:

1. PCA encoding + Mahalanobis Gaussian kernel with the ``1/(2n)`` factor (:mod:`.kernel`);
2. ``K = U diag(mu) U^T`` (one ``O(N^3)`` symmetric eigendecomposition);
3. ``lambda*`` from the fixed point of Theorem 1 (:mod:`.lambda_`);
4. ``B = (K + lambda* I)^-1 Y`` and ``b = (K + lambda* I)^-1 1``.

The image of a point is then ``A(y) = (g^T B) / (g^T b)`` with ``g_i = k(Py, Py_i)`` (eq 33:
``h(y) = (K + lambda I)^-1 g`` and ``A(y) = Y^T h / 1^T h``). The ratio is invariant to a common
factor of ``g``, so ``g`` is computed relative to the nearest training point
(``exp(-(d_i^2 - min_j d_j^2)/(2n))``): points far from the data give a finite image instead of
``0 / 0`` when every kernel value underflows.

All tensors live on ``device`` (``"auto"``: CUDA when present, else CPU); numpy at the API.

The module is longer than 500 lines because Definitions 1-6 build on each other (a deep KAHM is
a chain of KAHM cores, a wide one a set of deep ones) and share one fitting path (the numpy and
torch back ends, the job pool): split, the pieces would only import each other back.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError
from threadpoolctl import threadpool_limits

from .._validation import as_matrix
from ..errors import InvalidInputError
from ..manifold.laplacian import resolve_device
from .kernel import (RANK_RTOL, RANK_RTOL_F32, Encoder, check_rank, check_sizes, eigh, eigh_np, fit_encoder,
                     kernel_matrix, resolve_dtype, sq_dists, blas_single_thread)
from .lambda_ import lambda_star
from .persistence import load_state, save_state

__all__ = ["KAHM", "DeepKAHM", "WideKAHM", "KAHMCore", "fit_core", "fit_deep", "fit_wide", "n_branches_for",
           "deep_forward", "wide_forward", "kmeans_partition"]

DEFAULT_CHUNK = 4096


# --------------------------------------------------------------------------------------
# one KAHM (Definition 1) -- the numerical core shared by every model
# --------------------------------------------------------------------------------------

@dataclass
class KAHMCore:
    """Learned state of one KAHM ``A_{Y,n}``.

    ``A(y) = Y^T h(y) / 1^T h(y)`` with ``h(y) = (K + lambda* I)^-1 g(y)`` (eq 38). When ``p <= N`` the
    product ``B = (K + lambda* I)^-1 Y`` is stored; otherwise ``M = (K + lambda* I)^-1`` and ``Y``
    (cheaper to form: the fit then never multiplies an ``N x N`` by an ``N x p`` matrix)."""

    enc: Encoder
    Z: torch.Tensor          # (N, n) whitened training encodings
    b: torch.Tensor          # (N,)   (K + lam I)^-1 1
    lam: float               # lambda*
    e_hat: float
    tau: float
    lambda_iterations: int
    kmax: float              # mu_max(K)
    kmin: float              # mu_min(K)
    y_fro2: float            # ||Y||_F^2
    B: torch.Tensor | None = None   # (N, p)
    M: torch.Tensor | None = None   # (N, N)
    Y: torch.Tensor | None = None   # (N, p), with M
    # kept only on request (the smoother needs them): K's eigenvectors / eigenvalues
    U: torch.Tensor | None = None
    mu: torch.Tensor | None = None
    p_: int = 0

    @property
    def n(self) -> int:
        return self.enc.n

    @property
    def N(self) -> int:
        return int(self.Z.shape[0])

    @property
    def p(self) -> int:
        return int(self.enc.W.shape[1])

    def ratio_bound(self) -> float:
        """``(lambda* + mu_max(K)) / (lambda* + mu_min(K))`` (Theorems 2 and 3)."""
        return (self.lam + self.kmax) / (self.lam + self.kmin)

    def loose_ratio_bound(self) -> float:
        """``1 + p N^2 / (2 ||Y||_F^2)`` (right-hand sides of eqs 46 and 49)."""
        return 1.0 + self.p * self.N ** 2 / (2.0 * self.y_fro2)

    def _weights(self, Yq: torch.Tensor) -> torch.Tensor:
        """``g(y)`` up to a positive factor per row (relative to the nearest training point)."""
        d2 = sq_dists(self.enc.encode(Yq), self.Z)
        d2 = d2 - d2.min(1, keepdim=True).values
        return torch.exp(d2 / (-2.0 * self.n))

    def image_and_den(self, Yq: torch.Tensor, chunk: int = DEFAULT_CHUNK):
        """``A(y)`` for the rows of ``Yq`` and the normaliser ``1^T h(y)`` (up to the row factor of g).

        Rows whose normaliser is not positive (possible when ``lambda*`` is tiny, see the module
        notes on Theorem 2) get a NaN image."""
        outs, dens = [], []
        for s in range(0, Yq.shape[0], chunk):
            G = self._weights(Yq[s:s + chunk])
            if self.B is not None:
                num, den = G @ self.B, G @ self.b
            else:
                w = G @ self.M
                num, den = w @ self.Y, w.sum(1)
            img = num / den[:, None]
            img[~(den > 0)] = float("nan")
            outs.append(img)
            dens.append(den)
        return torch.cat(outs), torch.cat(dens)

    def image(self, Yq: torch.Tensor, chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
        return self.image_and_den(Yq, chunk)[0]

    def h(self, Yq: torch.Tensor) -> torch.Tensor:
        """``h^i(P y)`` of eq 38 for all ``i`` (exact values, no rescaling), shape ``(Q, N)``."""
        g = kernel_matrix(self.enc.encode(Yq), self.Z, self.n)
        if self.M is not None:
            return g @ self.M
        if self.U is not None:
            return ((g @ self.U) / (self.mu + self.lam)) @ self.U.T
        raise InvalidInputError("h() needs (K + lambda I)^-1; refit with keep_eig=True.")

    def spectral_norm_Y(self) -> float:
        if self.Y is None:
            raise InvalidInputError("||Y||_2 needs the training matrix; refit with keep_eig=True.")
        return float(torch.linalg.svdvals(self.Y)[0])

    # ---- persistence -------------------------------------------------------------
    _SCALARS = ("lam", "e_hat", "tau", "lambda_iterations", "kmax", "kmin", "y_fro2")

    def state(self, prefix: str) -> tuple[dict, dict]:
        tensors = {f"{prefix}.Z": self.Z, f"{prefix}.b": self.b, f"{prefix}.mean": self.enc.mean,
                   f"{prefix}.W": self.enc.W, f"{prefix}.eigvals": self.enc.eigvals}
        if self.B is not None:
            tensors[f"{prefix}.B"] = self.B
        else:
            tensors[f"{prefix}.M"] = self.M
            tensors[f"{prefix}.Y"] = self.Y
        scalars = {k: getattr(self, k) for k in self._SCALARS}
        return {k: v.detach().cpu() for k, v in tensors.items()}, scalars

    @classmethod
    def from_state(cls, prefix: str, tensors: dict, scalars: dict, device, dtype) -> "KAHMCore":
        def t(k):
            v = tensors.get(f"{prefix}.{k}")
            return None if v is None else v.to(device=device, dtype=dtype)
        enc = Encoder(mean=t("mean"), W=t("W"), eigvals=t("eigvals"))
        return cls(enc=enc, Z=t("Z"), b=t("b"), B=t("B"), M=t("M"), Y=t("Y"),
                   **{k: (int(scalars[k]) if k == "lambda_iterations" else float(scalars[k])) for k in cls._SCALARS})


def _core_from_encoder(Y: torch.Tensor, enc: Encoder, *, gram: torch.Tensor | None = None, keep_eig: bool = False,
                       record_lambda: bool = False) -> KAHMCore:
    N, p = Y.shape
    n = enc.n
    Z = enc.encode(Y)
    K = kernel_matrix(Z, Z, n)
    mu, U = eigh(K)
    mu = mu.clamp_min(0.0)
    if p > N:
        if gram is None:
            gram = Y @ Y.T
        c = ((gram @ U) * U).sum(0)                        # ||(U^T Y)_k||^2 = (U^T Y Y^T U)_kk
        normsq = float(torch.diagonal(gram).sum())
    else:
        c = ((U.T @ Y) ** 2).sum(1)
        normsq = float((Y * Y).sum())
    lr = lambda_star(mu, c, normsq, N, p, record=record_lambda)
    inv = 1.0 / (mu + lr.lam)
    M = (U * inv[None, :]) @ U.T
    M = 0.5 * (M + M.T)
    b = M.sum(1)
    keep_y = keep_eig or p > N
    core = KAHMCore(enc=enc, Z=Z, b=b, lam=lr.lam, e_hat=lr.e_hat, tau=lr.tau, lambda_iterations=lr.iterations,
                    kmax=float(mu[-1]), kmin=float(mu[0]), y_fro2=normsq,
                    B=None if p > N else M @ Y, M=M if (p > N or keep_eig) else None, Y=Y if keep_y else None,
                    U=U if keep_eig else None, mu=mu if keep_eig else None)
    if record_lambda:
        core.lambda_history = lr.history  # type: ignore[attr-defined]
    return core


#: CPU fits with at most this many rows run the same arithmetic in numpy: torch's per-operation
#: overhead (10-50 us on small tensors here) dominates tiny problems, numpy's is a few us.
NUMPY_MAX_N = 128


def _use_numpy(Y: torch.Tensor, backend: str | None) -> bool:
    if backend is None:
        return Y.device.type == "cpu" and Y.shape[0] <= NUMPY_MAX_N
    if backend not in ("numpy", "torch"):
        raise InvalidInputError(f"backend must be 'numpy' or 'torch'; got {backend!r}.")
    if backend == "numpy" and Y.device.type != "cpu":
        raise InvalidInputError("the numpy backend needs CPU tensors.")
    return backend == "numpy"


def _np_threads(Y):
    """numpy's BLAS on one thread for the whole numpy fit (its idle threads would otherwise spin
    beside torch's); skipped for tiny inputs, where switching costs more than it saves."""
    return blas_single_thread() if Y.shape[0] >= 64 or Y.shape[0] * Y.shape[1] >= 20_000 else nullcontext()


def _fit_layers_numpy(Yt: torch.Tensor, ns: list[int], *, what: str, keep_eig: bool,
                      record_lambda: bool) -> list[KAHMCore]:
    """numpy twin of :func:`fit_encoder` + :func:`_core_from_encoder` (same formulas, same LAPACK)."""
    Y = Yt.detach().numpy()
    N, p = Y.shape
    n = ns[0]
    check_sizes(N, p, n, what)
    rtol = RANK_RTOL if Y.dtype == np.float64 else RANK_RTOL_F32
    mean = Y.mean(0)
    Yc = Y - mean
    gram = Y @ Y.T if p > N else None
    if p <= N:
        top, vecs = eigh_np(Yc.T @ Yc, n)
    else:
        r = gram.mean(1)
        top, U = eigh_np(gram - r[:, None] - r[None, :] + r.mean(), n)
    check_rank(top, n, N, what, rtol)
    if p > N:
        vecs = (Yc.T @ U) / np.sqrt(top)[None, :]
    cov = top / (N - 1)
    Wfull = np.ascontiguousarray((vecs / np.sqrt(cov)[None, :]).T)
    normsq = float(np.trace(gram)) if p > N else float((Y * Y).sum())
    T = torch.from_numpy
    mean_t = T(mean)
    cores = []
    for k in ns:
        W = np.ascontiguousarray(Wfull[:k])
        Z = Yc @ W.T
        sq = (Z * Z).sum(1)
        D = sq[:, None] + sq[None, :] - 2.0 * (Z @ Z.T)
        K = np.exp(np.maximum(D, 0.0) / (-2.0 * k))
        mu, V = eigh_np(K)
        mu = np.maximum(mu, 0.0)
        c = ((gram @ V) * V).sum(0) if p > N else ((V.T @ Y) ** 2).sum(1)
        lr = lambda_star(mu, c, normsq, N, p, record=record_lambda)
        M = (V / (mu + lr.lam).astype(Y.dtype)[None, :]) @ V.T
        M = 0.5 * (M + M.T)
        b = M.sum(1)
        keep_y = keep_eig or p > N
        enc = Encoder(mean=mean_t, W=T(W), eigvals=T(np.ascontiguousarray(cov[:k])))
        core = KAHMCore(enc=enc, Z=T(np.ascontiguousarray(Z)), b=T(b), lam=lr.lam, e_hat=lr.e_hat, tau=lr.tau,
                        lambda_iterations=lr.iterations, kmax=float(mu[-1]), kmin=float(mu[0]), y_fro2=normsq,
                        B=None if p > N else T(M @ Y), M=T(M) if (p > N or keep_eig) else None,
                        Y=Yt if keep_y else None, U=T(V) if keep_eig else None, mu=T(mu) if keep_eig else None)
        if record_lambda:
            core.lambda_history = lr.history  # type: ignore[attr-defined]
        cores.append(core)
    return cores


def fit_core(Y: torch.Tensor, n: int, *, what: str = "Y", keep_eig: bool = False,
             record_lambda: bool = False, backend: str | None = None) -> KAHMCore:
    """Fit one KAHM ``A_{Y,n}`` (Definition 1) on the rows of the tensor ``Y``.

    ``backend``: None (torch; numpy for CPU problems of at most :data:`NUMPY_MAX_N` rows), or
    force ``"torch"`` / ``"numpy"``."""
    if _use_numpy(Y, backend):
        with _np_threads(Y):
            return _fit_layers_numpy(Y, [n], what=what, keep_eig=keep_eig, record_lambda=record_lambda)[0]
    gram = Y @ Y.T if Y.shape[1] > Y.shape[0] else None
    enc = fit_encoder(Y, n, what=what, gram=gram)
    return _core_from_encoder(Y, enc, gram=gram, keep_eig=keep_eig, record_lambda=record_lambda)


def fit_deep(Y: torch.Tensor, n: int, L: int, *, what: str = "Y", backend: str | None = None) -> list[KAHMCore]:
    """The ``L`` KAHMs ``A_{Y,n}, A_{Y,n-1}, ..., A_{Y,n-L+1}`` of a conditionally deep KAHM.

    Every layer is a KAHM on the same ``Y``, so one PCA (and one Gram matrix) serves all of them."""
    if L < 1 or L > n:
        raise InvalidInputError(f"number of layers L={L} must satisfy 1 <= L <= n = {n} (Definition 3).")
    if _use_numpy(Y, backend):
        with _np_threads(Y):
            return _fit_layers_numpy(Y, list(range(n, n - L, -1)), what=what, keep_eig=False, record_lambda=False)
    gram = Y @ Y.T if Y.shape[1] > Y.shape[0] else None
    full = fit_encoder(Y, n, what=what, gram=gram)
    layers = []
    for k in range(n, n - L, -1):
        enc = Encoder(mean=full.mean, W=full.W[:k].contiguous(), eigvals=full.eigvals[:k])
        layers.append(_core_from_encoder(Y, enc, gram=gram))
    return layers


def deep_forward(layers: list[KAHMCore], Yq: torch.Tensor, chunk: int = DEFAULT_CHUNK):
    """``(D(y), Gamma_D(y), l_hat)`` of eqs 50-53 for the rows of ``Yq``."""
    best_img = None
    best_d = torch.full((Yq.shape[0],), float("inf"), dtype=Yq.dtype, device=Yq.device)
    best_l = torch.zeros(Yq.shape[0], dtype=torch.long, device=Yq.device)
    cur = Yq
    for li, core in enumerate(layers):
        cur = core.image(cur, chunk)
        d = torch.linalg.vector_norm(Yq - cur, dim=1)
        d = torch.where(torch.isfinite(d), d, torch.full_like(d, float("inf")))
        better = d < best_d
        if best_img is None:
            best_img = cur.clone()
        else:
            best_img[better] = cur[better]
        best_d = torch.where(better, d, best_d)
        best_l = torch.where(better, torch.full_like(best_l, li), best_l)
    return best_img, best_d, best_l


def wide_forward(branches: list[list[KAHMCore]], Yq: torch.Tensor, chunk: int = DEFAULT_CHUNK,
                 need_image: bool = True):
    """``(W(y), Gamma_W(y), s_hat)`` of eqs 55-56 / 60."""
    best_img = None
    best_d = torch.full((Yq.shape[0],), float("inf"), dtype=Yq.dtype, device=Yq.device)
    best_s = torch.zeros(Yq.shape[0], dtype=torch.long, device=Yq.device)
    for si, layers in enumerate(branches):
        img, d, _ = deep_forward(layers, Yq, chunk)
        better = d < best_d
        if need_image:
            if best_img is None:
                best_img = img
            else:
                best_img[better] = img[better]
        best_d = torch.where(better, d, best_d)
        best_s = torch.where(better, torch.full_like(best_s, si), best_s)
    return best_img, best_d, best_s


# --------------------------------------------------------------------------------------
# k-means branches (eqs 57-59)
# --------------------------------------------------------------------------------------

def n_branches_for(N: int, branch_size: int = 1000) -> int:
    """``S = ceil(N / branch_size)`` (eq 59 with ``branch_size = 1000``)."""
    return max(1, math.ceil(N / branch_size))


def kmeans_partition(Y: np.ndarray, S: int, *, min_size: int, random_state: int | None = 0) -> list[np.ndarray]:
    """k-means into ``S`` clusters (eq 58); clusters smaller than ``min_size`` are dissolved into
    the nearest remaining centroid so that every branch can carry a KAHM of dimension ``n``."""
    N = Y.shape[0]
    if S <= 1 or N < 2 * min_size:
        return [np.arange(N)]
    from sklearn.cluster import KMeans
    km = KMeans(n_clusters=S, n_init=3, random_state=random_state).fit(Y)
    labels = km.labels_.copy()
    centers = km.cluster_centers_.copy()
    alive = list(range(S))
    while True:
        counts = np.bincount(labels, minlength=S)
        small = [c for c in alive if counts[c] < min_size]
        if not small or len(alive) == 1:
            break
        c = min(small, key=lambda k: counts[k])
        alive.remove(c)
        idx = np.flatnonzero(labels == c)
        if idx.size:
            d = ((Y[idx, None, :] - centers[None, alive, :]) ** 2).sum(-1)
            labels[idx] = np.asarray(alive)[d.argmin(1)]
            for a in alive:
                members = labels == a
                centers[a] = Y[members].mean(0)
    return [np.flatnonzero(labels == c) for c in alive if np.any(labels == c)]


def fit_wide(Y: np.ndarray, n: int, L: int, *, branch_size: int = 1000, n_branches: int | None = None,
             random_state: int | None = 0, n_jobs: int = 1, device=None, dtype=torch.float64,
             what: str = "Y") -> tuple[list[list[KAHMCore]], list[np.ndarray]]:
    """Fit a wide conditionally deep KAHM: k-means branches, one deep KAHM per branch.

    Branches are independent; ``n_jobs > 1`` fits them on a thread pool (torch releases the GIL)."""
    S = n_branches if n_branches is not None else n_branches_for(Y.shape[0], branch_size)
    parts = kmeans_partition(Y, S, min_size=n + 1, random_state=random_state)
    jobs = [(torch.as_tensor(Y[idx], dtype=dtype, device=device),
             f"{what}, branch {si} ({len(idx)} points)" if len(parts) > 1 else what) for si, idx in enumerate(parts)]
    branches = run_jobs([lambda Yt=Yt, w=w: fit_deep(Yt, n, L, what=w) for Yt, w in jobs], n_jobs)
    return branches, parts


@contextmanager
def _single_threaded_kernels():
    """torch and the BLAS/LAPACK libraries on one thread each (process-wide, restored after).

    Used while independent fits run side by side on a thread pool: one single-threaded solve per
    core beats nested OpenMP teams, which spin and thrash on a busy machine (measured in
    docs/benchmarks.md, "Figures behind design choices in the code")."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        torch.set_num_threads(n)


_LOCAL = threading.local()


def _in_pool(f):
    _LOCAL.in_pool = True
    try:
        return f()
    finally:
        _LOCAL.in_pool = False


def run_jobs(fns, n_jobs: int = 1):
    """Run independent callables sequentially or on a thread pool, preserving order.

    With ``n_jobs > 1`` each job runs single-threaded (see :func:`_single_threaded_kernels`);
    with ``n_jobs == 1`` each job may use torch's intra-op threads instead."""
    n_jobs = _resolve_jobs(n_jobs)
    if n_jobs == 1 or len(fns) <= 1 or getattr(_LOCAL, "in_pool", False):
        return [f() for f in fns]
    with _single_threaded_kernels(), ThreadPoolExecutor(max_workers=min(n_jobs, len(fns))) as ex:
        return list(ex.map(_in_pool, fns))


def _resolve_jobs(n_jobs) -> int:
    if n_jobs is None:
        return 1
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, (int, np.integer)) or n_jobs == 0 or n_jobs < -1:
        raise InvalidInputError(f"n_jobs must be a positive int or -1 (all cores); got {n_jobs!r}.")
    return (os.cpu_count() or 1) if n_jobs == -1 else int(n_jobs)


# --------------------------------------------------------------------------------------
# scikit-learn style estimators
# --------------------------------------------------------------------------------------

def check_int(name, v, lo=1):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise InvalidInputError(f"{name} must be an integer >= {lo}; got {v!r}.")
    return int(v)


class KAHMEstimatorBase(BaseEstimator):
    """Shared plumbing: validation, device/dtype, persistence."""

    _kind = "base"

    def _setup(self):
        self.device_ = resolve_device(getattr(self, "device", None))
        self.dtype_ = resolve_dtype(getattr(self, "dtype", "float64"))
        self._chunk = check_int("chunk_size", getattr(self, "chunk_size", DEFAULT_CHUNK))

    def _check_fitted(self):
        if not hasattr(self, "n_features_in_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit(...) first.")

    def _tensor(self, X, name="X") -> torch.Tensor:
        X = as_matrix(X, name)
        if X.shape[1] != self.n_features_in_:
            raise InvalidInputError(f"{name} has {X.shape[1]} features but this {type(self).__name__} was fitted "
                                    f"on {self.n_features_in_}.")
        return torch.as_tensor(X, dtype=self.dtype_, device=self.device_)

    # persistence: subclasses define _state() -> (tensors, meta) and _restore(tensors, meta)
    def save(self, path) -> None:
        """Write params (JSON) and learned tensors to ``path`` with ``torch.save`` (no pickled objects)."""
        self._check_fitted()
        tensors, meta = self._state()
        save_state(path, kind=self._kind, params=self.get_params(), meta=meta, tensors=tensors)

    @classmethod
    def load(cls, path, device=None):
        """Reload a model written by :meth:`save` (``torch.load(weights_only=True)``)."""
        kind, params, meta, tensors = load_state(path)
        if kind != cls._kind:
            raise InvalidInputError(f"{path} holds a {kind!r} model, not a {cls._kind!r} ({cls.__name__}).")
        if device is not None:
            params["device"] = device
        obj = cls(**params)
        obj._setup()
        obj._restore(tensors, meta)
        return obj


class KAHM(KAHMEstimatorBase):
    """Kernel affine hull machine ``A_{Y,n}`` (Definition 1).

    Parameters
    ----------
    n_components : int
        Subspace dimension ``n`` (``1 <= n <= p``; the data need ``N >= n+1`` points spanning at
        least ``n`` directions).
    device : "auto", "cpu", "cuda", ...
    dtype : "float64" (default) or "float32".
    chunk_size : int
        Query rows per kernel block.

    Learned attributes: ``n_features_in_``, ``n_samples_``, ``lambda_`` (``lambda*``), ``e_hat_``,
    ``lambda_iterations_``, ``kernel_eig_max_``, ``kernel_eig_min_``, ``ratio_bound_`` (Thm 3),
    ``image_bound_`` (Thm 2), ``core_``.

    ``predict(Y)`` returns the image ``A(Y)``; ``distance(Y)`` the distance function
    ``Gamma_A(y) = ||y - A(y)||`` (Definition 2); ``score(Y)`` is ``-mean Gamma_A`` (higher is
    closer to the data).
    """

    _kind = "kahm"

    def __init__(self, n_components: int = 20, *, device="auto", dtype="float64", chunk_size: int = DEFAULT_CHUNK):
        self.n_components = n_components
        self.device = device
        self.dtype = dtype
        self.chunk_size = chunk_size

    def fit(self, Y, y=None):
        self._setup()
        n = check_int("n_components", self.n_components)
        Y = as_matrix(Y, "Y")
        Yt = torch.as_tensor(Y, dtype=self.dtype_, device=self.device_)
        self.core_ = fit_core(Yt, n)
        if self.core_.Y is None:
            self.core_.Y = Yt                  # kept for image_bound()
        self._set_attrs()
        return self

    def _set_attrs(self):
        c = self.core_
        self.n_features_in_ = c.p
        self.n_samples_ = c.N
        self.lambda_ = c.lam
        self.e_hat_ = c.e_hat
        self.lambda_iterations_ = c.lambda_iterations
        self.kernel_eig_max_ = c.kmax
        self.kernel_eig_min_ = c.kmin
        self.ratio_bound_ = c.ratio_bound()

    def image_bound(self) -> float:
        """``||Y||_2 (lambda* + mu_max(K)) / (lambda* + mu_min(K))``: Theorem 2's bound on ``||A(y)||``."""
        self._check_fitted()
        return self.core_.spectral_norm_Y() * self.core_.ratio_bound()

    def predict(self, Y) -> np.ndarray:
        """The image ``A(y)`` of each row (eq 33). Rows where ``sum_i h^i(Py) <= 0`` have no image: NaN."""
        self._check_fitted()
        return self.core_.image(self._tensor(Y, "Y"), self._chunk).cpu().numpy()

    transform = predict

    def distance(self, Y) -> np.ndarray:
        """``Gamma_A(y) = ||y - A(y)||`` (eq 48); ``inf`` where the image is undefined."""
        self._check_fitted()
        Yt = self._tensor(Y, "Y")
        d = torch.linalg.vector_norm(Yt - self.core_.image(Yt, self._chunk), dim=1)
        return torch.nan_to_num(d, nan=float("inf")).cpu().numpy()

    def score(self, Y, y=None) -> float:
        return -float(np.mean(self.distance(Y)))

    def _state(self):
        t, s = self.core_.state("core")
        if self.core_.Y is not None and "core.Y" not in t:
            t["core.Y"] = self.core_.Y.detach().cpu()
        return t, {"core": s}

    def _restore(self, tensors, meta):
        self.core_ = KAHMCore.from_state("core", tensors, meta["core"], self.device_, self.dtype_)
        self._set_attrs()


class DeepKAHM(KAHMEstimatorBase):
    """Conditionally deep KAHM ``D_{Y,n,L}`` (Definition 3): layers ``A_{Y,n}, ..., A_{Y,n-L+1}``
    composed, output = the layer image closest to the input; ``distance`` = ``Gamma_D`` (Def 4)."""

    _kind = "deep_kahm"

    def __init__(self, n_components: int = 20, n_layers: int = 5, *, device="auto", dtype="float64",
                 chunk_size: int = DEFAULT_CHUNK):
        self.n_components = n_components
        self.n_layers = n_layers
        self.device = device
        self.dtype = dtype
        self.chunk_size = chunk_size

    def fit(self, Y, y=None):
        self._setup()
        n = check_int("n_components", self.n_components)
        L = check_int("n_layers", self.n_layers)
        Y = as_matrix(Y, "Y")
        self.layers_ = fit_deep(torch.as_tensor(Y, dtype=self.dtype_, device=self.device_), n, L)
        self.n_features_in_ = Y.shape[1]
        self.n_samples_ = Y.shape[0]
        return self

    def _forward(self, Y):
        self._check_fitted()
        return deep_forward(self.layers_, self._tensor(Y, "Y"), self._chunk)

    def predict(self, Y) -> np.ndarray:
        return self._forward(Y)[0].cpu().numpy()

    transform = predict

    def distance(self, Y) -> np.ndarray:
        return self._forward(Y)[1].cpu().numpy()

    def best_layer(self, Y) -> np.ndarray:
        """``l_hat(y)`` (eq 52), 0-based."""
        return self._forward(Y)[2].cpu().numpy()

    def score(self, Y, y=None) -> float:
        return -float(np.mean(self.distance(Y)))

    def _state(self):
        tensors, layers = {}, []
        for li, core in enumerate(self.layers_):
            t, s = core.state(f"l{li}")
            tensors.update(t)
            layers.append(s)
        return tensors, {"layers": layers, "n_features_in": self.n_features_in_, "n_samples": self.n_samples_}

    def _restore(self, tensors, meta):
        self.layers_ = [KAHMCore.from_state(f"l{li}", tensors, s, self.device_, self.dtype_)
                        for li, s in enumerate(meta["layers"])]
        self.n_features_in_ = int(meta["n_features_in"])
        self.n_samples_ = int(meta["n_samples"])


class WideKAHM(KAHMEstimatorBase):
    """Wide conditionally deep KAHM ``W_{Y,n,L,S}`` (Definition 5).

    ``S = ceil(N / branch_size)`` k-means branches (``branch_size=1000`` as in eq 59) unless
    ``n_branches`` is given; each branch is an independent :class:`DeepKAHM`; output = the branch
    image closest to the input; ``distance`` = ``Gamma_W`` (Definition 6). ``n_jobs`` branches are
    fitted at once on a thread pool, each single-threaded (``-1``: all cores; ``1``: one after the
    other, torch's own threads inside). ``random_state`` seeds k-means (public bookkeeping).
    """

    _kind = "wide_kahm"

    def __init__(self, n_components: int = 20, n_layers: int = 5, branch_size: int = 1000,
                 n_branches: int | None = None, *, random_state: int | None = 0, n_jobs: int = -1,
                 device="auto", dtype="float64", chunk_size: int = DEFAULT_CHUNK):
        self.n_components = n_components
        self.n_layers = n_layers
        self.branch_size = branch_size
        self.n_branches = n_branches
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.device = device
        self.dtype = dtype
        self.chunk_size = chunk_size

    def fit(self, Y, y=None):
        self._setup()
        n = check_int("n_components", self.n_components)
        L = check_int("n_layers", self.n_layers)
        bs = check_int("branch_size", self.branch_size)
        S = None if self.n_branches is None else check_int("n_branches", self.n_branches)
        Y = as_matrix(Y, "Y")
        self.branches_, parts = fit_wide(Y, n, L, branch_size=bs, n_branches=S, random_state=self.random_state,
                                         n_jobs=self.n_jobs, device=self.device_, dtype=self.dtype_)
        self.branch_sizes_ = [int(len(p)) for p in parts]
        self.n_features_in_ = Y.shape[1]
        self.n_samples_ = Y.shape[0]
        return self

    def _forward(self, Y, need_image=True):
        self._check_fitted()
        return wide_forward(self.branches_, self._tensor(Y, "Y"), self._chunk, need_image=need_image)

    def predict(self, Y) -> np.ndarray:
        return self._forward(Y)[0].cpu().numpy()

    transform = predict

    def distance(self, Y) -> np.ndarray:
        return self._forward(Y, need_image=False)[1].cpu().numpy()

    def best_branch(self, Y) -> np.ndarray:
        return self._forward(Y, need_image=False)[2].cpu().numpy()

    def score(self, Y, y=None) -> float:
        return -float(np.mean(self.distance(Y)))

    def _state(self):
        tensors, branches = {}, []
        for si, layers in enumerate(self.branches_):
            metas = []
            for li, core in enumerate(layers):
                t, s = core.state(f"s{si}.l{li}")
                tensors.update(t)
                metas.append(s)
            branches.append(metas)
        return tensors, {"branches": branches, "branch_sizes": self.branch_sizes_,
                         "n_features_in": self.n_features_in_, "n_samples": self.n_samples_}

    def _restore(self, tensors, meta):
        self.branches_ = [[KAHMCore.from_state(f"s{si}.l{li}", tensors, s, self.device_, self.dtype_)
                           for li, s in enumerate(metas)] for si, metas in enumerate(meta["branches"])]
        self.branch_sizes_ = list(meta["branch_sizes"])
        self.n_features_in_ = int(meta["n_features_in"])
        self.n_samples_ = int(meta["n_samples"])


