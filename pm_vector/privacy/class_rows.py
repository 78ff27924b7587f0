"""The release of a pm_vector request: one clipped, Gaussian-noised row per class.

What is released
----------------
Public: class frames (:class:`~pm_vector.manifold.class_frames.ClassFrames`, fit on the public
anchor set: per class ``c`` a mean ``mu_c``, ``d`` directions ``U_c`` and a clip radius
``r_c``) and the public dummy pool. The client's secret is its query ``(x, c)`` (features and
label). The request is the ``C x d`` matrix

    Y_j = clip_{r_j}(U_j (v_j - mu_j)) + N(0, sigma_j^2 I_d),   j = 1..C (class order),

where ``v_c = x`` and, for every other class ``j``, ``v_j`` is a dummy drawn uniformly from the
public pool of class ``j`` (independently of the query). ``sigma_j = s * 2 r_j`` with ``s`` the
analytic Gaussian noise (Balle & Wang 2018) for (epsilon, delta) at L2 sensitivity ``sqrt(2)``.

Guarantee
---------
:class:`ClassRowsGaussianMechanism` is (epsilon, delta)-DP for the **whole request** with respect
to replacing the query ``(x, c)`` by **any** other query ``(x', c')`` (any features, any label).
Proof: divide row ``j`` by ``2 r_j``; the noise becomes ``N(0, s^2 I)`` on every row. Couple the
dummy draws of the two worlds (draw one dummy per class; each world uses all but its own class).
For every draw the two inputs differ in row ``c`` and row ``c'`` only (one row if ``c = c'``),
and each differing row moves by at most 1 (both points lie in a ball of radius ``r_j``, whose
diameter scales to 1), so the L2 distance is at most ``sqrt(2)``: the Gaussian mechanism
calibrated to ``sqrt(2)`` gives (epsilon, delta) for every draw, and a mixture over the same
coupling keeps it (joint convexity of the hockey-stick divergence). Rows are in class order, so
their positions carry nothing. The server's shortlist and everything after it are
post-processing. Requests compose: the client's accountant charges (epsilon, delta) per request.

Assumptions: the frames and the dummy pool are public and do not depend on the query; the
dummies are drawn independently of the query; the noise generator is unpredictable. Not
covered: **floating-point attacks** -- the noise is numpy's double-precision normal sampler,
whose outputs are not uniformly spaced; as with any textbook floating-point Gaussian, an
attacker who sees the exact float64 bits may learn more than (epsilon, delta) allows (Mironov
2012). A discrete-Gaussian sampler on a lattice would close this; it is not implemented.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidInputError
from .gaussian import _analytic_sigma, _check_delta, _check_epsilon
from .rng import require_generator

#: rows a change of the query alters (the real row's class and the new class)
ROWS_CHANGED = 2
#: relative slack of the clip check: clipped rows may exceed r_c by float rounding only
CLIP_TOLERANCE = 1e-9


def unit_noise_scale(epsilon: float, delta: float, rows_changed: int = ROWS_CHANGED) -> float:
    """``s``: the analytic Gaussian noise for (epsilon, delta) at L2 sensitivity
    ``sqrt(rows_changed)``, in units of a row's diameter ``2 r_c``."""
    return _analytic_sigma(_check_epsilon(epsilon), _check_delta(delta), math.sqrt(int(rows_changed)))


class ClassRowsGaussianMechanism:
    """(epsilon, delta)-DP release of ``C`` class rows, row ``j`` clipped to radius ``radii[j]``.

    ``release(rows)`` refuses rows outside their ball (the guarantee needs the clip).
    ``sigmas_``: the per-row noise standard deviations ``s * 2 r_j``; ``noise_scale_``: ``s``.
    """

    def __init__(self, epsilon: float, delta: float, radii):
        self.epsilon = _check_epsilon(epsilon)
        self.delta = _check_delta(delta)
        r = np.asarray(radii, dtype=np.float64).reshape(-1)
        if r.size == 0 or not np.all(np.isfinite(r)) or np.any(r <= 0):
            raise InvalidInputError("radii must be positive finite numbers, one per class.")
        self.radii = r
        self.noise_scale_ = unit_noise_scale(self.epsilon, self.delta)
        self.sigmas_ = self.noise_scale_ * 2.0 * r

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the row-normalised request (rows divided by ``2 r_j``)."""
        return math.sqrt(ROWS_CHANGED)

    def check_domain(self, rows) -> np.ndarray:
        Z = np.asarray(rows, dtype=np.float64)
        if Z.ndim != 2 or Z.shape[0] != self.radii.shape[0]:
            raise InvalidInputError(f"expected {self.radii.shape[0]} rows (one per class); got shape {Z.shape}.")
        if not np.all(np.isfinite(Z)):
            raise InvalidInputError("rows contain NaN or infinite values.")
        n = np.linalg.norm(Z, axis=1)
        bad = np.flatnonzero(n > self.radii * (1 + CLIP_TOLERANCE))
        if bad.size:
            raise InvalidInputError(f"row {int(bad[0])} has norm {n[bad[0]]:.6g} > its clip radius "
                                    f"{self.radii[bad[0]]:.6g}: clip it first (ClassFrames.clip); the guarantee "
                                    "holds only inside the ball.")
        return Z

    def release(self, rows, rng: np.random.Generator | None = None) -> np.ndarray:
        """``rows + N(0, sigma_j^2)`` per row; ``rng`` from :func:`~pm_vector.privacy.secure_generator`."""
        Z = self.check_domain(rows)
        g = require_generator(rng)
        return Z + g.normal(0.0, 1.0, size=Z.shape) * self.sigmas_[:, None]

    def __repr__(self) -> str:
        return (f"ClassRowsGaussianMechanism(epsilon={self.epsilon!r}, delta={self.delta!r}, "
                f"classes={self.radii.shape[0]}) [s={self.noise_scale_:.6g}]")
