"""Differential privacy for KAHMs: the optimal noise of Result 1, Algorithm 1, the smoother of
Definition 13 with the stopping rule of eq 92, and fabricated data (Definition 14, Remark 4).

Optimal noise (Result 1, eqs 74-76)
    Each element gets ``v`` with an **atom of probability mass delta at v = 0** and, with
    probability ``1 - delta``, a Laplace draw of scale ``d / epsilon``:

        f(v) = delta * Dirac(v) + (1 - delta) * epsilon/(2d) * exp(-epsilon |v| / d).

    The CDF (eq 75) jumps from ``(1-delta)/2`` to ``(1+delta)/2`` at 0, so the inverse CDF
    (eq 76) maps every ``t`` in ``[(1-delta)/2, (1+delta)/2]`` to 0. Expected magnitude
    ``(1 - delta) d / epsilon`` (eq 2). Samples come from ``t ~ U(0, 1)`` drawn from
    :func:`pm_vector.privacy.secure_generator` (the OS CSPRNG by default).

    Guarantee (Definition 11, element-level d-adjacency of Definition 10): for two inputs that
    differ by ``|s| <= d`` in one element, ``P(O) <= e^epsilon P'(O) + delta`` for every event.
    The Laplace parts have likelihood ratio ``<= e^(epsilon |s| / d)``; the only excess is the
    atom, which sits at the true value (mass ``delta`` that the neighbour puts elsewhere).
    :meth:`OptimalNoise.hockey_stick` computes ``sup_O P(O) - e^epsilon P'(O)`` numerically.
    Note the unit: one *element* of the matrix. A whole row of ``p`` elements changes by
    composition with up to ``p * epsilon`` (and ``p * delta``).

Smoother ``T_{n,M}`` (Definition 13)
    ``Y_{m+1} = H_m Y_m`` with ``H_m = K_m (K_m + lambda*_m I)^-1`` (eq 187 with eq 175; ``K_m``
    the kernel of Definition 1 rebuilt on ``Y_m``: new PCA, new theta, new lambda*).
    ``T_{n,M}(Y+) = Y_{M-1}`` is the result of ``M - 1`` smoothing steps (so ``T_{n,1}`` is the
    identity -- the indexing that makes eqs 85, 87 and 92 consistent; Def 13's "recursions run
    from m = 0 to m = M - 1" would produce ``Y_M``).

Fabricated data (Definition 14)
    ``M~ = min{m >= 1 : sum_i ||y_i^{m-1} - A_{Y_{m-1},n}(y_i^{m-1})|| <= r}`` (eq 92) and
    ``Y~ = [A_{Y_{M~-1},n}(y_i^{M~-1})]_i`` (eq 89), where ``A_{Y,n}(y_i) = (H Y)_i / (H 1)_i``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import as_matrix
from ..errors import DomainError, InvalidInputError, PrivacyParameterError
from ..privacy.rng import require_generator
from .model import fit_core, kmeans_partition, n_branches_for, run_jobs
from .grid import GridOptimalNoise

__all__ = ["OptimalNoise", "privatize", "modelling_error", "smooth", "fabricate", "fabricate_subsets", "fabrication_jobs",
           "SmootherTrace", "FabricationWarning", "make_noise", "NOISES"]


class FabricationWarning(UserWarning):
    """The smoother hit its step cap before the stopping rule of eq 92 was met."""


# --------------------------------------------------------------------------------------
# Result 1
# --------------------------------------------------------------------------------------

class OptimalNoise:
    """The optimal ``(epsilon, delta)`` noise of Result 1 for element sensitivity ``d``."""

    def __init__(self, epsilon: float, delta: float = 1e-5, sensitivity: float = 1.0):
        self.epsilon = _positive("epsilon", epsilon)
        self.sensitivity = _positive("sensitivity", sensitivity)
        try:
            delta = float(delta)
        except (TypeError, ValueError):
            raise PrivacyParameterError(f"delta must be a number in [0, 1); got {delta!r}.") from None
        if not (0.0 <= delta < 1.0):
            raise PrivacyParameterError(f"delta must lie in [0, 1) (Result 1 needs delta < 1); got {delta}.")
        self.delta = delta

    @property
    def scale(self) -> float:
        """Laplace scale ``d / epsilon`` of the continuous part."""
        return self.sensitivity / self.epsilon

    def expected_magnitude(self) -> float:
        """``E|v| = (1 - delta) d / epsilon`` (eq 2)."""
        return (1.0 - self.delta) * self.scale

    def density(self, v) -> np.ndarray:
        """Density of the continuous part (without the atom), eq 74 for ``v != 0``."""
        v = np.asarray(v, dtype=np.float64)
        return (1.0 - self.delta) / (2.0 * self.scale) * np.exp(-np.abs(v) / self.scale)

    def cdf(self, v) -> np.ndarray:
        """eq 75 (right-continuous: ``F(0) = (1 + delta)/2``)."""
        v = np.asarray(v, dtype=np.float64)
        a = (1.0 - self.delta) / 2.0
        neg = a * np.exp(np.minimum(v, 0.0) / self.scale)
        pos = 1.0 - a * np.exp(-np.maximum(v, 0.0) / self.scale)
        return np.where(v < 0, neg, pos)

    def inverse_cdf(self, t) -> np.ndarray:
        """eq 76 for ``t`` in ``(0, 1)``."""
        t = np.asarray(t, dtype=np.float64)
        if np.any((t <= 0) | (t >= 1)):
            raise InvalidInputError("inverse_cdf needs t strictly inside (0, 1).")
        a = (1.0 - self.delta) / 2.0
        lo = t < a
        hi = t > 1.0 - a
        out = np.zeros_like(t)
        out[lo] = self.scale * np.log(t[lo] / a)
        out[hi] = -self.scale * np.log((1.0 - t[hi]) / a)
        return out

    def sample(self, shape, rng: np.random.Generator | None = None) -> np.ndarray:
        """Inverse-transform samples (eq 76) from ``rng`` (default: a fresh cryptographically
        seeded :func:`~pm_vector.privacy.secure_generator`)."""
        rng = require_generator(rng)
        t = rng.random(shape)
        zero = t == 0.0                       # Generator.random is on [0, 1): redraw exact zeros
        while np.any(zero):
            t[zero] = rng.random(int(zero.sum()))
            zero = t == 0.0
        return self.inverse_cdf(t)

    def release(self, X, rng: np.random.Generator | None = None) -> np.ndarray:
        """``X + V`` with float noise (the paper's construction; NOT floating-point safe, see
        :mod:`pm_vector.kahm.grid`). Kept as ``noise="continuous"`` to reproduce the paper."""
        X = as_matrix(X, "X")
        return X + self.sample(X.shape, rng)

    def record(self, n_features: int | None = None) -> dict:
        return {"mechanism": "Result 1, continuous (inverse CDF of 53-bit uniforms, eq 76)", "unit": "element",
                "epsilon": self.epsilon, "delta": self.delta, "sensitivity": self.sensitivity, "grid": None,
                "floating_point": "NOT safe: the low bits of x + v can rule a neighbour out (Mironov 2012)"}

    def hockey_stick(self, shift: float, epsilon: float | None = None, *, grid: int = 200_001) -> float:
        """``sup_O P(O) - e^eps P'(O)`` for the output laws at true values 0 (``P``) and ``shift``
        (``P'``), computed numerically on a grid (atoms handled exactly). ``(epsilon, delta)``-DP at
        sensitivity ``d`` means this is ``<= delta`` for every ``|shift| <= d`` (both orders)."""
        eps = self.epsilon if epsilon is None else float(epsilon)
        s = float(shift)
        ratio = math.exp(eps)
        # atoms: P has mass delta at 0, P' at s
        if s == 0.0:
            atom = max(0.0, self.delta - ratio * self.delta)
        else:
            atom = self.delta
        half = 40.0 * self.scale + abs(s)
        v = np.linspace(-half, half, grid)
        f = self.density(v)
        g = self.density(v - s)
        integrand = np.maximum(f - ratio * g, 0.0)
        cont = float(np.trapezoid(integrand, v))
        tail = (1.0 - self.delta) * math.exp(-half / self.scale)  # mass of P's Laplace part beyond the grid
        return atom + cont + tail


def _positive(name, v) -> float:
    try:
        v = float(v)
    except (TypeError, ValueError):
        raise PrivacyParameterError(f"{name} must be a positive number; got {v!r}.") from None
    if not math.isfinite(v) or v <= 0.0:
        raise PrivacyParameterError(f"{name} must be positive and finite; got {v}.")
    return v


NOISES = ("grid", "continuous")


def make_noise(epsilon: float, delta: float = 1e-5, sensitivity: float = 1.0, noise: str = "grid",
               grid: float | None = None):
    """Result 1's noise as a release mechanism: ``"grid"`` (default; floating-point safe,
    :class:`~pm_vector.kahm.grid.GridOptimalNoise`) or ``"continuous"`` (the paper's eq 76 on
    floats, :class:`OptimalNoise`; reproduction only). Both have ``release(X, rng)`` and ``record()``."""
    if noise == "grid":
        return GridOptimalNoise(epsilon, delta, sensitivity, grid)
    if noise == "continuous":
        if grid is not None:
            raise InvalidInputError("grid is a parameter of noise='grid'.")
        return OptimalNoise(epsilon, delta, sensitivity)
    raise InvalidInputError(f"noise must be one of {NOISES}; got {noise!r}.")


def privatize(Y, epsilon: float, delta: float = 1e-5, sensitivity: float = 1.0,
              rng: np.random.Generator | None = None, *, noise: str = "grid", grid: float | None = None) -> np.ndarray:
    """Algorithm 1: every element of ``Y`` perturbed by Result 1's noise (on the public grid by
    default; ``noise="continuous"`` is the paper's float construction)."""
    return make_noise(epsilon, delta, sensitivity, noise, grid).release(Y, rng)


