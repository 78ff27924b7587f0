"""L2 sensitivity of PrivateMail's first SMLQ iteration (Appendix B of the PrivateMail paper).

The query (first iteration, appendix kernel)::

    f(X) = Q + 1/2 Diag(L_X)^+ (alpha L_Y - L_X) Q,   W_ij = exp(-||x_i - x_j||^2 / (2 sigma^2))

with L = Diag(W 1) - W (zero diagonal in W), rows of X unit-norm, label rows
``y_i`` with ``||y_i - y_j||^2 <= label_diameter_sq`` for every pair of graph
nodes, and Q a fixed, data-independent (n+1) x k matrix.

Neighbouring relation analysed (and the only one these bounds cover):
``X_pad`` = n unit rows plus an (n+1)-th all-zero row whose label is 0 (integer
labels) or the zero vector (one-hot); ``X~`` = the same n rows and labels plus
one extra unit-norm record with any label in place of the zero row. Note that
the zero row is a real graph node: it has kernel weight e^{-1/(2 sigma^2)} to
every unit row.

``label_diameter_sq``: c^2 for integer labels in {0, ..., c} (the zero row's
label 0 is in range), 2 for one-hot labels (the zero row's label vector is at
squared distance 1 <= 2 from every one-hot vector). The paper writes c^2.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import DomainError, InvalidInputError

__all__ = ["appendix_b_constant", "smlq_sensitivity", "paper_smlq_sensitivity", "smlq_first_iteration",
           "smallest_valid_sigma", "smallest_valid_n"]


# --------------------------------------------------------------------------- parameter checks
def check_n(n) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise InvalidInputError(f"n (number of unit-norm records, excluding the padding row) must be an int >= 1; "
                                f"got {n!r}.")
    return int(n)


def check_real(name: str, value, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(float(value)):
        raise InvalidInputError(f"{name} must be a real number; got {value!r}.")
    v = float(value)
    if not math.isfinite(v) or (v <= 0 if positive else v < 0):
        raise InvalidInputError(f"{name} must be finite and {'> 0' if positive else '>= 0'}; got {value!r}.")
    return v


# --------------------------------------------------------------------------- domain of Appendix B
def smallest_valid_sigma(n: int) -> float:
    """Infimum of the kernel bandwidths for which Appendix B's bound is defined at this n.

    Both denominators must be positive: ``(n+1) e^{-2/sigma^2} - 1 > 0`` and
    ``n e^{-2/sigma^2} + e^{-1/(2 sigma^2)} - 1 > 0``. The second exceeds the
    first by ``e^{-1/(2 sigma^2)} - e^{-2/sigma^2} > 0``, so the domain is
    exactly ``sigma > sqrt(2 / ln(n+1))`` (open interval).
    """
    n = check_n(n)
    return math.sqrt(2.0 / math.log(n + 1.0))


def smallest_valid_n(sigma: float) -> int:
    """Smallest n for which Appendix B's bound is defined at this bandwidth: ``n > e^{2/sigma^2} - 1``."""
    sigma = check_real("sigma", sigma, positive=True)
    t = 2.0 / sigma ** 2
    if t > 700:
        raise DomainError(f"sigma={sigma!r} is so small that no realistic n satisfies "
                          f"n > e^(2/sigma^2) - 1 = e^{t:.4g} - 1.")
    bound = math.expm1(t)
    return int(math.floor(bound)) + 1


def denominators(n: int, sigma: float) -> tuple[float, float]:
    e2 = math.exp(-2.0 / sigma ** 2)
    a = n * e2 + math.exp(-1.0 / (2.0 * sigma ** 2)) - 1.0   # lower bound on Diag(L_X)_ii
    b = (n + 1) * e2 - 1.0                                     # lower bound on Diag(L_X~)_ii
    return a, b


