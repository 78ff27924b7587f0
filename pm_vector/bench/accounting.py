"""``pm-vector bench accounting``: how much noise the class-rows request would save with a tighter
(epsilon, delta) accounting, and what the audited libraries say about the one it uses.

For each epsilon (at the request's delta and L2 sensitivity ``sqrt(2) (G + sqrt(d))`` grid steps,
:mod:`pm_vector.privacy.class_rows`):

* ``sigma_zcdp``: the noise the release uses -- discrete Gaussian, ``rho``-zCDP (CKS 2020 Thm 14),
  ``rho`` the largest value whose CKS Cor. 13 conversion gives (epsilon, delta);
* ``sigma_pld``: the smallest noise of a *continuous* Gaussian with the same L2 sensitivity, by
  Google's ``dp_accounting`` (its exact Gaussian privacy profile, Balle & Wang 2018; for one
  release the privacy-loss distribution is that profile); ``sigma_pld_check`` is the
  project's own analytic Gaussian (:func:`~pm_vector.privacy.class_rows.unit_noise_scale`);
* ``ratio = sigma_zcdp / sigma_pld``: the noise the tighter accounting would save;
* ``opendp_epsilon``: the epsilon that OpenDP's zCDP-to-(epsilon, delta) conversion certifies for
  the release's ``rho`` at delta (it must not exceed the target);
* with ``timing``: ``release_ms_csprng`` / ``release_ms_pcg64``, the median CPU time of one
  request's release (``rows`` x ``dim`` on the grid) drawing from the OS CSPRNG (what clients
  use) and from numpy's PCG64 (what releases used before; not a cryptographic generator).

The continuous profile is **not** adopted for the release: it is proven for the continuous
Gaussian, whose law is rotation invariant; the discrete Gaussian on ``Z^d`` is not, and the
1-D discrete-Gaussian PLD covers an integer shift along one axis only, not every shift of L2
norm ``Delta`` in ``d`` dimensions. Until a multivariate bound with an explicit correction
is verified (or the release becomes an exact post-processing of a continuous Gaussian), the
release keeps the zCDP calibration, which CKS prove for exactly this mechanism.
"""

from __future__ import annotations

import math
import secrets
import statistics
import time
from typing import Any

import numpy as np

from ..privacy.class_rows import (DEFAULT_GRID_STEPS, ROWS_CHANGED, discrete_unit_noise_scale, row_sensitivity,
                                  unit_noise_scale, ClassRowsGaussianMechanism)
from ..privacy.discrete import zcdp_rho_for
from ..privacy.rng import SecureRandom

DEFAULT_EPSILONS = (1.0, 4.0, 16.0)


def opendp_epsilon(rho: float, delta: float) -> float:
    """The epsilon OpenDP's ``make_zCDP_to_approxDP`` certifies at ``delta`` for a ``rho``-zCDP
    mechanism (its discrete Gaussian on integer vectors under the L2 distance, scale chosen so
    that its own zCDP map gives ``rho``)."""
    import opendp.prelude as dp

    dp.enable_features("contrib")  # OpenDP's discrete Gaussian and its conversion are in contrib
    sens = 1000  # integer L2 sensitivity; scale = sens / sqrt(2 rho) gives rho exactly (up to float)
    meas = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int),
                              scale=sens / math.sqrt(2.0 * rho))
    return float(dp.c.make_zCDP_to_approxDP(meas).map(sens).epsilon(delta))


def release_ms(epsilon: float, delta: float, dim: int, rows: int = 10, repeats: int = 30) -> tuple[float, float]:
    """Median CPU milliseconds of one request's release (``rows`` x ``dim``, zero rows, unit radii)
    drawing from the OS CSPRNG, and from a PCG64 generator (the comparison only)."""
    mech = ClassRowsGaussianMechanism(epsilon, delta, np.ones(rows), dim)
    Z = np.zeros((rows, dim))

    def med(make) -> float:
        ts = []
        for _ in range(repeats):
            g = make()
            t = time.process_time()
            mech.release(Z, g)
            ts.append((time.process_time() - t) * 1e3)
        return statistics.median(ts)

    return med(SecureRandom), med(lambda: np.random.Generator(np.random.PCG64(secrets.randbits(128))))


def run(epsilons=DEFAULT_EPSILONS, delta: float = 1e-5, dim: int = 16,
        grid_steps: int = DEFAULT_GRID_STEPS, timing: bool = False) -> dict[str, Any]:
    """The comparison as one JSON-ready dict (``rows``: one per epsilon). Noise scales are in
    units of a row's diameter ``2 r`` (``sigma_c = s * 2 r_c``), like ``noise_scale_``."""
    import dp_accounting

    sens_units = math.sqrt(ROWS_CHANGED) * row_sensitivity(dim, grid_steps) / grid_steps  # in units of 2 r
    rows = []
    for eps in epsilons:
        eps = float(eps)
        s_zcdp = discrete_unit_noise_scale(eps, delta, dim, grid_steps)
        s_pld = dp_accounting.get_sigma_gaussian(eps, delta) * sens_units
        s_check = unit_noise_scale(eps, delta) / math.sqrt(ROWS_CHANGED) * sens_units
        rho = zcdp_rho_for(eps, delta)
        rows.append({"epsilon": eps, "delta": delta, "rho": rho, "sigma_zcdp": s_zcdp, "sigma_pld": s_pld,
                     "sigma_pld_check": s_check, "ratio": s_zcdp / s_pld, "noise_saved": 1.0 - s_pld / s_zcdp,
                     "opendp_epsilon": opendp_epsilon(rho, delta)})
        if timing:
            rows[-1]["release_ms_csprng"], rows[-1]["release_ms_pcg64"] = release_ms(eps, delta, dim)
    return {"mechanism": "class-rows request: discrete Gaussian on the grid, L2 sensitivity sqrt(2) (G + sqrt(d))",
            "dim": int(dim), "grid_steps": int(grid_steps), "sensitivity_row_units": sens_units,
            "adopted": "zcdp", "why_not_pld": ("the continuous Gaussian's profile is proven for a rotation-invariant "
                                               "law; the d-dimensional discrete Gaussian is not, and a 1-D discrete "
                                               "PLD does not cover an L2 bound in d dimensions"),
            "rows": rows}
