"""Exact samplers for the discrete Laplace and discrete Gaussian (Canonne, Kamath & Steinke 2020).

Why: a float sampler (inverse CDF of 53-bit uniforms, numpy's normal) produces outputs that are
not evenly spaced, so the low bits of ``x + noise`` can tell ``x`` from a neighbour ``x'`` far
more often than (epsilon, delta) allows (Mironov 2012). These samplers return *integers* drawn
from exactly the stated distribution: every step is integer or rational arithmetic (Python ints
when a value might not fit in int64), and the only randomness is uniform integers from the
generator (``rng=None``, production: a fresh :func:`pm_vector.privacy.secure_generator`, which
reads the operating system's CSPRNG; a seeded ``numpy.random.Generator`` only in tests).
A release ``gamma * (round(x / gamma) + Z)`` on a public grid ``gamma`` then has outputs on
the grid only, and its privacy is that of the integer mechanism.

Guarantees (CKS 2020):

* :func:`sample_discrete_laplace` ``(scale)``: ``P[X = x] = (e^{1/scale} - 1) / (e^{1/scale} + 1)
  * e^{-|x|/scale}`` on the integers (their Algorithm 2). Adding it to an integer query of L1
  sensitivity ``Delta`` is ``(Delta / scale)``-DP (pure), as for the continuous Laplace.
* :func:`sample_discrete_gaussian` ``(sigma)``: ``P[X = x] proportional to e^{-x^2 / (2 sigma^2)}``
  on the integers (their Algorithm 3). Adding iid copies to an integer vector query of L2
  sensitivity ``Delta`` satisfies ``Delta^2 / (2 sigma^2)``-zCDP (their Theorem 14), the same
  concentrated-DP bound as the continuous Gaussian; :func:`zcdp_to_delta` converts to
  (epsilon, delta). Its variance is slightly *below* ``sigma^2`` (their Proposition 5).
* :func:`sample_uniform_integers` ``(high)``: uniform on ``{0, ..., high - 1}`` for any Python int
  ``high >= 1`` (rejection on 63-bit words above int64).
* :func:`sample_bernoulli` ``(p)``: ``P[True] = p`` for a rational ``p`` in ``[0, 1]``, and
  :func:`sample_bernoulli_exp` ``(x)``: ``P[True] = exp(-x)`` for a rational ``x >= 0`` (CKS
  Algorithm 1). Building blocks for other exact mechanisms (randomized response, exponential
  mechanisms on integers): with ``rng=None`` every bit comes from the OS CSPRNG.

``scale`` and ``sigma`` are in grid units and are used exactly: a float is turned into the
rational number it represents (``fractions.Fraction``), nothing is rounded.
"""

from __future__ import annotations

import functools
import math
import numbers
from fractions import Fraction

import numpy as np

from ..errors import InvalidInputError, PrivacyParameterError
from .rng import require_generator

__all__ = [
    "sample_uniform_integers",
    "sample_bernoulli",
    "sample_bernoulli_exp",
    "discrete_gaussian_pmf",
    "sample_discrete_gaussian",
    "sample_discrete_gaussian_var",
    "sample_discrete_laplace",
    "zcdp_rho_for",
    "zcdp_to_delta",
]

#: int64 arithmetic is used while every bound stays below this; above it Python ints (object arrays)
_INT_SAFE = 1 << 62


# --------------------------------------------------------------------------- integer helpers
def _fits(*arrays) -> bool:
    """Every value of every array is below 2^62 in magnitude (int64 arithmetic is exact)."""
    return all(a.size == 0 or int(np.max(np.abs(a))) < _INT_SAFE for a in arrays)


def _obj(a) -> np.ndarray:
    """``a`` as an object array of Python ints (exact, unbounded)."""
    out = np.empty(np.shape(a), dtype=object)
    out[...] = [int(v) for v in np.asarray(a).reshape(-1)] if np.size(a) else []
    return out.reshape(np.shape(a)) if np.size(a) else out