# --------------------------------------------------------------------------- the constant M of eq (8)
def appendix_b_constant(n: int, sigma: float, alpha: float, label_diameter_sq: float) -> float:
    """``M = n M_ij + M_ii``, transcribed from eq (8) of PrivateMail Appendix B (c^2 = ``label_diameter_sq``).

    With ``a = n e^{-2/s^2} + e^{-1/(2s^2)} - 1``, ``b = (n+1) e^{-2/s^2} - 1``,
    ``u = n + e^{-1/(2s^2)} - 1``::

        M_ii = alpha^2 [ (n/a)^2 + (n/b)^2 - 2 ((n+1) e^{-c^2/(2s^2)} - 1)^2 / (n u) ]
        M_ij = (alpha^2+1)/a^2 - 2 alpha e^{-(c^2+4)/(2s^2)}/u^2 + (alpha^2+1)/b^2
               - 2 alpha e^{-(c^2+4)/(2s^2)}/n^2 - 2 (alpha^2 e^{-c^2/s^2} + e^{-4/s^2})/(n u)
               + 4 alpha/(a b)

    What it bounds: the **squared** norm ``||M_r||^2`` of every row of
    ``M = Diag(L_X)^+(alpha L_Y - L_X) - Diag(L_X~)^+(alpha L_Y~ - L_X~)``
    (eq 9 expands a sum of squares), for the neighbouring relation in the
    module docstring. Raises :class:`DomainError` unless ``a > 0`` and ``b > 0``
    (i.e. ``sigma > sqrt(2/ln(n+1))``), where the derivation's lower bounds on
    the degrees are meaningless.
    """
    n = check_n(n)
    sigma = check_real("sigma", sigma, positive=True)
    alpha = check_real("alpha", alpha, positive=False)
    c2 = check_real("label_diameter_sq", label_diameter_sq, positive=False)
    a, b = denominators(n, sigma)
    if not (a > 0 and b > 0):
        s_min = smallest_valid_sigma(n)
        try:
            n_hint = f"or, at sigma={sigma:g}, n >= {smallest_valid_n(sigma)}"
        except DomainError:
            n_hint = f"(no practical n works at sigma={sigma:g})"
        raise DomainError(
            f"Appendix B's sensitivity bound is undefined at n={n}, sigma={sigma:g}: its denominators "
            f"n e^(-2/sigma^2) + e^(-1/(2 sigma^2)) - 1 = {a:.4g} and (n+1) e^(-2/sigma^2) - 1 = {b:.4g} "
            f"must both be > 0. "
            f"Use sigma > sqrt(2/ln(n+1)) = {s_min:.6g} for n={n}, {n_hint}. Refusing to calibrate noise.")
    s2 = sigma ** 2
    u = n + math.exp(-1.0 / (2.0 * s2)) - 1.0
    ec = math.exp(-c2 / (2.0 * s2))             # e^{-c^2/(2 s^2)}
    ec4 = math.exp(-(c2 + 4.0) / (2.0 * s2))    # e^{-(c^2+4)/(2 s^2)}
    m_ii = alpha ** 2 * ((n / a) ** 2 + (n / b) ** 2 - 2.0 * ((n + 1) * ec - 1.0) ** 2 / (n * u))
    m_ij = ((alpha ** 2 + 1.0) / a ** 2
            - 2.0 * alpha * ec4 / u ** 2
            + (alpha ** 2 + 1.0) / b ** 2
            - 2.0 * alpha * ec4 / n ** 2
            - 2.0 * (alpha ** 2 * math.exp(-c2 / s2) + math.exp(-4.0 / s2)) / (n * u)
            + 4.0 * alpha / (a * b))
    m = n * m_ij + m_ii
    if not (math.isfinite(m) and m > 0):
        raise DomainError(f"Appendix B constant is not a finite positive number at n={n}, sigma={sigma:g} (got {m!r}); "
                          f"sigma is too close to the domain boundary {smallest_valid_sigma(n):.6g}.")
    return m


def _check_q_frobenius(q_frobenius) -> float:
    return check_real("q_frobenius", q_frobenius, positive=True)


