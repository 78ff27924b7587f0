"""The cell release: K-ary randomized response over public cells, pure epsilon-DP (delta 0).

What is released
----------------
Public: the cells (:class:`~pm_vector.manifold.public_cells.PublicCells`: per class ``c``, ``K``
centroids fit on the public anchor; one ``K`` for the whole request). The client's secret is its
query ``(x, c)`` (features and label); its true cell is ``a = cell_K(x, c)``, the nearest centroid
of class ``c``. The request is ``C`` integers ``R_1..R_C`` in class order:

* the real row ``R_c`` is ``a`` with probability ``p = e^eps / (e^eps + K - 1)`` and each other
  cell with ``q = 1 / (e^eps + K - 1)`` (K-ary randomized response, ``T(a, r)``);
* every other row ``R_j`` (``j != c``) is uniform on ``[0, K)``, independent of everything.

Guarantee
---------
:class:`CellRandomizedResponse` is epsilon-DP (pure, delta 0) for the **whole request** with
respect to replacing the query ``(x, c)`` by **any** other query ``(x', c')``. Proof: write
``U(r) = 1/K`` for a uniform row. The probability of an output ``R`` is
``P(R | x, c) = T(a, R_c) * prod_{j != c} U(R_j)``.

* Same class (``c' = c``, true cell ``b``): only row ``c`` differs, and
  ``P(R | x, c) / P(R | x', c) = T(a, R_c) / T(b, R_c)`` lies in ``[q/p, p/q] = [e^-eps, e^eps]``.
* Class change (``c' != c``, true cell ``b`` in class ``c'``): rows ``c`` and ``c'`` differ and
  ``P(R | x, c) / P(R | x', c') = [T(a, R_c) / U(R_c)] * [U(R_c') / T(b, R_c')]``
  ``= (K T(a, R_c)) / (K T(b, R_c'))``. Each of ``K T(., .)`` lies in ``[K q, K p]``, and
  ``K p = K e^eps / (e^eps + K - 1) <= e^eps`` (as ``K <= e^eps + K - 1``) and
  ``K q = K / (e^eps + K - 1) >= e^-eps`` (as ``K e^eps >= e^eps + K - 1``, i.e.
  ``(K - 1)(e^eps - 1) >= 0``); and ``K p / (K q) = e^eps``. So the ratio is at most
  ``K p / (K q) = e^eps`` and at least ``e^-eps``.

So the dummy rows cost nothing: a uniform row lies between any two RR rows. Two things break the
proof and are refused by construction: a K that differs between classes (the class-change ratio is
then ``e^eps * f(K_c) / f(K_c')``, ``f(K) = K / (e^eps + K - 1)``, above ``e^eps``), and dummy
rows that report the RR of a random dummy's cell (up to ``2 eps``). The server's ranking and the
client's re-ranking are post-processing. The ledger charges ``(epsilon, 0)`` per request.

Sampling (exact, integers only, fixed work)
-------------------------------------------
The real row is drawn by :class:`pm_vector.privacy.location.LocationRandomizedResponse`'s sampler:
``a`` if ``W < t`` else a uniform cell, with ``W`` one uniform 64-bit word and ``t / 2^64`` a
certified lower bound of ``(e^eps - 1) / (e^eps + K - 1)`` on the 2^-64 grid, both always drawn:
its work does not depend on ``a`` nor on whether the report is ``a`` (a rejection loop that ran
longer when it was not is gone). The law is ``p' = pi + (1 - pi)/K``, ``q' = (1 - pi)/K`` with
``pi <= pi*``, so ``p' <= p``, ``q' >= q`` and every inequality of the proof above holds with ``p'``,
``q'`` (``K p' <= e^eps``, ``K q' >= e^-eps``, ``p'/q' <= e^eps``). A dummy row is one uniform draw. All randomness is uniform integers
from a :func:`~pm_vector.privacy.secure_generator` (seeded from the OS CSPRNG); no float
probability is ever compared with a float uniform.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

import numpy as np

from ..errors import InvalidInputError, PrivacyParameterError
from .location import MAX_CELL_WEIGHT, LocationRandomizedResponse, cell_weight
from .rng import require_generator
from ..deprecation import renamed_keywords

__all__ = ["CellRandomizedResponse", "rr_probabilities", "cell_weight", "cell_level_for_epsilon", "max_cells_for",
           "release_for_epsilon", "MAX_CELL_WEIGHT", "GAUSSIAN_ABOVE"]

def _check_epsilon(epsilon) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
        raise PrivacyParameterError(f"epsilon must be a number > 0 (or inf); got {epsilon!r}.")
    e = float(epsilon)
    if math.isnan(e) or e <= 0:
        raise PrivacyParameterError(f"epsilon must be > 0 (or inf); got {epsilon!r}.")
    return e


def _check_cells(n_cells) -> int:
    if isinstance(n_cells, bool) or not isinstance(n_cells, numbers.Integral) or int(n_cells) < 2:
        raise InvalidInputError(f"n_cells (K) must be an integer >= 2; got {n_cells!r}.")
    return int(n_cells)


def rr_probabilities(epsilon, K) -> tuple[float, float]:
    """``(p, q)`` of K-ary randomized response at ``epsilon``: ``p = e^eps / (e^eps + K - 1)``
    (the true cell), ``q = 1 / (e^eps + K - 1)`` (each other cell); ``(1, 0)`` at ``eps = inf``."""
    e, K = _check_epsilon(epsilon), _check_cells(K)
    if math.isinf(e):
        return 1.0, 0.0
    t = math.exp(-e)
    den = 1.0 + (K - 1) * t
    return 1.0 / den, t / den


def _rr_draws(a: int, K: int, eps: Fraction | None, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` iid exact K-ary RR reports of the true cell ``a`` (``eps=None``: infinite, always ``a``):
    the fixed-work sampler of :class:`pm_vector.privacy.location.LocationRandomizedResponse` (the
    same law, module doc)."""
    mech = LocationRandomizedResponse(math.inf if eps is None else float(eps), K)
    return mech._draw(np.full(int(m), int(a), dtype=np.int64), rng)


