"""PCA encoding and the Mahalanobis Gaussian kernel of a KAHM (Definition 1, eqs 35-36).

The encoding matrix ``P`` (``n x p``) holds the eigenvectors of the sample covariance of the
rows of ``Y`` for its ``n`` largest eigenvalues. The sample covariance of the encodings
``P y`` is then ``theta = diag(mu_1 .. mu_n)`` (those eigenvalues, eq 36, divisor ``N - 1``),
so the kernel of eq 35

    k(x_i, x_j) = exp(-(1 / (2 n)) (x_i - x_j)^T theta^-1 (x_i - x_j))

is a plain Gaussian ``exp(-||z_i - z_j||^2 / (2 n))`` of the *whitened* encodings
``z = theta^-1/2 P (y - mean)`` (centring cancels in the differences).

Degenerate data: ``theta`` must be invertible, i.e. the rows must span at least ``n``
dimensions. Too few points (``N <= n``), constant features that leave fewer than ``n``
varying directions, or repeated rows raise :class:`~pm_vector.errors.InvalidInputError`
with the rank found, instead of a whitening by ``1/0`` that would give NaNs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from threadpoolctl import ThreadpoolController

from ..errors import InvalidInputError

__all__ = ["Encoder", "fit_encoder", "kernel_matrix", "sq_dists", "resolve_dtype", "RANK_RTOL"]

#: an eigenvalue of the covariance below ``RANK_RTOL * largest`` counts as zero (float64)
RANK_RTOL = 1e-10
RANK_RTOL_F32 = 1e-5

_DTYPES = {"float64": torch.float64, "float32": torch.float32, "double": torch.float64, "float": torch.float32}


def resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.float64):
            raise InvalidInputError(f"dtype must be float32 or float64; got {dtype}.")
        return dtype
    key = str(dtype).replace("torch.", "")
    if key not in _DTYPES:
        raise InvalidInputError(f"dtype must be 'float64' or 'float32'; got {dtype!r}.")
    return _DTYPES[key]


@dataclass
class Encoder:
    """``z = (y - mean) @ W.T`` with ``W = theta^-1/2 P`` (``n x p``); ``eigvals`` = diag(theta)."""

    mean: torch.Tensor      # (p,)
    W: torch.Tensor         # (n, p)
    eigvals: torch.Tensor   # (n,) sample-covariance eigenvalues, descending

    @property
    def n(self) -> int:
        return int(self.W.shape[0])

    def encode(self, Y: torch.Tensor) -> torch.Tensor:
        return (Y - self.mean) @ self.W.T


_CONTROLLER = None


def blas_single_thread():
    """Context: BLAS/LAPACK libraries (scipy's, torch's MKL/OpenMP) on one thread."""
    global _CONTROLLER
    if _CONTROLLER is None:
        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1)


_SMALL = 64        # below this LAPACK stays single-threaded anyway; switching thread limits costs ~0.1 ms


def _lapack_eigh(a: np.ndarray, k: int | None):
    from scipy.linalg import lapack
    m = a.shape[0]
    if k is None or k >= m or m <= 256 or 4 * k > m:     # MRRR subsets only pay off for large m
        syevd, = lapack.get_lapack_funcs(("syevd",), (a,))
        w, V, info = syevd(a, compute_v=1, lower=1)
        if k is not None:
            w, V = w[m - k:], V[:, m - k:]
    else:
        syevr, = lapack.get_lapack_funcs(("syevr",), (a,))
        w, V, _, _, info = syevr(a, compute_v=1, range="I", il=m - k + 1, iu=m, lower=1)
        w, V = w[:k], V[:, :k]
    if info != 0:
        raise InvalidInputError(f"the symmetric eigensolver failed (LAPACK info={info}); the matrix is not finite "
                                f"or badly scaled.")
    return w, V


def eigh(S: torch.Tensor, k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenpairs of the symmetric ``S``: all (ascending) when ``k`` is None, else the ``k``
    largest (descending).

    CPU: LAPACK (``?syevd`` for all pairs, ``?syevr`` for a subset) on **one thread**: on the
    2-core machines measured here a threaded symmetric eigensolver of size 1000 was 3-10x slower
    than a single-threaded one whenever anything else ran. Other devices: ``torch.linalg.eigh``."""
    m = S.shape[0]
    if S.device.type == "cpu":
        a = S.detach().numpy()
        if m < _SMALL:
            w, V = _lapack_eigh(a, k)
        else:
            with blas_single_thread():
                w, V = _lapack_eigh(a, k)
        w = torch.from_numpy(np.ascontiguousarray(w))
        V = torch.from_numpy(np.ascontiguousarray(V))
        if k is None:
            return w, V
        return w.flip(0)[:k], V.flip(1)[:, :k]
    w, V = torch.linalg.eigh(S)
    if k is None:
        return w, V
    return w.flip(0)[:k], V.flip(1)[:, :k]


