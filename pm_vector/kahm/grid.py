"""Floating-point-safe noise for the KAHM tools: every released value lies on a public grid.

Why: Result 1's noise drawn by inverse CDF from 53-bit uniforms (:meth:`OptimalNoise.sample`)
has outputs that are not evenly spaced, so the low bits of ``x + v`` can rule a neighbouring
input out entirely (Mironov 2012; :func:`continuous_can_produce` reproduces the attack). Here the
input is rounded to a public grid ``g`` (a power of two, so ``g * integer`` is exact in float64),
an integer noise is drawn by the exact samplers of :mod:`pm_vector.privacy.discrete` (Canonne,
Kamath & Steinke 2020: integer / rational arithmetic only) and the release is ``g * (q + z)``:
a deterministic function of an integer whose law is exactly the stated one.

:class:`GridOptimalNoise` (element level, Definition 10)
    Result 1 on the grid: with probability ``delta`` the noise is 0 (the atom), otherwise a
    discrete Laplace of scale ``K / epsilon`` grid units, ``K = floor(d / g) + 1`` (rounding can
    move two inputs ``d`` apart by one more grid step). Pure discrete Laplace is ``epsilon``-DP
    at L1 sensitivity ``K``; the atom adds ``delta``: ``(epsilon, delta)``-DP per element.
:class:`RowGaussianNoise` (row level: one item's whole feature row)
    Each row is clipped to the public L2 norm ``C``, rounded to the grid, and gets iid discrete
    Gaussian noise. Replacing one row moves the integer rows by at most
    ``Delta = 2 C / g + sqrt(p)`` in L2 (rounding adds at most 1 per coordinate), so the release
    is ``Delta^2 / (2 sigma^2)``-zCDP (CKS Theorem 14); ``sigma`` is calibrated so that the zCDP
    bound certifies ``(epsilon, delta)`` per row (CKS Corollary 13), its square rounded up to an
    integer number of squared grid steps (exact int64 sampling; more noise, never less).

``record()`` of each mechanism is the privacy record stored with whatever it released (grid,
unit, calibration, what lies outside the guarantee).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .._validation import as_matrix
from ..errors import InvalidInputError, PrivacyParameterError
from ..privacy.rng import require_generator
from ..privacy.discrete import sample_discrete_gaussian_var, sample_discrete_laplace, zcdp_rho_for

__all__ = ["GridOptimalNoise", "RowGaussianNoise", "default_grid", "continuous_can_produce", "grid_pmf_ratio_excess"]

#: the grid is at most sensitivity / 2^8: rounding then costs < 0.4 % of the noise scale
GRID_DIVISIONS = 256


def _positive(name, v) -> float:
    try:
        v = float(v)
    except (TypeError, ValueError):
        raise PrivacyParameterError(f"{name} must be a positive number; got {v!r}.") from None
    if not math.isfinite(v) or v <= 0.0:
        raise PrivacyParameterError(f"{name} must be positive and finite; got {v}.")
    return v


def _delta(delta, *, closed_zero: bool) -> float:
    try:
        delta = float(delta)
    except (TypeError, ValueError):
        raise PrivacyParameterError(f"delta must be a number in [0, 1); got {delta!r}.") from None
    ok = (0.0 <= delta < 1.0) if closed_zero else (0.0 < delta < 1.0)
    if not ok:
        raise PrivacyParameterError(f"delta must lie in {'[0, 1)' if closed_zero else '(0, 1)'}; got {delta}.")
    return delta


def default_grid(span: float) -> float:
    """The largest power of two ``<= span / 256``: public (a function of the public bound only)."""
    return 2.0 ** math.floor(math.log2(_positive("span", span) / GRID_DIVISIONS))


def _grid(grid, span: float) -> float:
    if grid is None:
        return default_grid(span)
    g = _positive("grid", grid)
    m, _ = math.frexp(g)
    if m != 0.5:  # g * integer must be exact in float64, or the output's low bits carry information again
        raise InvalidInputError(f"grid must be a power of two (e.g. {default_grid(span)!r}); got {g!r}.")
    return g


def _to_grid(X: np.ndarray, g: float) -> np.ndarray:
    q = np.rint(X / g)
    if not np.all(np.abs(q) < 2.0 ** 52):
        raise InvalidInputError(f"values are too large for the grid {g!r} (|x| / grid >= 2^52); clip them to the "
                                "public value range first or use a coarser grid.")
    return q.astype(np.int64)


class GridOptimalNoise:
    """Result 1's ``(epsilon, delta)`` noise for element sensitivity ``d``, on the grid ``g``.

    ``grid=None``: :func:`default_grid` of ``d`` (public). ``release(X, rng)`` returns the noisy
    matrix (every value a multiple of ``g``)."""

    unit = "element"

    def __init__(self, epsilon: float, delta: float = 1e-5, sensitivity: float = 1.0, grid: float | None = None):
        self.epsilon = _positive("epsilon", epsilon)
        self.sensitivity = _positive("sensitivity", sensitivity)
        self.delta = _delta(delta, closed_zero=True)
        self.grid = _grid(grid, self.sensitivity)

    @property
    def sensitivity_units(self) -> int:
        """``K``: how many grid steps two inputs ``d`` apart can differ by after rounding."""
        return int(math.floor(self.sensitivity / self.grid)) + 1

    @property
    def scale_units(self) -> float:
        """Scale of the discrete Laplace part, in grid units (``K / epsilon``)."""
        return self.sensitivity_units / self.epsilon

    def sample_units(self, shape, rng: np.random.Generator | None = None) -> np.ndarray:
        """Integer noise (grid units): 0 with probability ``delta``, else discrete Laplace."""
        rng = require_generator(rng)
        z = sample_discrete_laplace(self.scale_units, shape, rng)
        if self.delta > 0:
            # the atom: a Bernoulli(delta) from uniform integers (a float comparison would leak nothing
            # here -- it only decides whether to add -- but integers keep the law exact)
            den = 1 << 53
            num = int(math.floor(self.delta * den))  # rounded down: the atom never exceeds delta
            z = np.where(rng.integers(0, den, size=np.shape(z), dtype=np.int64) < num, 0, z)
        return z

    def release(self, X, rng: np.random.Generator | None = None) -> np.ndarray:
        """``g * (round(X / g) + Z)``: Algorithm 1 on the grid."""
        X = as_matrix(X, "X")
        q = _to_grid(X, self.grid)
        return (q + self.sample_units(q.shape, rng)).astype(np.float64) * self.grid

    def pmf_units(self, z) -> np.ndarray:
        """Exact law of the integer noise (for tests and accounting)."""
        z = np.asarray(z, dtype=np.float64)
        a = 1.0 / self.scale_units
        base = math.tanh(a / 2.0) * np.exp(-a * np.abs(z))   # (e^a - 1)/(e^a + 1) e^{-a|z|}
        return (1.0 - self.delta) * base + self.delta * (z == 0)

    def record(self, n_features: int | None = None) -> dict:
        row = {} if n_features is None else {
            "row_epsilon": self.epsilon * int(n_features), "row_delta": min(1.0, self.delta * int(n_features)),
            "row_note": f"a whole item row of {int(n_features)} features costs up to {int(n_features)} x epsilon "
                        "(basic composition)"}
        return {**row, "mechanism": "Result 1 on a grid: atom of mass delta at 0 + discrete Laplace (CKS 2020 exact sampler)",
                "unit": "element", "epsilon": self.epsilon, "delta": self.delta, "sensitivity": self.sensitivity,
                "grid": self.grid, "sensitivity_grid_units": self.sensitivity_units,
                "scale_grid_units": self.scale_units,
                "release": "grid * (round(x / grid) + Z), Z integer: every released value is a multiple of grid"}


class RowGaussianNoise:
    """Row-level discrete Gaussian: rows clipped to L2 norm ``clip_norm`` (public), rounded to the
    grid, ``(epsilon, delta)``-DP per row (substitution of one item's feature row)."""

    unit = "row"

    def __init__(self, epsilon: float, delta: float = 1e-5, clip_norm: float = 1.0, grid: float | None = None):
        self.epsilon = _positive("epsilon", epsilon)
        self.delta = _delta(delta, closed_zero=False)
        self.clip_norm = _positive("clip_norm", clip_norm)
        self.grid = None if grid is None else _grid(grid, self.clip_norm)

    def grid_for(self, n_features: int) -> float:
        """The grid for rows of ``p`` features: the given one, or the largest power of two that
        keeps rounding's ``sqrt(p)`` under 1/64 of ``2 C / g`` (public: from ``C`` and ``p`` only)."""
        if self.grid is not None:
            return self.grid
        return default_grid(2.0 * self.clip_norm * GRID_DIVISIONS / (64.0 * math.sqrt(int(n_features))))

    def calibrate(self, n_features: int) -> dict:
        """``Delta`` (grid units, L2), ``rho`` and ``sigma`` (grid units) for rows of ``p`` features."""
        p = int(n_features)
        if p < 1:
            raise InvalidInputError(f"rows need at least one feature; got {p}.")
        g = self.grid_for(p)
        Delta = 2.0 * self.clip_norm / g + math.sqrt(p)
        rho = zcdp_rho_for(self.epsilon, self.delta)
        # the sampler's sigma^2 (grid units): Delta^2 / (2 rho) in exact rationals, rounded *up* to an
        # integer (more noise, never less; relative change < 1/sigma^2) so its arithmetic stays in int64
        s2 = math.ceil(Fraction(Delta) ** 2 / (2 * Fraction(rho)))
        return {"grid": g, "sensitivity_grid_units": Delta, "rho": rho, "sigma2_grid_units": s2,
                "sigma_grid_units": math.sqrt(s2)}

    def clip(self, X) -> np.ndarray:
        X = as_matrix(X, "X")
        nrm = np.linalg.norm(X, axis=1)
        return X * np.minimum(1.0, self.clip_norm / np.maximum(nrm, 1e-300))[:, None]

    def release(self, X, rng: np.random.Generator | None = None) -> np.ndarray:
        Xc = self.clip(X)
        cal = self.calibrate(Xc.shape[1])
        q = _to_grid(Xc, cal["grid"])
        z = sample_discrete_gaussian_var(cal["sigma2_grid_units"], q.shape, require_generator(rng))
        return (q + z).astype(np.float64) * cal["grid"]

    def record(self, n_features: int) -> dict:
        cal = self.calibrate(n_features)
        return {"mechanism": "row clipped to L2 <= clip_norm, discrete Gaussian on a grid (CKS 2020 exact sampler; "
                             "zCDP Thm 14 -> (epsilon, delta) Cor 13)",
                "unit": "row", "epsilon": self.epsilon, "delta": self.delta, "clip_norm": self.clip_norm,
                "neighbours": "one item's feature row replaced by any other row",
                **cal, "sigma": cal["sigma_grid_units"] * cal["grid"],
                "release": "grid * (round(clip(x) / grid) + Z), Z integer: every released value is a multiple of grid"}


# --------------------------------------------------------------------------- attack helpers (tests, audits)

def continuous_can_produce(outputs, x_neighbour: float, noise, *, window: int = 64) -> np.ndarray:
    """Mironov's test against :meth:`OptimalNoise.sample`: can ``x_neighbour + v`` equal each
    observed output exactly, for some ``v`` the float sampler can emit?

    The sampler maps a uniform ``t = k / 2^53`` through the inverse CDF; we scan ``k`` in a window
    around the ``t`` that would give ``output - x_neighbour`` and ask whether any of them lands on
    the output bit for bit. ``False`` = the neighbour is ruled out by that one output."""
    o = np.asarray(outputs, dtype=np.float64).ravel()
    t0 = np.clip(noise.cdf(o - x_neighbour), 2.0 ** -53, 1 - 2.0 ** -53)
    k0 = np.floor(t0 * 2.0 ** 53)
    ok = np.zeros(o.size, dtype=bool)
    for dk in range(-window, window + 1):
        t = (k0 + dk) / 2.0 ** 53
        valid = (t > 0) & (t < 1)
        v = np.zeros_like(t)
        v[valid] = noise.inverse_cdf(t[valid])
        ok |= valid & ((x_neighbour + v) == o)
    # the atom: output == x_neighbour exactly is always possible
    return ok | (o == x_neighbour)


def grid_pmf_ratio_excess(noise: GridOptimalNoise, x: float, x_neighbour: float, epsilon: float | None = None) -> float:
    """Exact ``sum_o max(P(o) - e^eps P'(o), 0)`` of the grid mechanism at ``x`` vs ``x_neighbour``."""
    eps = noise.epsilon if epsilon is None else float(epsilon)
    q, q2 = (int(np.rint(v / noise.grid)) for v in (x, x_neighbour))
    half = int(60 * noise.scale_units) + abs(q - q2) + 2
    o = np.arange(min(q, q2) - half, max(q, q2) + half + 1)
    P, P2 = noise.pmf_units(o - q), noise.pmf_units(o - q2)
    return float(np.maximum(P - math.exp(eps) * P2, 0.0).sum())
