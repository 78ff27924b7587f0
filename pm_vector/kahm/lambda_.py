"""Regularisation parameter of kernel regularised least squares (Section 3.2, Theorem 1).

``R(e, tau) = (1/pN) sum_j ||Y_:,j - K (K + (e + tau) I)^-1 Y_:,j||^2``          (eq 21 / 42)

With the eigendecomposition ``K = U diag(mu) U^T`` and ``c_k = ||(U^T Y)_k,:||^2``,

``R(e, tau) = (1/pN) sum_k c_k (e + tau)^2 / (e + tau + mu_k)^2``,

so one ``O(N^3)`` eigendecomposition serves every iteration. With ``tau = 2 ||Y||_F^2 / (pN)``
(eq 24 at equality) the map ``e -> R(e, tau)`` is a contraction on ``(0, ||Y||_F^2 / (pN))``
(eq 23 gives ``0 < dR/de < 2 R / (e + tau) < 1``) and the iterations ``e_{t+1} = R(e_t)`` from
any ``e_0`` in that interval converge to the unique fixed point ``e_hat``; then
``lambda* = e_hat + tau`` (eq 28 / 40).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import InvalidInputError

__all__ = ["LambdaResult", "residual", "residual_dense", "lambda_star"]


@dataclass
class LambdaResult:
    lam: float            # lambda* = e_hat + tau
    e_hat: float          # fixed point of R(., tau)
    tau: float            # 2 ||Y||_F^2 / (pN)
    upper: float          # ||Y||_F^2 / (pN): R maps into (0, upper)
    iterations: int
    converged: bool
    history: list = field(default_factory=list)  # e_0, e_1, ... (only when record=True)


def residual(e: float, tau: float, mu, c, pN: int) -> float:
    """``R(e, tau)`` from the kernel's eigenvalues ``mu`` and ``c_k = ||(U^T Y)_k,:||^2``."""
    s = e + tau
    mu = np.asarray(mu.cpu() if isinstance(mu, torch.Tensor) else mu, dtype=np.float64)
    c = np.asarray(c.cpu() if isinstance(c, torch.Tensor) else c, dtype=np.float64)
    r = s / (s + mu)
    return float(c @ (r * r)) / pN


def residual_dense(K: torch.Tensor, Y: torch.Tensor, e: float, tau: float) -> float:
    """``R(e, tau)`` straight from eq 21 with a linear solve (reference for tests)."""
    N, p = Y.shape
    fit = K @ torch.linalg.solve(K + (e + tau) * torch.eye(N, dtype=K.dtype, device=K.device), Y)
    return float(((Y - fit) ** 2).sum()) / (p * N)


def _np64(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def lambda_star(mu: torch.Tensor, c: torch.Tensor, normsq: float, N: int, p: int, *, tol: float = 1e-12,
                max_iter: int = 10_000, e0: float | None = None, record: bool = False) -> LambdaResult:
    """Iterate eq 43 from ``e0`` (default: the middle of ``(0, ||Y||_F^2/(pN))``, eq 44).

    ``mu``: eigenvalues of ``K``; ``c_k = ||(U^T Y)_k,:||^2`` for its eigenvectors ``U``;
    ``normsq = ||Y||_F^2``."""
    pN = p * N
    if not normsq > 0.0:
        raise InvalidInputError("Y is all zeros: ||Y||_F = 0 leaves lambda* = 0 and the KAHM undefined.")
    upper = normsq / pN
    tau = 2.0 * upper
    mu = np.clip(_np64(mu), 0.0, None)
    c = _np64(c)
    e = 0.5 * upper if e0 is None else float(e0)
    if not 0.0 < e < upper:
        raise InvalidInputError(f"e0 must lie in (0, ||Y||_F^2/(pN)) = (0, {upper:.6g}) (eq 44); got {e0}.")
    hist = [e] if record else []
    converged = False
    it = 0
    c = c / pN
    for it in range(1, max_iter + 1):
        s = e + tau                                   # e_{t+1} = R(e_t, tau), eq 43
        r = s / (s + mu)
        e_new = float(c @ (r * r))
        if record:
            hist.append(e_new)
        done = abs(e_new - e) <= tol * max(e_new, 1e-300)
        e = e_new
        if done:
            converged = True
            break
    return LambdaResult(lam=e + tau, e_hat=e, tau=tau, upper=upper, iterations=it, converged=converged, history=hist)