def _top_eigh(S: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest eigenpairs of the symmetric ``S``, descending."""
    return eigh(S, k)


def check_sizes(N: int, p: int, n: int, what: str) -> None:
    if n < 1 or n > p:
        raise InvalidInputError(f"subspace dimension n={n} must satisfy 1 <= n <= p = {p} (number of features of {what}).")
    if N < n + 1:
        raise InvalidInputError(
            f"{what} has {N} point(s); a KAHM with subspace dimension n={n} needs at least n+1 = {n + 1} "
            f"points (the covariance of N points has rank <= N-1). Lower n to at most {max(N - 1, 0)} or add points.")


def check_rank(top: np.ndarray, n: int, N: int, what: str, rtol: float) -> None:
    """``top``: the ``n`` largest covariance (or Gram) eigenvalues, descending."""
    lead = float(top[0])
    if not np.isfinite(lead) or lead <= 0.0:
        raise InvalidInputError(
            f"{what} has zero variance: all {N} rows are identical (constant features). A KAHM needs points "
            f"that vary in at least n={n} directions.")
    rank = int((top > rtol * lead).sum())
    if rank < n:
        raise InvalidInputError(
            f"{what} varies in only {rank} direction(s) (constant features, repeated rows or too few points), "
            f"fewer than the subspace dimension n={n}: the kernel's covariance theta (eq 36) would be singular. "
            f"Lower n to at most {rank}, or drop constant features / add points.")


def eigh_np(a: np.ndarray, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """numpy twin of :func:`eigh` (same LAPACK calls; the caller sets the thread policy)."""
    w, V = _lapack_eigh(a, k)
    if k is None:
        return w, V
    return w[::-1][:k], V[:, ::-1][:, :k]


def fit_encoder(Y: torch.Tensor, n: int, *, what: str = "Y", gram: torch.Tensor | None = None) -> Encoder:
    """Top-``n`` PCA of the rows of ``Y`` (``N x p``), whitened. Exact (symmetric eigensolver).

    Uses the ``p x p`` covariance when ``p <= N`` and the ``N x N`` Gram matrix otherwise
    (``gram`` = the uncentred ``Y Y^T`` when the caller already has it), so the cost is
    ``O(N p min(N, p))``.
    """
    N, p = Y.shape
    check_sizes(N, p, n, what)
    mean = Y.mean(0)
    Yc = Y - mean
    rtol = RANK_RTOL if Y.dtype == torch.float64 else RANK_RTOL_F32
    if p <= N:
        top, vecs = _top_eigh(Yc.T @ Yc, n)               # vecs: (p, n)
        U = None
    else:
        if gram is None:
            Gc = Yc @ Yc.T
        else:                                              # double centring of the raw Gram
            r = gram.mean(1)
            Gc = gram - r[:, None] - r[None, :] + r.mean()   # LAPACK reads one triangle only
        top, U = _top_eigh(Gc, n)
        vecs = None
    check_rank(np.asarray(top.cpu()), n, N, what, rtol)
    if vecs is None:
        # covariance eigenvectors from Gram eigenvectors: v_k = Yc^T u_k / sqrt(s_k)
        vecs = (Yc.T @ U) / torch.sqrt(top)[None, :]
    mu = top / (N - 1)                                     # eigenvalues of the sample covariance
    W = (vecs / torch.sqrt(mu)[None, :]).T.contiguous()   # theta^-1/2 P
    return Encoder(mean=mean, W=W, eigvals=mu)


def sq_dists(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Pairwise squared Euclidean distances (clamped at 0 against rounding)."""
    d2 = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * (A @ B.T)
    return d2.clamp_min_(0.0)


def kernel_matrix(Za: torch.Tensor, Zb: torch.Tensor, n: int) -> torch.Tensor:
    """``exp(-||za - zb||^2 / (2 n))`` on whitened encodings (eq 35)."""
    return torch.exp(sq_dists(Za, Zb) / (-2.0 * n))
