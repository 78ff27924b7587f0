"""The release of a pm_vector request: one clipped row per class, on a grid, with discrete Gaussian noise.

What is released
----------------
Public: class frames (:class:`~pm_vector.manifold.class_frames.ClassFrames`, fit on the public
anchor set: per class ``c`` a mean ``mu_c``, ``d`` directions ``U_c`` and a clip radius
``r_c``) and the public dummy pool. The client's secret is its query ``(x, c)`` (features and
label). The request is the ``C x d`` matrix

    Y_j = gamma_j (round(clip_{r_j}(U_j (v_j - mu_j)) / gamma_j) + N_Z(0, (sigma_j / gamma_j)^2 I_d)),
    j = 1..C (class order), N_Z the discrete Gaussian on the integers (see "Floating point"),

where ``v_c = x`` and, for every other class ``j``, ``v_j`` is a dummy drawn uniformly from the
public pool of class ``j`` (independently of the query). ``sigma_j = s * 2 r_j`` with ``s`` from
:func:`discrete_unit_noise_scale` (the continuous analytic Gaussian's ``s`` at L2 sensitivity
``sqrt(2)``, :func:`unit_noise_scale`, is what the release used before the grid).

Guarantee
---------
:class:`ClassRowsGaussianMechanism` is (epsilon, delta)-DP for the **whole request** with respect
to replacing the query ``(x, c)`` by **any** other query ``(x', c')`` (any features, any label).
Proof (continuous form; the grid changes only the per-draw step, see below): divide row ``j`` by
``2 r_j``; the noise becomes ``N(0, s^2 I)`` on every row. Couple the
dummy draws of the two worlds (draw one dummy per class; each world uses all but its own class).
For every draw the two inputs differ in row ``c`` and row ``c'`` only (one row if ``c = c'``),
and each differing row moves by at most 1 (both points lie in a ball of radius ``r_j``, whose
diameter scales to 1), so the L2 distance is at most ``sqrt(2)``: the Gaussian mechanism
calibrated to ``sqrt(2)`` gives (epsilon, delta) for every draw (on the grid: the discrete
Gaussian's zCDP converted to (epsilon, delta) for that draw), and a mixture over the same
coupling keeps it (joint convexity of the hockey-stick divergence). Rows are in class order, so
their positions carry nothing. The server's shortlist and everything after it are
post-processing. Requests compose: the client's accountant charges (epsilon, delta) per request.

Floating point (Mironov 2012)
-----------------------------
The noise is **discrete**: row ``j`` is first rounded to the public grid ``gamma_j = 2 r_j / G``
(``G = grid_steps``, default 4096 steps per row diameter), ``k_j = round(Z_j / gamma_j)``, and the
released row is ``gamma_j (k_j + N_Z(0, sigma_j^2 / gamma_j^2))`` with an exact discrete-Gaussian
sampler (:mod:`pm_vector.privacy.discrete`). Every output is a grid point, reachable from every
input, so the low bits of a float carry nothing: the release is a deterministic function of an
integer mechanism. Its accounting: a rounded row moves by at most ``G + sqrt(d)`` grid steps
(``G`` from the clip ball, ``sqrt(d)`` from rounding each coordinate by at most 1/2 in both worlds),
two rows change, so the L2 sensitivity is ``sqrt(2) (G + sqrt(d))``; the discrete Gaussian is then
``rho``-zCDP (Canonne, Kamath & Steinke 2020, Thm 14) and ``rho`` is the largest value whose
exact zCDP-to-(epsilon, delta) conversion (their Cor. 13) gives delta. Compared with the
continuous analytic Gaussian this adds 5-8 % noise (the conversion: ``s`` ratio 1.084 / 1.071 /
1.053 at epsilon 1 / 4 / 16, delta 1e-5; ``pm-vector bench accounting``) and ``sqrt(d)/G``
(rounding). The grid and the noise kind travel in the request (``grid``, ``noise``).

Why not a tighter accounting. OpenDP's zCDP-to-(epsilon, delta) conversion certifies the same
``rho`` (``tests/privacy/test_accounting_crosscheck.py``): it is this conversion, not a looser
one. The privacy-loss distribution that would remove the 5-8 % (Google's ``dp_accounting``, or the
analytic Gaussian of Balle & Wang 2018) is proven for the *continuous* Gaussian, whose law is
rotation invariant, so an L2 bound is all it needs. The discrete Gaussian on ``Z^d`` is not
rotation invariant: its privacy loss against a shift ``v`` is ``(||v||^2 - 2 <v, Y>) / (2 sigma^2)``
and the law of ``<v, Y>`` depends on the direction of ``v``, not only on ``||v||``; the 1-D
discrete-Gaussian PLD covers a shift along one axis only. Without a verified multivariate bound
(with its explicit correction term) for every integer ``v`` of L2 norm at most the sensitivity,
the release keeps the zCDP calibration, which CKS prove for exactly this mechanism (Thm 14).

Assumptions: the frames and the dummy pool are public and do not depend on the query; the
dummies are drawn independently of the query; the noise comes from the operating system's
CSPRNG (:func:`~pm_vector.privacy.secure_generator`, a
:class:`~pm_vector.privacy.rng.SecureRandom`: every bit from ``os.urandom``).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..errors import InvalidInputError
from .discrete import sample_discrete_gaussian_var, zcdp_rho_for
from .gaussian import analytic_sigma, check_delta, check_epsilon
from .rng import require_generator

#: rows a change of the query alters (the real row's class and the new class)
ROWS_CHANGED = 2
#: relative slack of the clip check: clipped rows may exceed r_c by float rounding only
CLIP_TOLERANCE = 1e-9
#: default grid: steps per row diameter 2 r_c (gamma_c = 2 r_c / DEFAULT_GRID_STEPS); small
#: against the noise (sigma_c >= ~0.4 * 2 r_c up to epsilon 16), so utility is unchanged
DEFAULT_GRID_STEPS = 4096
#: the noise a request names
NOISE = "discrete_gaussian"


def unit_noise_scale(epsilon: float, delta: float, rows_changed: int = ROWS_CHANGED) -> float:
    """``s`` of the *continuous* analytic Gaussian for (epsilon, delta) at L2 sensitivity
    ``sqrt(rows_changed)``, in units of a row's diameter ``2 r_c`` (kept for comparison)."""
    return analytic_sigma(check_epsilon(epsilon), check_delta(delta), math.sqrt(int(rows_changed)))


