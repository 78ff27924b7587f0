"""The Laplace variant of PrivateMail (the earlier paper): Corollary 1.1 with the Appendix E constants.

Implemented as printed, for comparison and reproduction. It is **not** a pure
epsilon-DP mechanism and its sensitivity bound is **not proven**:

* Theorem 1 / Corollary 1.1 bound the sensitivity only with probability
  ``1 - sum over neighbouring pairs of beta`` over the draw of the random
  initialisation Q (a tail bound on a Welch-Satterthwaite *approximation* of
  a sum of gammas, then a union bound). Over a continuous data domain that
  sum has infinitely many terms, so no failure probability below 1 follows
  unless you restrict the union to ``union_size`` pairs yourself.
* The Appendix E constants are term-by-term bounds on the *squared* row norm
  ``z_i^T z_i`` (the paper writes ``||z_i||``) and Corollary 1.1 plugs them in
  as norm bounds. ``phi_min`` is not a valid lower bound: with alpha = 0, all
  n rows equal to x and the new record v at 60 degrees from x, v is at
  distance 1 from every row, exactly like the zero padding row, so the whole
  difference matrix is 0, while ``phi_min`` is positive for large sigma
  (e.g. 1.98 at n = 500, sigma = 20).
* The paper adds Lap(Delta/eps) per entry with an L2 (Frobenius) Delta; the
  Laplace mechanism needs an L1 bound. By default the noise scale is
  ``sqrt(m) * Delta / eps`` (m released entries, L1 <= sqrt(m) L2);
  ``calibration="paper"`` reproduces the printed Delta/eps.

For real releases use the Gaussian mechanism with
:func:`pm_vector.privacy.smlq_sensitivity`.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import DomainError, InvalidInputError, PrivacyParameterError
from .gaussian import as_release_input, check_epsilon
from .rng import require_generator
from .sensitivity import check_n, check_real, denominators, smallest_valid_sigma

__all__ = ["LaplaceVariantMechanism", "laplace_variant_constants", "laplace_variant_sensitivity",
           "max_log_beta"]

LABEL_ENCODINGS = ("one-hot", "integer")


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise InvalidInputError(f"k (embedding dimension, columns of Q) must be an int >= 1; got {k!r}.")
    return int(k)


def laplace_variant_constants(n: int, sigma: float, alpha: float, label_encoding: str = "one-hot",
                              c: int | None = None) -> dict[str, float]:
    """Appendix E constants ``z_ij^min/max``, ``z_ii^min/max``, ``phi_min``, ``phi_max`` as printed.

    With ``a = n e^{-2/s^2} + e^{-1/(2s^2)} - 1``, ``b = (n+1) e^{-2/s^2} - 1``,
    ``u = n + e^{-1/(2s^2)} - 1``:

    * ``"one-hot"`` (Appendix E, case 1 = eqs 32, 33, 37, 38). Appendix E's
      ``z_ij^max`` prints ``e^{-1/s^2}`` in the ``-2(alpha^2 e^{-2/s^2} + .)/(n u)``
      term; eq (37), from which it is derived, has ``e^{-4/s^2}``: eq (37) is used.
      The ``z_ij`` denominators are **not squared**, as printed.
    * ``"integer"`` labels in {0..c} (Appendix E case 2 is garbled in the
      source: its ``z_ij`` items repeat the ``z_ii`` formulas), so eqs (35),
      (36), (39), (40) of Appendix A.1 are used as printed, including the
      ``(n+1) e^{-1/s^2} - 1`` factor in (36) and ``e^{-(c^2+4)/s^2}`` in (40).

    ``phi_max = n z_ij^max + z_ii^max``, ``phi_min = n z_ij^min + z_ii^min``.
    Raises :class:`DomainError` where ``a <= 0`` or ``b <= 0``.
    """
    n = check_n(n)
    sigma = check_real("sigma", sigma, positive=True)
    alpha = check_real("alpha", alpha, positive=False)
    if label_encoding not in LABEL_ENCODINGS:
        raise InvalidInputError(f"label_encoding must be one of {LABEL_ENCODINGS}; got {label_encoding!r}.")
    a, b = denominators(n, sigma)
    if not (a > 0 and b > 0):
        raise DomainError(f"Appendix E constants are undefined at n={n}, sigma={sigma:g} (denominators {a:.4g}, "
                          f"{b:.4g} must be > 0); use sigma > {smallest_valid_sigma(n):.6g}.")
    s2 = sigma ** 2
    u = n + math.exp(-1.0 / (2.0 * s2)) - 1.0
    al2 = alpha ** 2
    e4 = math.exp(-4.0 / s2)
    if label_encoding == "one-hot":
        if c is not None:
            raise InvalidInputError("c is only used with label_encoding='integer'.")
        e1, e2, e3 = math.exp(-1.0 / s2), math.exp(-2.0 / s2), math.exp(-3.0 / s2)
        ly_min = n * e1 + math.exp(-1.0 / (2.0 * s2)) - 1.0      # eq (31)
        lyt_min = (n + 1) * e1 - 1.0                              # eq (31)
        z_ii_max = al2 * (u / a) ** 2 + al2 * (n / b) ** 2 - 2.0 * al2 * ly_min * lyt_min / (n * u)          # (32)
        z_ii_min = al2 * (ly_min / u) ** 2 + al2 * (lyt_min / n) ** 2 - 2.0 * al2 * n * u / (a * lyt_min)    # (33)
        z_ij_max = ((al2 + 1.0) / a - 2.0 * alpha * e3 / u + (al2 + 1.0) / b - 2.0 * alpha * e3 / n
                    - 2.0 * (al2 * e2 + e4) / (n * u) + 4.0 * alpha / (a * b))                               # (37)
        z_ij_min = ((al2 * e2 + e4) / u - 2.0 * alpha / a + (al2 * e2 + e4) / n - 2.0 * alpha / b
                    - 2.0 * (al2 + 1.0) / (a * b) + 4.0 * alpha * e3 / (n * u))                              # (38)
    else:
        if isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1:
            raise InvalidInputError(f"label_encoding='integer' needs c (largest label, labels in 0..c) as an int >= 1; "
                                    f"got {c!r}.")
        c2 = float(c) ** 2
        ec = math.exp(-c2 / (2.0 * s2))
        ec4 = math.exp(-(c2 + 4.0) / (2.0 * s2))
        ecc = math.exp(-c2 / s2)
        l_int = (n + 1) * ec - 1.0                                # eq (34)
        z_ii_max = al2 * (n / a) ** 2 + al2 * (n / b) ** 2 - 2.0 * al2 * l_int ** 2 / (n * u)                # (35)
        z_ii_min = (al2 * (l_int / u) ** 2 + al2 * (l_int / n) ** 2
                    - 2.0 * al2 * n ** 2 / (a * ((n + 1) * math.exp(-1.0 / s2) - 1.0)))                     # (36)
        z_ij_max = ((al2 + 1.0) / a - 2.0 * alpha * ec4 / u + (al2 + 1.0) / b - 2.0 * alpha * ec4 / n
                    - 2.0 * (al2 * ecc + e4) / (n * u) + 4.0 * alpha / (a * b))                              # (39)
        z_ij_min = ((al2 * ecc + e4) / u - 2.0 * alpha / a + (al2 * ecc + e4) / n - 2.0 * alpha / b
                    - 2.0 * (al2 + 1.0) / (a * b) + 4.0 * alpha * math.exp(-(c2 + 4.0) / s2) / (n * u))      # (40)
    return {"z_ij_min": z_ij_min, "z_ij_max": z_ij_max, "z_ii_min": z_ii_min, "z_ii_max": z_ii_max,
            "phi_min": n * z_ij_min + z_ii_min, "phi_max": n * z_ij_max + z_ii_max}


def max_log_beta(n: int, k: int) -> float:
    """Largest admissible ``ln(beta)``: ``-4 k n``.

    Theorem 1 requires ``0 < beta <= exp(-4k (sum_i ||z_i||^2)^2 / sum_i ||z_i||^4)``
    (sums over i = 1..n). By Cauchy-Schwarz the ratio is <= n, with equality
    when all row norms are equal, so the condition holds for every dataset iff
    ``ln(beta) <= -4 k n``. (For n = 500, k = 2 that is beta <= e^-4000, which
    underflows a float: pass ``log_beta``.)
    """
    return -4.0 * _check_k(k) * check_n(n)


def _resolve_log_beta(beta, log_beta, n: int, k: int) -> float:
    if (beta is None) == (log_beta is None):
        raise PrivacyParameterError("give exactly one of beta or log_beta (natural log of beta).")
    if beta is not None:
        if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0 < float(beta) < 1:
            raise PrivacyParameterError(f"beta must satisfy 0 < beta < 1; got {beta!r}.")
        lb = math.log(float(beta))
    else:
        if isinstance(log_beta, bool) or not isinstance(log_beta, numbers.Real) or not math.isfinite(float(log_beta)):
            raise PrivacyParameterError(f"log_beta must be a finite real number; got {log_beta!r}.")
        lb = float(log_beta)
    limit = max_log_beta(n, k)
    if not lb <= limit:
        raise PrivacyParameterError(
            f"beta outside the paper's range: Theorem 1 needs beta <= exp(-4k (sum ||z_i||^2)^2 / sum ||z_i||^4), "
            f"which holds for every dataset only if ln(beta) <= -4 k n = {limit:g} (n={n}, k={k}); "
            f"got ln(beta)={lb:g}.")
    return lb


def laplace_variant_sensitivity(n: int, sigma: float, alpha: float, k: int, sigma_q: float, *, beta=None,
                                log_beta=None, label_encoding: str = "one-hot", c: int | None = None) -> float:
    """Corollary 1.1 as printed.

    ``Delta = sigma_q/2 sqrt(-ln(beta) phi_max^4/phi_min^2 - 2 sqrt(-k n ln(beta) phi_min^4))``.

    A claimed high-probability (not worst-case) bound; see the module
    docstring. Raises :class:`DomainError` when ``phi_min <= 0`` (the formula
    divides by ``phi_min^2`` and assumes ``0 < phi_min <= ||z_i||``) or the square
    root's argument is not positive; :class:`PrivacyParameterError` for beta
    outside ``ln(beta) <= -4 k n``.
    """
    n = check_n(n)
    k = _check_k(k)
    sigma_q = check_real("sigma_q", sigma_q, positive=True)
    lb = _resolve_log_beta(beta, log_beta, n, k)
    consts = laplace_variant_constants(n, sigma, alpha, label_encoding, c)
    pmin, pmax = consts["phi_min"], consts["phi_max"]
    if not pmin > 0:
        raise DomainError(f"Appendix E gives phi_min = {pmin:.4g} <= 0 at n={n}, sigma={sigma:g}, alpha={alpha:g} "
                          f"({label_encoding} labels); Corollary 1.1 divides by phi_min^2 and is meaningless here.")
    arg = -lb * pmax ** 4 / pmin ** 2 - 2.0 * math.sqrt(-k * n * lb * pmin ** 4)
    if not arg > 0:
        raise DomainError(f"Corollary 1.1's square-root argument is {arg:.4g} <= 0 at these parameters.")
    return 0.5 * sigma_q * math.sqrt(arg)


class LaplaceVariantMechanism:
    """PrivateMail's Laplace variant (earlier paper, Fig. 3 step 3): Laplace noise at the Corollary 1.1 bound.

    Guarantee (``.guarantee``): **probabilistic, not pure epsilon-DP**. On the
    event that the true L2 sensitivity of the first SMLQ iteration is <=
    ``.sensitivity`` (an event over the draw of Q ~ N(0, sigma_q^2), which
    must be drawn independently of the data), the release is epsilon-DP
    (with the default L1 calibration). The paper claims the event fails with
    probability <= ``union_size * beta``; ``.failure_probability`` reports
    ``min(1, union_size * beta)``, and 1.0 when ``union_size`` is None (a
    continuous data domain has infinitely many neighbouring pairs). The claim
    itself rests on an approximation and on a lower bound ``phi_min`` that is
    violated by actual data (module docstring), so it is not a proof.

    ``beta`` / ``log_beta``: per-pair failure probability, refused unless
    ``ln(beta) <= -4 k n`` (:func:`max_log_beta`). ``calibration``: ``"l1"``
    (default) scale ``sqrt(m) Delta / eps`` with m = (n+1) k released entries;
    ``"paper"`` scale ``Delta / eps`` as printed (an L2 bound used as L1).
    """

    is_pure_dp = False
    delta = 0.0

    def __init__(self, epsilon: float, n: int, sigma: float, alpha: float, k: int, sigma_q: float, *, beta=None,
                 log_beta=None, label_encoding: str = "one-hot", c: int | None = None,
                 union_size: int | None = None, calibration: str = "l1"):
        self.epsilon = check_epsilon(epsilon)
        self.n = check_n(n)
        self.k = _check_k(k)
        self.log_beta = _resolve_log_beta(beta, log_beta, self.n, self.k)
        self.beta = math.exp(self.log_beta)  # may underflow to 0.0; log_beta is exact
        if union_size is not None and (isinstance(union_size, bool) or not isinstance(union_size, numbers.Integral)
                                       or union_size < 1):
            raise InvalidInputError(f"union_size must be None or an int >= 1; got {union_size!r}.")
        if calibration not in ("l1", "paper"):
            raise InvalidInputError(f"calibration must be 'l1' or 'paper'; got {calibration!r}.")
        self.union_size = union_size
        self.calibration = calibration
        self.label_encoding = label_encoding
        self.constants = laplace_variant_constants(self.n, sigma, alpha, label_encoding, c)
        self.sensitivity = laplace_variant_sensitivity(self.n, sigma, alpha, self.k, sigma_q, log_beta=self.log_beta,
                                                       label_encoding=label_encoding, c=c)
        if union_size is None:
            self.failure_probability = 1.0
        else:
            self.failure_probability = min(1.0, math.exp(min(0.0, self.log_beta + math.log(union_size))))
        m = (self.n + 1) * self.k
        self.scale = (math.sqrt(m) if calibration == "l1" else 1.0) * self.sensitivity / self.epsilon
        union = ("an unbounded number of neighbouring pairs (continuous domain): no failure bound below 1"
                 if union_size is None else f"{union_size} neighbouring pairs")
        self.guarantee = (
            f"probabilistic, NOT pure epsilon-DP: epsilon={self.epsilon:g}-DP only on the event that the true L2 "
            f"sensitivity is <= {self.sensitivity:.6g}; the paper's claimed failure probability is "
            f"union_size * beta over {union} -> failure_probability={self.failure_probability:.3g}. The bound relies "
            f"on a Welch-Satterthwaite approximation and Appendix E constants that are not valid bounds; noise "
            f"calibration: "
            f"{'L1 = sqrt(m) * L2' if calibration == 'l1' else 'as printed (L2 bound used as L1: invalid)'}.")

    def release(self, value, rng: np.random.Generator | None = None) -> np.ndarray:
        """Return ``value + Laplace(0, scale)`` noise; ``value`` must be the (n+1) x k first iterate."""
        a = as_release_input(value)
        if a.shape != (self.n + 1, self.k):
            raise InvalidInputError(f"value must have shape (n+1, k) = ({self.n + 1}, {self.k}); got {a.shape}.")
        g = require_generator(rng)
        return a + g.laplace(0.0, self.scale, size=a.shape)

    def __repr__(self) -> str:
        return (f"LaplaceVariantMechanism(epsilon={self.epsilon!r}, n={self.n}, k={self.k}, "
                f"log_beta={self.log_beta!r}) [sensitivity={self.sensitivity:.6g}, "
                f"failure_probability={self.failure_probability:.3g}]")
