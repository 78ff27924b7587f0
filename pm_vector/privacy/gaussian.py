"""Gaussian mechanisms: the classical calibration (eps < 1) and the analytic one (any eps > 0).

Both add iid N(0, sigma^2) noise to every entry of a real array whose L2
(Frobenius) sensitivity over neighbouring datasets is at most ``sensitivity``.
Guarantees hold only if that sensitivity bound is true for the query and the
neighbouring relation you use; the mechanism cannot check it.

**Not floating-point safe.** The noise is a float64 normal draw (``Generator.normal``) added
to a float64 value. The guarantee is proven for real-valued noise; a float release has
outputs whose low bits depend on the input (Mironov 2012), so an attacker who sees the exact
float can in some cases rule a neighbour out, beyond delta. The releases that must be exact use
the discrete Gaussian on a public grid (:mod:`pm_vector.privacy.class_rows`,
:mod:`pm_vector.privacy.discrete`); these mechanisms serve the paper's protocol
(:mod:`pm_vector.client.privatemail`) and the comparisons with the papers.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from scipy import optimize, special

from ..errors import InvalidInputError, PrivacyParameterError
from .rng import require_generator

__all__ = ["GaussianMechanism", "AnalyticGaussianMechanism", "gaussian_privacy_profile", "gaussian_epsilon"]


# --------------------------------------------------------------------------- validation shared by the mechanisms
def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PrivacyParameterError(f"{name} must be a real number; got {value!r} ({type(value).__name__}).")
    v = float(value)
    if math.isnan(v):
        raise PrivacyParameterError(f"{name} is NaN.")
    return v


def check_epsilon(epsilon) -> float:
    e = _real("epsilon", epsilon)
    if not (e > 0 and math.isfinite(e)):
        raise PrivacyParameterError(f"epsilon must be finite and > 0; got {epsilon!r}.")
    return e


def check_delta(delta) -> float:
    d = _real("delta", delta)
    if not 0 < d < 1:
        raise PrivacyParameterError(f"delta must satisfy 0 < delta < 1; got {delta!r}. "
                                    "Use LaplaceMechanism for pure (delta = 0) differential privacy.")
    return d


def check_sensitivity(sensitivity, name: str = "sensitivity") -> float:
    s = _real(name, sensitivity)
    if not (s > 0 and math.isfinite(s)):
        raise PrivacyParameterError(f"{name} must be finite and > 0; got {sensitivity!r}.")
    return s


def as_release_input(value) -> np.ndarray:
    try:
        a = np.array(value, dtype=np.float64)  # copy: the caller's array is never modified
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"value must be a real numeric array; {exc}") from None
    if not np.all(np.isfinite(a)):
        raise InvalidInputError("value contains NaN or infinite entries; the sensitivity bound does not cover them.")
    return a


# --------------------------------------------------------------------------- exact privacy profile
def _log_sub_exp(a: float, b: float) -> float:
    """log(e^a - e^b) for a >= b (``-inf`` when equal)."""
    if b > a:
        raise ArithmeticError("log_sub_exp needs a >= b")
    if b == -math.inf:
        return a
    d = b - a
    if d == 0.0:
        return -math.inf
    return a + (math.log(-math.expm1(d)) if d > -math.log(2.0) else math.log1p(-math.exp(d)))


def _log_profile(sigma: float, epsilon: float, sensitivity: float) -> float:
    r = sensitivity / sigma
    a = special.log_ndtr(r / 2.0 - epsilon / r)
    b = epsilon + special.log_ndtr(-r / 2.0 - epsilon / r)
    return _log_sub_exp(float(a), float(min(b, a)))


def gaussian_privacy_profile(sigma: float, epsilon: float, sensitivity: float) -> float:
    """Smallest delta for which N(0, sigma^2) noise is (epsilon, delta)-DP at L2 sensitivity ``sensitivity``.

    Balle & Wang (2018), Theorem 8:
    ``Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D)``, evaluated in log space.
    """
    s = check_sensitivity(sigma, "sigma")
    return math.exp(_log_profile(s, check_epsilon(epsilon), check_sensitivity(sensitivity)))


def gaussian_epsilon(sigma: float, delta: float, sensitivity: float) -> float:
    """Smallest epsilon for which N(0, sigma^2) noise is (epsilon, delta)-DP at L2 sensitivity
    ``sensitivity``: the inverse of :func:`gaussian_privacy_profile` in epsilon (the profile
    decreases in epsilon), found by bisection from above (relative 1e-13), so that
    ``gaussian_privacy_profile(sigma, result, sensitivity) <= delta``."""
    s = check_sensitivity(sigma, "sigma")
    d = check_delta(delta)
    D = check_sensitivity(sensitivity)
    log_d = math.log(d)
    ok = lambda e: _log_profile(s, e, D) <= log_d  # noqa: E731
    lo, hi = 0.0, 1.0
    while not ok(hi):
        lo, hi = hi, hi * 2.0
        if hi > 1e15:
            raise PrivacyParameterError(f"no epsilon below 1e15 gives delta={delta!r} at sigma/sensitivity={s / D:g}.")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= 0.0 or hi - lo <= 1e-13 * hi:
            break
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi  # ok(hi) holds throughout


# --------------------------------------------------------------------------- mechanisms
class _GaussianBase:
    epsilon: float
    delta: float
    sensitivity: float
    sigma: float

    def release(self, value, rng: np.random.Generator | None = None) -> np.ndarray:
        """Return ``value + N(0, sigma^2)`` noise (iid per entry, same shape, float64).

        ``rng`` must come from :func:`pm_vector.privacy.secure_generator`; ``None``
        draws a fresh cryptographically seeded generator.
        """
        a = as_release_input(value)
        g = require_generator(rng)
        return a + g.normal(0.0, self.sigma, size=a.shape)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(epsilon={self.epsilon!r}, delta={self.delta!r}, "
                f"sensitivity={self.sensitivity!r}) [sigma={self.sigma:.6g}]")


class GaussianMechanism(_GaussianBase):
    """Classical Gaussian mechanism (Dwork & Roth 2014, Theorem A.1).

    ``sigma = sqrt(2 ln(1.25/delta)) * sensitivity / epsilon``. Guarantee:
    (epsilon, delta)-DP for a query of L2 sensitivity <= ``sensitivity``,
    **proven only for 0 < epsilon < 1**; epsilon >= 1 is refused (use
    :class:`AnalyticGaussianMechanism`, which is valid for every epsilon and
    never needs more noise).
    """

    def __init__(self, epsilon: float, delta: float, sensitivity: float):
        eps = check_epsilon(epsilon)
        if eps >= 1:
            raise PrivacyParameterError(
                f"GaussianMechanism's calibration sqrt(2 ln(1.25/delta)) * sensitivity / epsilon is proven only for "
                f"epsilon < 1; got epsilon={epsilon!r}. Use AnalyticGaussianMechanism(epsilon, delta, sensitivity), "
                "which is exact for every epsilon > 0.")
        self.epsilon = eps
        self.delta = check_delta(delta)
        self.sensitivity = check_sensitivity(sensitivity)
        self.sigma = math.sqrt(2.0 * math.log(1.25 / self.delta)) * self.sensitivity / self.epsilon


class AnalyticGaussianMechanism(_GaussianBase):
    """Analytic Gaussian mechanism (Balle & Wang 2018, Algorithm 1).

    ``sigma`` is the smallest noise level (up to root-finding precision, then
    rounded up by a relative 1e-10) for which N(0, sigma^2) noise is (epsilon, delta)-DP for a
    query of L2 sensitivity <= ``sensitivity``, for any epsilon > 0 and
    0 < delta < 1. The returned sigma is verified against the exact privacy
    profile (:func:`gaussian_privacy_profile`) and increased if rounding left
    it a hair too small, so ``gaussian_privacy_profile(sigma, ...) <= delta``.
    """

    def __init__(self, epsilon: float, delta: float, sensitivity: float):
        self.epsilon = check_epsilon(epsilon)
        self.delta = check_delta(delta)
        self.sensitivity = check_sensitivity(sensitivity)
        self.sigma = analytic_sigma(self.epsilon, self.delta, self.sensitivity)


def analytic_sigma(eps: float, delta: float, sens: float) -> float:
    log_delta = math.log(delta)
    log_exp_eps = eps  # log(e^eps)

    def log_b_plus(v: float) -> float:  # Phi(sqrt(eps v)) - e^eps Phi(-sqrt(eps (v+2))), increasing in v
        a = float(special.log_ndtr(math.sqrt(eps * v)))
        b = log_exp_eps + float(special.log_ndtr(-math.sqrt(eps * (v + 2.0))))
        return _log_sub_exp(a, min(a, b))

    def log_b_minus(u: float) -> float:  # Phi(-sqrt(eps u)) - e^eps Phi(-sqrt(eps (u+2))), decreasing in u
        a = float(special.log_ndtr(-math.sqrt(eps * u)))
        b = log_exp_eps + float(special.log_ndtr(-math.sqrt(eps * (u + 2.0))))
        return _log_sub_exp(a, min(a, b))

    log_delta0 = log_b_minus(0.0)  # = log(Phi(0) - e^eps Phi(-sqrt(2 eps)))
    if log_delta >= log_delta0:
        f = lambda v: log_b_plus(v) - log_delta  # noqa: E731
        hi = 1.0
        while f(hi) <= 0:
            hi *= 2.0
            if hi > 1e300:
                raise PrivacyParameterError("analytic Gaussian calibration did not bracket (delta too close to 1?).")
        v = 0.0 if f(0.0) >= 0 else optimize.brentq(f, 0.0, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=1000)
        alpha = 1.0 / (math.sqrt(1.0 + v / 2.0) + math.sqrt(v / 2.0))  # = sqrt(1+v/2) - sqrt(v/2), stable
    else:
        f = lambda u: log_b_minus(u) - log_delta  # noqa: E731
        hi = 1.0
        while f(hi) >= 0:
            hi *= 2.0
            if hi > 1e300:
                raise PrivacyParameterError("analytic Gaussian calibration did not bracket (delta too small?).")
        u = optimize.brentq(f, 0.0, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=1000)
        alpha = math.sqrt(1.0 + u / 2.0) + math.sqrt(u / 2.0)
    # Relative 1e-10 safety margin: float error in log_ndtr is ~1e-12 relative in delta, and
    # d(log delta)/d(log sigma) is O(10), so the exact (not just the float) profile stays <= delta.
    sigma = alpha * sens / math.sqrt(2.0 * eps) * (1.0 + 1e-10)
    # Round up until the float profile certifies the target delta.
    bump = 1e-15
    for _ in range(200):
        if _log_profile(sigma, eps, sens) <= log_delta:
            return sigma
        sigma *= 1.0 + bump
        bump *= 2.0
    raise PrivacyParameterError(f"analytic Gaussian calibration failed to certify delta={delta} at epsilon={eps}.")