# --------------------------------------------------------------------------------------
# smoother (Definition 13) and fabricated data (Definition 14)
# --------------------------------------------------------------------------------------

@dataclass
class SmootherTrace:
    """What the smoother did: modelling error ``sum_i ||y_i^m - A_{Y_m}(y_i^m)||`` for ``m = 0, 1, ...``."""

    errors: list
    lambdas: list
    steps: int               # smoothing steps taken (= M - 1 for the returned Y_{M-1})
    met_rule: bool | None    # stopping rule of eq 92 met (None when no threshold was given)


def _smoothing_step(Y: torch.Tensor, n: int, what: str):
    """One KAHM on ``Y``: returns ``(H Y, H 1, lambda*)``."""
    core = fit_core(Y, n, what=what, keep_eig=True)
    U, mu = core.U, core.mu
    f = mu / (mu + core.lam)                          # eigenvalues of H = K (K + lambda I)^-1
    HY = U @ (f[:, None] * (U.T @ Y))
    H1 = U @ (f * U.sum(0))
    if not bool((H1 > 0).all()):
        raise DomainError(f"{what}: sum_j h^j(P y_i) <= 0 for some training row (lambda*={core.lam:.3g}); the "
                          f"KAHM image is undefined there (eq 185 fails). Rescale the data (lambda* grows with the "
                          f"mean square element).")
    return HY, H1, core.lam