def discrete_unit_noise_scale(epsilon: float, delta: float, dim: int, grid_steps: int = DEFAULT_GRID_STEPS,
                              rows_changed: int = ROWS_CHANGED) -> float:
    """``s`` of the grid release, in units of ``2 r_c``: ``sigma_c = s * 2 r_c``.

    In grid units a row moves by at most ``row_sensitivity(dim, G)`` and ``rows_changed`` rows move,
    so ``sigma_grid = sqrt(rows_changed / (2 rho)) * row_sensitivity`` with ``rho`` from
    :func:`~pm_vector.privacy.discrete.zcdp_rho_for`; ``s = sigma_grid / G``."""
    rho = zcdp_rho_for(check_epsilon(epsilon), check_delta(delta))
    G = _check_grid_steps(grid_steps)
    # 1e-9: the float division sigma / gamma at release time must not land below the calibration
    return math.sqrt(int(rows_changed) / (2.0 * rho)) * row_sensitivity(dim, G) / G * (1 + 1e-9)


def row_sensitivity(dim: int, grid_steps: int) -> float:
    """Grid steps a rounded row can move: ``G`` across the clip ball (with its float slack) plus
    ``sqrt(dim)`` from rounding both worlds' coordinates (each by at most 1/2)."""
    return grid_steps * (1 + 2 * CLIP_TOLERANCE) + math.sqrt(dim) + 1e-6


def _check_grid_steps(grid_steps) -> int:
    if isinstance(grid_steps, bool) or not isinstance(grid_steps, (int, np.integer)) or not 16 <= grid_steps <= 2**20:
        raise InvalidInputError(f"grid_steps must be an integer in 16..{2**20} (steps per row diameter); "
                                f"got {grid_steps!r}.")
    return int(grid_steps)