class CellRandomizedResponse:
    """The cell release of one request (module doc: what it guarantees and why).

    ``epsilon`` (> 0, or ``inf``: no privacy, benchmarks only), ``n_cells`` (K >= 2, the same for
    every class). :meth:`release` returns the ``n_rows`` reports in class order.
    """

    delta = 0.0

    def __init__(self, epsilon, n_cells):
        self.epsilon = _check_epsilon(epsilon)
        self.n_cells = _check_cells(n_cells)
        self.p_, self.q_ = rr_probabilities(self.epsilon, self.n_cells)
        self._eps = None if math.isinf(self.epsilon) else Fraction(self.epsilon)

    def release(self, true_row: int, true_cell: int, n_rows: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """``n_rows`` reports (int64, class order): row ``true_row`` is the RR of ``true_cell``,
        every other row uniform on ``[0, K)``. ``rng``: a :func:`~pm_vector.privacy.secure_generator`
        (``None`` draws a fresh one; tests pass a seeded one)."""
        for name, v, hi in (("n_rows", n_rows, None), ("true_row", true_row, n_rows),
                            ("true_cell", true_cell, self.n_cells)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0 or (hi is not None and v >= hi):
                raise InvalidInputError(f"{name} must be an integer in [0, {hi if hi is not None else 'inf'}); "
                                        f"got {v!r}.")
        if n_rows < 1:
            raise InvalidInputError("n_rows must be >= 1.")
        g = require_generator(rng)
        out = g.integers(0, self.n_cells, size=int(n_rows), dtype=np.int64)
        out[int(true_row)] = _rr_draws(int(true_cell), self.n_cells, self._eps, 1, g)[0]
        return out

    def sample(self, true_cell: int, size: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """``size`` iid reports of the real row alone (tests: the frequencies are p and q)."""
        if isinstance(true_cell, bool) or not isinstance(true_cell, numbers.Integral) or \
                not 0 <= true_cell < self.n_cells:
            raise InvalidInputError(f"true_cell must be an integer in [0, {self.n_cells}).")
        return _rr_draws(int(true_cell), self.n_cells, self._eps, int(size), require_generator(rng))


# --------------------------------------------------------------------------- public rules
#: the public rule's target level: K*(eps) = RULE_SCALE * e^(RULE_RATE * eps) (measured, docs/benchmarks.md
#: "Where the limit binds": the best K on Fashion-MNIST and digits is about 3-4 at eps 1 and 2,
#: 8-12 at eps 4, 32-64 at eps 8 and the finest the collection allows from eps 16)
RULE_SCALE, RULE_RATE = 2.2, 0.4
#: a cell should hold at least k' / MAX_CELLS_FACTOR of its class's items: finer cells than that
#: measured no better (the answer already covers a cell and its neighbourhood)
MAX_CELLS_FACTOR = 10


@renamed_keywords(k_prime="shortlist")  # its old keyword, until 0.3.0
def max_cells_for(n_items: int, n_classes: int, shortlist: int) -> int:
    """The finest useful level for a collection of ``n_items`` in ``n_classes`` classes answered
    with ``k'`` candidates per row: ``MAX_CELLS_FACTOR * n_items / (n_classes * k')`` (public)."""
    for name, v in (("n_items", n_items), ("n_classes", n_classes), ("shortlist", shortlist)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise InvalidInputError(f"{name} must be a positive integer; got {v!r}.")
    return max(2, int(MAX_CELLS_FACTOR * int(n_items) // (int(n_classes) * int(shortlist))))


def cell_level_for_epsilon(epsilon, levels, max_cells: int | None = None) -> int:
    """The public rule for K: among the published ``levels`` (those ``<= max_cells`` when given;
    the smallest level if none is), the one nearest in log to ``K*(eps) = 2.2 e^(0.4 eps)`` (ties
    to the larger). A pure function of eps and public numbers; measured (module constants)."""
    e = _check_epsilon(epsilon)
    lv = sorted({int(k) for k in levels})
    if not lv or lv[0] < 2:
        raise InvalidInputError("levels must be a non-empty sequence of integers >= 2.")
    if max_cells is not None:
        lv = [k for k in lv if k <= int(max_cells)] or lv[:1]
    target = math.log(RULE_SCALE) + RULE_RATE * e if math.isfinite(e) else math.inf
    if math.isinf(target):
        return lv[-1]
    return min(lv, key=lambda k: (abs(math.log(k) - target), -k))


#: from this epsilon on the Gaussian class-rows release measures better than the cell release
GAUSSIAN_ABOVE = 512.0


def release_for_epsilon(epsilon) -> str:
    """The class-rows release for a request at ``epsilon``: ``"cells"`` below ``GAUSSIAN_ABOVE``,
    ``"gaussian"`` from there (and at inf). A pure public function of eps (measured). The default
    release is picked by :func:`pm_vector.protocol.releases.default_release` (the one rule, with
    the same threshold; this is its answer among the class-rows releases, kept for callers)."""
    e = _check_epsilon(epsilon)
    return "gaussian" if e >= GAUSSIAN_ABOVE else "cells"