def modelling_error(Y, n: int, *, device=None, dtype=torch.float64) -> float:
    """``r = sum_i ||y_i - A_{Y,n}(y_i)||`` (eq 88)."""
    Yt = Y if isinstance(Y, torch.Tensor) else torch.as_tensor(as_matrix(Y, "Y"), dtype=dtype, device=device)
    HY, H1, _ = _smoothing_step(Yt, n, "Y")
    return float(torch.linalg.vector_norm(Yt - HY / H1[:, None], dim=1).sum())


def smooth(Yplus, n: int, M: int | None = None, *, r: float | None = None, max_steps: int = 200,
           device=None, dtype=torch.float64, what: str = "Y+"):
    """The smoother ``T_{n,M}`` of Definition 13.

    ``M`` given: returns ``Y_{M-1}`` (``M - 1`` steps), its KAHM image ``A_{Y_{M-1},n}(Y_{M-1})``
    (the fabricated rows of Definition 14 for a fixed, public ``M``) and the trace. ``r`` given
    instead: steps until the modelling error of ``Y_m`` is ``<= r`` (eq 92; at most
    ``max_steps``) and returns the fabricated rows ``A_{Y_m,n}(Y_m)`` of Definition 14.

    Returns ``(Y_hat, Y_fab, trace)`` as torch tensors.
    """
    if (M is None) == (r is None):
        raise InvalidInputError("give exactly one of M (fixed number of recursions) or r (stopping threshold).")
    Y = Yplus if isinstance(Yplus, torch.Tensor) else torch.as_tensor(as_matrix(Yplus, what), dtype=dtype,
                                                                         device=device)
    steps_cap = (int(M) - 1) if M is not None else int(max_steps)
    if M is not None and int(M) < 1:
        raise InvalidInputError(f"M must be a positive integer; got {M}.")
    errors, lambdas = [], []
    met = None
    for m in range(steps_cap + 1):
        HY, H1, lam = _smoothing_step(Y, n, f"{what} (smoothing step {m})")
        img = HY / H1[:, None]
        err = float(torch.linalg.vector_norm(Y - img, dim=1).sum())
        errors.append(err)
        lambdas.append(lam)
        if r is not None and err <= r:
            met = True
            return Y, img, SmootherTrace(errors, lambdas, m, met)
        if m == steps_cap:
            break
        Y = HY
    if r is not None:
        met = False
        # no number in the text: r comes from the original rows and warnings end up in stored metadata
        warnings.warn(f"{what}: the smoother did not meet the stopping rule (eq 92) within {steps_cap} steps; "
                      "returning the last iterate (raise max_steps, or use a fixed public number of steps).",
                      FabricationWarning, stacklevel=2)
        return Y, img, SmootherTrace(errors, lambdas, steps_cap, met)
    return Y, img, SmootherTrace(errors, lambdas, steps_cap, met)


