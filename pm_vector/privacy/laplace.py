"""Laplace mechanism (pure epsilon-DP)."""

from __future__ import annotations

import numpy as np

from .gaussian import as_release_input, check_epsilon, check_sensitivity
from .rng import require_generator

__all__ = ["LaplaceMechanism"]


class LaplaceMechanism:
    """Laplace mechanism (Dwork, McSherry, Nissim & Smith 2006).

    Adds iid Laplace(0, b) noise, ``b = sensitivity / epsilon``, to every entry.
    Guarantee: pure epsilon-DP (delta = 0) for a query whose **L1** sensitivity
    (sum of absolute changes over all released entries) is <= ``sensitivity``.
    An L2 bound Delta_2 on m released entries gives L1 <= sqrt(m) * Delta_2;
    passing an L2 bound directly is not a valid calibration.
    """

    delta = 0.0

    def __init__(self, epsilon: float, sensitivity: float):
        self.epsilon = check_epsilon(epsilon)
        self.sensitivity = check_sensitivity(sensitivity)
        self.scale = self.sensitivity / self.epsilon

    def release(self, value, rng: np.random.Generator | None = None) -> np.ndarray:
        """Return ``value + Laplace(0, scale)`` noise (iid per entry, same shape, float64).

        ``rng`` must come from :func:`pm_vector.privacy.secure_generator`; ``None``
        draws a fresh cryptographically seeded generator.
        """
        a = as_release_input(value)
        g = require_generator(rng)
        return a + g.laplace(0.0, self.scale, size=a.shape)

    def __repr__(self) -> str:
        return f"LaplaceMechanism(epsilon={self.epsilon!r}, sensitivity={self.sensitivity!r}) [scale={self.scale:.6g}]"