class ClassRowsGaussianMechanism:
    """(epsilon, delta)-DP release of ``C`` class rows of ``dim`` coordinates, row ``j`` clipped to
    radius ``radii[j]``, on the public grid ``grid_[j] = 2 radii[j] / grid_steps`` with exact
    discrete-Gaussian noise (see the module doc).

    ``release(rows)`` refuses rows outside their ball (the guarantee needs the clip).
    ``sigmas_``: the per-row noise standard deviations ``s * 2 r_j`` (the discrete Gaussian's
    parameter times the grid step); ``noise_scale_``: ``s``; ``rho_``: the zCDP of one request.
    """

    noise = NOISE

    def __init__(self, epsilon: float, delta: float, radii, dim: int, *, grid_steps: int = DEFAULT_GRID_STEPS):
        self.epsilon = check_epsilon(epsilon)
        self.delta = check_delta(delta)
        r = np.asarray(radii, dtype=np.float64).reshape(-1)
        if r.size == 0 or not np.all(np.isfinite(r)) or np.any(r <= 0):
            raise InvalidInputError("radii must be positive finite numbers, one per class.")
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise InvalidInputError(f"dim must be a positive integer (coordinates per row); got {dim!r}.")
        self.radii = r
        self.dim = int(dim)
        self.grid_steps = _check_grid_steps(grid_steps)
        self.rho_ = zcdp_rho_for(self.epsilon, self.delta)
        self.grid_ = 2.0 * r / self.grid_steps
        self.noise_scale_ = discrete_unit_noise_scale(self.epsilon, self.delta, self.dim, self.grid_steps)
        self.sigmas_ = self.noise_scale_ * 2.0 * r

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the row-normalised request (rows divided by their row sensitivity)."""
        return math.sqrt(ROWS_CHANGED)

    def check_domain(self, rows) -> np.ndarray:
        Z = np.asarray(rows, dtype=np.float64)
        if Z.ndim != 2 or Z.shape[0] != self.radii.shape[0] or Z.shape[1] != self.dim:
            raise InvalidInputError(f"expected {self.radii.shape[0]} rows (one per class) of {self.dim} "
                                    f"coordinates; got shape {Z.shape}.")
        if not np.all(np.isfinite(Z)):
            raise InvalidInputError("rows contain NaN or infinite values.")
        n = np.linalg.norm(Z, axis=1)
        bad = np.flatnonzero(n > self.radii * (1 + CLIP_TOLERANCE))
        if bad.size:
            raise InvalidInputError(f"row {int(bad[0])} lies outside its clip radius: clip it first "
                                    "(ClassFrames.clip); the guarantee holds only inside the ball.")
        return Z

    def release_grid(self, rows, rng: np.random.Generator | None = None) -> np.ndarray:
        """The integer release ``round(Z_j / gamma_j) + N_Z(0, (sigma_j / gamma_j)^2)`` (int64)."""
        Z = self.check_domain(rows)
        g = require_generator(rng)
        K = np.rint(Z / self.grid_[:, None]).astype(np.int64)
        # the sampler's parameter sigma^2 in grid units, rounded *up* to an integer (more noise,
        # never less; relative change < 1/sigma^2) so that its arithmetic stays in int64
        s2 = [math.ceil((Fraction(float(sg)) / Fraction(float(gm))) ** 2) for sg, gm in zip(self.sigmas_, self.grid_)]
        for v in sorted(set(s2)):  # one draw for all rows of the same noise (usually all of them)
            rows_v = [j for j, w in enumerate(s2) if w == v]
            K[rows_v] += sample_discrete_gaussian_var(v, (len(rows_v), K.shape[1]), g)
        return K

    def release(self, rows, rng: np.random.Generator | None = None) -> np.ndarray:
        """The grid release in row units: ``gamma_j * release_grid(rows)[j]`` (float64, on the grid);
        ``rng`` from :func:`~pm_vector.privacy.secure_generator`."""
        return self.release_grid(rows, rng) * self.grid_[:, None]

    def __repr__(self) -> str:
        return (f"ClassRowsGaussianMechanism(epsilon={self.epsilon!r}, delta={self.delta!r}, "
                f"classes={self.radii.shape[0]}, dim={self.dim}, grid_steps={self.grid_steps}) "
                f"[s={self.noise_scale_:.6g}]")