def fabricate(Yplus, n: int, r: float, *, max_steps: int = 200, device=None, dtype=torch.float64,
              what: str = "Y+") -> tuple[np.ndarray, SmootherTrace]:
    """Differentially private fabricated data ``F_n(Y+; r)`` (Definition 14)."""
    r = float(r)
    if not math.isfinite(r) or r < 0:
        raise InvalidInputError(f"r must be a finite non-negative modelling error; got {r}.")
    _, Yf, trace = smooth(Yplus, n, r=r, max_steps=max_steps, device=device, dtype=dtype, what=what)
    return Yf.cpu().numpy(), trace


def fabrication_jobs(Y: np.ndarray, Yp: np.ndarray, n: int, *, branch_size: int = 1000, cluster_on: str = "noisy",
                     r: float | None = None, max_steps: int = 200, random_state: int | None = 0, device=None,
                     dtype=torch.float64, what: str = "Y", steps: int | None = None) -> list:
    """Remark 4 as independent callables, one per k-means subset, each returning
    ``(fabricated rows, info)``. ``Y``: original rows (for ``r_s``, eq 96), ``Yp``: their noisy
    version (Algorithm 1, drawn by the caller). ``steps``: a fixed, public number of smoothing
    steps instead of the stopping rule (then neither ``r`` nor ``Y`` is used: the output is a
    function of ``Yp`` alone, pure post-processing of Algorithm 1)."""
    if cluster_on not in ("noisy", "original"):
        raise InvalidInputError(f"cluster_on must be 'noisy' or 'original'; got {cluster_on!r}.")
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise InvalidInputError(f"steps must be a non-negative integer; got {steps!r}.")
        if cluster_on != "noisy":
            raise InvalidInputError("a fixed number of smoothing steps is for output that depends on the noisy rows "
                                    "only; use cluster_on='noisy'.")
    S = n_branches_for(Y.shape[0], branch_size)
    parts = kmeans_partition(Yp if cluster_on == "noisy" else Y, S, min_size=n + 1, random_state=random_state)

    def fixed_job(si, idx):
        w = f"{what}, subset {si}" if len(parts) > 1 else what
        _, Yf, tr = smooth(Yp[idx], n, M=int(steps) + 1, device=device, dtype=dtype, what=w)
        info = {"size": int(len(idx)), "r": None, "M_tilde": tr.steps + 1, "final_error": tr.errors[-1],
                "initial_error": tr.errors[0], "met_rule": None, "warning": None}
        return Yf.cpu().numpy(), info

    def job(si, idx):
        w = f"{what}, subset {si}" if len(parts) > 1 else what
        rs = modelling_error(torch.as_tensor(Y[idx], dtype=dtype, device=device), n) if r is None else float(r)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FabricationWarning)
            Yf, tr = fabricate(Yp[idx], n, rs, max_steps=max_steps, device=device, dtype=dtype, what=w)
        info = {"size": int(len(idx)), "r": rs, "M_tilde": tr.steps + 1, "final_error": tr.errors[-1],
                "initial_error": tr.errors[0], "met_rule": bool(tr.met_rule),
                "warning": str(caught[0].message) if caught else None}
        return Yf, info

    fn = job if steps is None else fixed_job
    return [lambda si=si, idx=idx: fn(si, idx) for si, idx in enumerate(parts)]


def fabricate_subsets(Y, noise: OptimalNoise, n: int, *, rng: np.random.Generator | None = None,
                      branch_size: int = 1000, cluster_on: str = "noisy", r: float | None = None,
                      max_steps: int = 200, random_state: int | None = 0, device=None, dtype=torch.float64,
                      n_jobs: int = 1, what: str = "Y") -> tuple[np.ndarray, list]:
    """Remark 4: split into ``S = ceil(N / branch_size)`` k-means subsets, add Result 1's noise
    (Algorithm 1; ``noise`` is an :class:`OptimalNoise` or a grid mechanism from :func:`make_noise`), fabricate each subset with ``r_s`` = its original modelling error (eq 96, or
    the public ``r``). Returns the fabricated rows (subset after subset) and per-subset info."""
    Y = as_matrix(Y, what)
    Yp = noise.release(Y, require_generator(rng))
    jobs = fabrication_jobs(Y, Yp, n, branch_size=branch_size, cluster_on=cluster_on, r=r, max_steps=max_steps,
                            random_state=random_state, device=device, dtype=dtype, what=what)
    results = run_jobs(jobs, n_jobs)
    reissue_warnings([b for _, b in results])
    return np.concatenate([a for a, _ in results]), [b for _, b in results]


def reissue_warnings(infos):
    for inf in infos:
        if inf.get("warning"):
            warnings.warn(inf["warning"], FabricationWarning, stacklevel=3)