def smlq_sensitivity(n: int, sigma: float, alpha: float, label_diameter_sq: float, q_frobenius: float) -> float:
    """L2 (Frobenius) sensitivity bound of the first SMLQ iteration, **corrected** form.

    ``Delta = 1/2 * ||Q||_F * sqrt((n+1) * M)`` with ``M`` =
    :func:`appendix_b_constant`. Since ``f(X_pad) - f(X~) = 1/2 M Q`` and M
    bounds every squared row norm, ``||M||_F^2 <= (n+1) M`` and
    ``||M Q||_F <= ||M||_F ||Q||_F``. Valid for the neighbouring relation in the
    module docstring, unit-norm rows, the appendix kernel exp(-d^2/(2 sigma^2))
    and a Q that does not depend on the data. This is the value to calibrate
    noise with.
    """
    m = appendix_b_constant(n, sigma, alpha, label_diameter_sq)
    return 0.5 * _check_q_frobenius(q_frobenius) * math.sqrt((n + 1) * m)


def paper_smlq_sensitivity(n: int, sigma: float, alpha: float, label_diameter_sq: float, q_frobenius: float) -> float:
    """The paper's Theorem 2 value ``M sqrt(n+1) / 2 * ||Q||_F``: for documentation and comparison only.

    It treats M as a bound on the row norm although Appendix B derives a bound
    on the squared row norm, so it is smaller than :func:`smlq_sensitivity`
    exactly when M < 1 and then under-calibrates the noise. Never use it for a
    release.
    """
    m = appendix_b_constant(n, sigma, alpha, label_diameter_sq)
    return 0.5 * _check_q_frobenius(q_frobenius) * m * math.sqrt(n + 1)


# --------------------------------------------------------------------------- reference implementation of the query
def _laplacian_parts(z: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    sq = np.sum(z * z, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (z @ z.T), 0.0)
    w = np.exp(-d2 / (2.0 * sigma ** 2))
    np.fill_diagonal(w, 0.0)
    deg = w.sum(axis=1)
    return w, deg


def smlq_first_iteration(X, y_as_vectors, Q, sigma: float, alpha: float) -> np.ndarray:
    """Dense reference implementation of ``f(X) = Q + 1/2 Diag(L_X)^+ (alpha L_Y - L_X) Q``.

    ``X``: (m, d) rows (unit-norm rows and possibly the all-zero padding row);
    ``y_as_vectors``: (m, p) label vectors (integer labels as an (m, 1)
    column, or one-hot rows; the padding row's label is 0 / the zero vector);
    ``Q``: (m, k). Kernel ``exp(-||x_i - x_j||^2 / (2 sigma^2))`` on both X and
    Y, Laplacian ``L = Diag(W 1) - W``, pseudo-inverse of the diagonal (zero
    degree -> 0). O(m^2 (d + p + k)) time; intended for tests and audits.
    """
    x = np.asarray(X, dtype=np.float64)
    y = np.asarray(y_as_vectors, dtype=np.float64)
    q = np.asarray(Q, dtype=np.float64)
    if y.ndim == 1:
        y = y[:, None]
    for name, arr in (("X", x), ("y_as_vectors", y), ("Q", q)):
        if arr.ndim != 2:
            raise InvalidInputError(f"{name} must be 2-d; got shape {arr.shape}.")
        if not np.all(np.isfinite(arr)):
            raise InvalidInputError(f"{name} contains NaN or infinite values.")
    m = x.shape[0]
    if y.shape[0] != m or q.shape[0] != m:
        raise InvalidInputError(f"X, y_as_vectors and Q must have the same number of rows; got {x.shape[0]}, "
                                f"{y.shape[0]}, {q.shape[0]}.")
    sigma = check_real("sigma", sigma, positive=True)
    alpha = check_real("alpha", alpha, positive=False)
    wx, dx = _laplacian_parts(x, sigma)
    wy, dy = _laplacian_parts(y, sigma)
    # alpha L_Y - L_X = alpha (Diag(dy) - W_Y) - (Diag(dx) - W_X)
    a = alpha * (np.diag(dy) - wy) - (np.diag(dx) - wx)
    inv = np.divide(1.0, dx, out=np.zeros_like(dx), where=dx > 0)
    return q + 0.5 * (inv[:, None] * (a @ q))