def _randbelow(b: int, rng: np.random.Generator) -> int:
    """Uniform integer in ``[0, b)`` for an arbitrary Python int ``b >= 1`` (rejection on 63-bit words)."""
    k = b.bit_length()
    words = -(-k // 63)
    while True:
        v = 0
        for w in rng.integers(0, 1 << 63, size=words, dtype=np.int64):
            v = (v << 63) | int(w)
        v &= (1 << k) - 1
        if v < b:
            return v


def _uniform_below(bound: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform integers in ``[0, bound_i)`` elementwise (``bound_i >= 1``)."""
    if _fits(bound):
        u = rng.integers(0, bound.astype(np.int64))
        return u if bound.dtype != object else _obj(u)
    return _obj([_randbelow(int(b), rng) for b in bound.reshape(-1)]).reshape(bound.shape)


def _mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact elementwise product: int64 when it cannot overflow, else Python ints."""
    if a.size == 0 or (a.dtype != object and b.dtype != object
                       and int(np.max(np.abs(a))) * int(np.max(np.abs(b))) < _INT_SAFE):
        return a * b
    return _obj(a) * _obj(b)


def _bernoulli_ratio(num: np.ndarray, den: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Exact Bernoulli(num/den) elementwise, 0 <= num <= den, den >= 1."""
    return _uniform_below(den, rng) < num


def _bernoulli_exp_le1(num: np.ndarray, den: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Exact Bernoulli(exp(-num/den)) for 0 <= num/den <= 1 (CKS Algorithm 1, first part):
    K = 1, 2, ... while Bernoulli(gamma / K) succeeds; return [K odd]."""
    n = num.shape[0]
    K = np.ones(n, dtype=np.int64)
    active = np.arange(n)
    dmax = int(np.max(den)) if n else 0
    small = num.dtype != object and den.dtype != object
    step = 1
    while active.size:
        if small and dmax * step < _INT_SAFE:  # K <= step here: den * K fits in int64
            a = rng.integers(0, den[active] * K[active]) < num[active]
        else:
            a = _bernoulli_ratio(num[active], _mul(den[active], K[active]), rng)
        K[active[a]] += 1
        active = active[a]
        step += 1
    return (K % 2) == 1


def _bernoulli_exp1(m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` exact Bernoulli(exp(-1)) draws: :func:`_bernoulli_exp_le1` with gamma = 1, where
    Bernoulli(1/K) is ``uniform{0..K-1} == 0``."""
    K = np.ones(m, dtype=np.int64)
    active = np.arange(m)
    while active.size:
        a = rng.integers(0, K[active]) == 0
        K[active[a]] += 1
        active = active[a]
    return (K % 2) == 1


def _bernoulli_exp(num: np.ndarray, den: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Exact Bernoulli(exp(-num/den)) for any num/den >= 0 (CKS Algorithm 1): floor(gamma)
    Bernoulli(exp(-1)) trials must all succeed, then one Bernoulli(exp(-frac(gamma)))."""
    whole = num // den
    frac = num - whole * den
    out = np.ones(num.shape[0], dtype=bool)
    j = 0
    active = np.flatnonzero(whole > j)
    while active.size:
        out[active] &= _bernoulli_exp1(active.size, rng)
        j += 1
        active = np.flatnonzero((whole > j) & out)
    live = np.flatnonzero(out)
    if live.size:
        out[live] = _bernoulli_exp_le1(frac[live], den[live], rng)
    return out


def _geometric_exp1(m: int, rng: np.random.Generator) -> np.ndarray:
    """V with P[V = v] = (1 - e^-1) e^{-v}: successes of Bernoulli(e^-1) before the first failure."""
    V = np.zeros(m, dtype=np.int64)
    active = np.arange(m)
    while active.size:
        a = _bernoulli_exp1(active.size, rng)
        V[active[a]] += 1
        active = active[a]
    return V


def _positive_fraction(name: str, value) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Fraction)):
        raise PrivacyParameterError(f"{name} must be a positive real number; got {value!r}.")
    if not isinstance(value, (numbers.Rational, Fraction)):
        v = float(value)
        if not (math.isfinite(v) and v > 0):
            raise PrivacyParameterError(f"{name} must be finite and > 0; got {value!r}.")
        return Fraction(v)
    f = Fraction(value)
    if f <= 0:
        raise PrivacyParameterError(f"{name} must be > 0; got {value!r}.")
    return f


def _check_size(size) -> tuple[int, ...]:
    shape = (size,) if isinstance(size, numbers.Integral) and not isinstance(size, bool) else tuple(size)
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0 for s in shape):
        raise InvalidInputError(f"size must be a non-negative int or a tuple of them; got {size!r}.")
    return tuple(int(s) for s in shape)


def _as_int64(a: np.ndarray) -> np.ndarray:
    if a.dtype == object and a.size and max(abs(int(v)) for v in a) >= (1 << 63):
        raise PrivacyParameterError("a sample does not fit in int64: the scale is far too large for a grid release.")
    return a.astype(np.int64)


# --------------------------------------------------------------------------- samplers
def _oversample(need: int) -> int:
    # candidates per round: twice what is missing (+16), so a small request needs ~1 round; the
    # first `need` accepted iid candidates are iid draws of the target, so this changes nothing
    return 2 * need + 16


def _collect(parts: list, m: int, big: bool) -> np.ndarray:
    out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return out[:m] if not big else _obj(out[:m])


def _dlap_rational(t: int, s: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` draws of the discrete Laplace with scale ``t/s`` (CKS Algorithm 2), exact."""
    big = max(t, s) >= _INT_SAFE
    tt = np.array([t], dtype=object if t >= _INT_SAFE else np.int64)
    parts, have = [], 0
    while have < m:
        k = _oversample(m - have)
        U = _uniform_below(np.repeat(tt, k), rng)
        keep = _bernoulli_exp_le1(U, np.repeat(tt, k), rng)  # accept U with prob exp(-U/t)
        U = U[keep]
        V = _geometric_exp1(U.shape[0], rng)
        X = U + _mul(np.repeat(tt, U.shape[0]), V)  # X ~ Geometric(1 - e^{-1/t}) on the integers >= 0
        Y = X // s
        B = rng.integers(0, 2, size=U.shape[0]).astype(bool)
        ok = ~(B & (Y == 0))  # reject "-0" so 0 is not counted twice
        vals = np.where(B, -Y, Y)[ok]
        parts.append(vals)
        have += vals.shape[0]
    return _collect(parts, m, big)


def _nonneg_fraction(name: str, value) -> Fraction:
    if value == 0 and not isinstance(value, bool):
        return Fraction(0)
    return _positive_fraction(name, value)


def _int_array(v: int, m: int) -> np.ndarray:
    return np.full(m, v, dtype=np.int64) if abs(v) < _INT_SAFE else _obj([v] * m)


def sample_uniform_integers(high, size, rng: np.random.Generator | None = None) -> np.ndarray:
    """iid uniform integers on ``{0, ..., high - 1}``, exactly (any Python int ``high >= 1``).

    ``rng=None`` (production) draws from the OS CSPRNG (:func:`~pm_vector.privacy.secure_generator`).
    Returns int64, or an object array of Python ints when ``high > 2^62``."""
    if isinstance(high, bool) or not isinstance(high, numbers.Integral) or high < 1:
        raise InvalidInputError(f"high must be an integer >= 1; got {high!r}.")
    shape = _check_size(size)
    g = require_generator(rng)
    u = _uniform_below(_int_array(int(high), math.prod(shape)), g)
    return u.reshape(shape)


def sample_bernoulli(p, size, rng: np.random.Generator | None = None) -> np.ndarray:
    """iid exact Bernoulli(``p``) draws (bool) for a rational ``p`` in ``[0, 1]`` (an int, a
    ``Fraction``, or a float taken as the rational it represents): ``U < num`` with ``U``
    uniform on ``{0, ..., den - 1}``. ``rng=None`` draws from the OS CSPRNG."""
    f = _nonneg_fraction("p", p)
    if f > 1:
        raise PrivacyParameterError(f"p must lie in [0, 1]; got {p!r}.")
    shape = _check_size(size)
    g = require_generator(rng)
    m = math.prod(shape)
    out = _bernoulli_ratio(_int_array(f.numerator, m), _int_array(f.denominator, m), g)
    return np.asarray(out, dtype=bool).reshape(shape)


def sample_bernoulli_exp(x, size, rng: np.random.Generator | None = None) -> np.ndarray:
    """iid exact Bernoulli(``exp(-x)``) draws (bool) for a rational ``x >= 0`` (an int, a
    ``Fraction``, or a float taken as the rational it represents), by CKS 2020 Algorithm 1:
    ``floor(x)`` Bernoulli(``e^-1``) trials and one Bernoulli(``e^-frac(x)``), each from uniform
    integers only. ``rng=None`` draws from the OS CSPRNG."""
    f = _nonneg_fraction("x", x)
    shape = _check_size(size)
    g = require_generator(rng)
    m = math.prod(shape)
    if m == 0:
        return np.zeros(shape, dtype=bool)
    out = _bernoulli_exp(_int_array(f.numerator, m), _int_array(f.denominator, m), g)
    return np.asarray(out, dtype=bool).reshape(shape)


def sample_discrete_laplace(scale, size, rng: np.random.Generator | None = None) -> np.ndarray:
    """iid discrete Laplace draws, ``P[X = x] proportional to exp(-|x| / scale)`` on the integers.

    ``scale`` (grid units, > 0) is used exactly (a float is the rational it represents).
    Exact (CKS 2020 Algorithm 2): integer/rational arithmetic only, uniform integers from ``rng``
    (a :func:`~pm_vector.privacy.secure_generator`; ``None`` draws a fresh one). Adding it to an
    integer-valued query of L1 sensitivity ``Delta`` is ``Delta / scale``-DP. Returns int64.
    """
    f = _positive_fraction("scale", scale)
    shape = _check_size(size)
    g = require_generator(rng)
    m = math.prod(shape)
    return _as_int64(_dlap_rational(f.numerator, f.denominator, m, g)).reshape(shape)


def sample_discrete_gaussian(sigma, size, rng: np.random.Generator | None = None) -> np.ndarray:
    """iid discrete Gaussian draws, ``P[X = x] proportional to exp(-x^2 / (2 sigma^2))`` on the integers.

    ``sigma`` (grid units, > 0) is used exactly. Exact (CKS 2020 Algorithm 3): ``t = floor(sigma)
    + 1``; draw ``Y`` from the discrete Laplace of scale ``t`` and accept it with probability
    ``exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))``, all in rational arithmetic. Adding iid draws to an
    integer vector query of L2 sensitivity ``Delta`` satisfies ``Delta^2/(2 sigma^2)``-zCDP (CKS
    Theorem 14); see :func:`zcdp_to_delta`. Returns int64.
    """
    f = _positive_fraction("sigma", sigma)
    return sample_discrete_gaussian_var(f * f, size, rng)


def sample_discrete_gaussian_var(sigma2, size, rng: np.random.Generator | None = None) -> np.ndarray:
    """:func:`sample_discrete_gaussian` given the exact parameter ``sigma^2`` (an int or a
    ``Fraction``; a float is the rational it represents). An integer ``sigma2`` keeps every step in
    int64 arithmetic for ``sigma`` up to ~3e4 grid steps (much faster than a float ``sigma``,
    whose square has a 2^100-sized denominator)."""
    s2 = _positive_fraction("sigma2", sigma2)
    shape = _check_size(size)
    g = require_generator(rng)
    m = math.prod(shape)
    N, D = s2.numerator, s2.denominator  # sigma^2 = N / D
    t = math.isqrt(N // D) + 1  # floor(sigma) + 1
    den0 = 2 * N * D * t * t
    parts, have = [], 0
    while have < m:
        k = _oversample(m - have)
        Y = _dlap_rational(t, 1, k, g)
        # gamma = (|Y| - sigma^2/t)^2 / (2 sigma^2) = (|Y| D t - N)^2 / (2 N D t^2)
        x = _mul(np.abs(Y), np.full(k, D * t, dtype=np.int64 if D * t < _INT_SAFE else object))
        x = np.abs(x - N) if x.dtype != object and N < _INT_SAFE else np.abs(_obj(x) - N)
        num = _mul(x, x)
        den = np.full(k, den0, dtype=np.int64 if den0 < _INT_SAFE else object)
        acc = _bernoulli_exp(num, den, g)
        parts.append(_as_int64(np.asarray(Y[acc])))
        have += int(acc.sum())
    return _collect(parts, m, False).reshape(shape)


def discrete_gaussian_pmf(values, sigma) -> np.ndarray:
    """Exact-to-float pmf of the discrete Gaussian at integer ``values`` (for tests and accounting)."""
    s = float(sigma)
    half = int(math.ceil(40 * s)) + 2
    z = np.arange(-half, half + 1, dtype=np.float64)
    norm = math.fsum(np.exp(-z * z / (2 * s * s)))
    v = np.asarray(values, dtype=np.float64)
    return np.exp(-v * v / (2 * s * s)) / norm


# --------------------------------------------------------------------------- accounting
def _log_zcdp_delta(rho: float, epsilon: float) -> float:
    from scipy import optimize

    def log_delta(log_am1: float) -> float:
        a = 1.0 + math.exp(log_am1)
        return (a - 1.0) * (a * rho - epsilon) - math.log(a) + (a - 1.0) * math.log1p(-1.0 / a)

    a_star = max((epsilon + rho) / (2 * rho), 1.0 + 1e-9)
    lo, hi = math.log(1e-9), math.log(max(4 * a_star, 10.0))
    res = optimize.minimize_scalar(log_delta, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
    return min(0.0, float(res.fun), log_delta(math.log(a_star - 1.0)))


def zcdp_to_delta(rho: float, epsilon: float) -> float:
    """Smallest delta certified for a ``rho``-zCDP mechanism at ``epsilon``.

    CKS 2020 Corollary 13: ``delta = inf_{alpha > 1} exp((alpha - 1)(alpha rho - epsilon)) / alpha
    * (1 - 1/alpha)^(alpha - 1)``; minimised numerically over alpha (any alpha gives a valid bound,
    so an imperfect minimiser errs on the safe side).
    """
    rho, epsilon = float(rho), float(epsilon)
    if not (rho > 0 and math.isfinite(rho)) or not (epsilon > 0 and math.isfinite(epsilon)):
        raise PrivacyParameterError(f"need rho > 0 and epsilon > 0; got rho={rho!r}, epsilon={epsilon!r}.")
    return math.exp(_log_zcdp_delta(rho, epsilon))


def zcdp_rho_for(epsilon: float, delta: float) -> float:
    """Largest ``rho`` (to a relative 1e-9, rounded down) with ``zcdp_to_delta(rho, epsilon) <= delta``."""
    return _zcdp_rho_for(float(epsilon), float(delta))


@functools.lru_cache(maxsize=256)  # a pure function of two floats; every client request asks it
def _zcdp_rho_for(epsilon: float, delta: float) -> float:
    from scipy import optimize

    epsilon, delta = float(epsilon), float(delta)
    if not (0 < delta < 1):
        raise PrivacyParameterError(f"delta must satisfy 0 < delta < 1; got {delta!r}.")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise PrivacyParameterError(f"epsilon must be finite and > 0; got {epsilon!r}.")
    f = lambda lr: _log_zcdp_delta(math.exp(lr), epsilon) - math.log(delta)
    lo, hi = math.log(1e-12), math.log(max(epsilon, 1e-6))
    while f(lo) > 0:
        lo -= 5.0
    while f(hi) <= 0:
        hi += 1.0
    lr = optimize.brentq(f, lo, hi, xtol=1e-12)
    rho = math.exp(lr) * (1 - 1e-9)
    while zcdp_to_delta(rho, epsilon) > delta:  # round down until certified
        rho *= 1 - 1e-9
    return rho
