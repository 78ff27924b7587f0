"""The location release: ONE report of the query's public cell over the whole collection, by M-ary
randomized response. Pure epsilon-DP (delta 0) for the whole request, with no label and no dummy rows.

What is released
----------------
Public: the location cells (:class:`~pm_vector.manifold.public_cells.PublicCells` fit on the whole public
anchor as one class: ``M`` k-means centroids per published level). The client's secret is its
query ``x`` (features, and its label if it has one: the release does not use it). Its true cell is
``a = cell_M(x)``, the nearest centroid at level ``M``. The request is one integer ``R`` in
``[0, M)``:

* ``R = a`` with probability ``p``, and each other cell with probability ``q``, where
  ``p = pi + (1 - pi) / M``, ``q = (1 - pi) / M`` and ``pi = t / 2^64`` for the integer
  ``t = floor(2^64 (e^eps - 1) / (e^eps + M - 1))`` computed from a certified lower bound of
  ``e^eps`` (:func:`rr_threshold`).

Guarantee
---------
:class:`LocationRandomizedResponse` is epsilon-DP (pure, delta 0) for the whole request with
respect to replacing the query by **any** other query (features and label). Proof: for two
queries with true cells ``a`` and ``b`` and any output ``r``, ``P(r | a) / P(r | b)`` is ``1``
(``r`` is neither or both), ``p / q`` or ``q / p``. And ``p / q = 1 + M pi / (1 - pi)``, increasing
in ``pi``; at ``pi* = (e^eps - 1) / (e^eps + M - 1)`` it is exactly ``e^eps``. The threshold ``t``
is rounded down from a lower bound of ``pi*``, so ``pi <= pi*`` and ``p / q <= e^eps``; the loss is
below ``eps`` by less than ``M 2^-64 e^eps`` (``exact_loss`` gives it as a rational). The ledger
charges ``(epsilon, 0)``. The server's answer (the ranked candidates of cell ``R``) is a public
function of ``R`` and public numbers, so it is post-processing; nothing else leaves the client.

Sampling (exact, integers only, fixed work)
-------------------------------------------
``R = a`` if ``B`` else ``U``, with ``B = [W < t]`` for one uniform 64-bit word ``W`` (two uniform
32-bit halves) and ``U`` uniform on ``[0, M)``: ``P(R = a) = pi + (1 - pi)/M = p`` and
``P(R = r) = (1 - pi)/M = q`` for ``r != a``, exactly (``t / 2^64`` is the Bernoulli's exact
probability). Both ``W`` and ``U`` are always drawn, in the same order, and the choice is a
branch-free select, so the random words consumed and the work done do not depend on ``a`` nor on
whether ``R`` is ``a``. ``U`` is drawn by rejection on the generator's uniform integers (the number
of rounds is independent of the value accepted, and of ``a``). All randomness comes from a
:func:`~pm_vector.privacy.secure_generator` (the OS CSPRNG); no float probability is compared with
a float uniform. At ``eps = inf`` (benchmarks only, no privacy) ``t = 2^64``: always ``a``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np

from ..errors import InvalidInputError, PrivacyParameterError
from .rng import require_generator

__all__ = ["MAX_CELL_WEIGHT", "cell_weight", "LocationRandomizedResponse", "LocationPlan", "plan", "rr_threshold", "exact_loss", "location_weight",
           "candidates_within", "candidate_bytes", "target_candidates", "target_level", "MAX_LEVEL", "DEFAULT_MAX_BYTES",
           "check_max_bytes"]

#: the largest level (cells) a location release accepts
MAX_LEVEL = 1 << 20
_TWO64 = 1 << 64


def _check_epsilon(epsilon) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
        raise PrivacyParameterError(f"epsilon must be a number > 0 (or inf); got {epsilon!r:.40}.")
    e = float(epsilon)
    if math.isnan(e) or e <= 0:
        raise PrivacyParameterError(f"epsilon must be > 0 (or inf); got {epsilon!r:.40}.")
    return e


def _check_level(M) -> int:
    if isinstance(M, bool) or not isinstance(M, numbers.Integral) or not 2 <= int(M) <= MAX_LEVEL:
        raise InvalidInputError(f"the level M must be an integer in [2, {MAX_LEVEL}]; got {M!r:.40}.")
    return int(M)


def rr_threshold(epsilon, M) -> int:
    """The integer ``t`` in ``[0, 2^64]`` with ``t / 2^64 <= (e^eps - 1) / (e^eps + M - 1)``, the
    largest such multiple of ``2^-64`` up to a relative ``10^-40`` (``e^eps`` from a correctly
    rounded 60-digit :mod:`decimal` exponential, lowered by ``10^-45`` relative before use: a
    certified lower bound). ``2^64`` at ``eps = inf``."""
    e, M = _check_epsilon(epsilon), _check_level(M)
    if math.isinf(e):
        return _TWO64
    with localcontext() as ctx:
        ctx.prec = 60
        lo = Decimal(e).exp() * (1 - Decimal(10) ** -45)  # Decimal(e) is exactly the float's value
        pi = Fraction(lo - 1) / Fraction(lo + (M - 1))
    return int(pi * _TWO64)  # floor (pi >= 0)


def exact_loss(t: int, M: int) -> Fraction:
    """``p / q`` of the sampler with threshold ``t`` at level ``M``, as an exact rational: the
    privacy loss is ``log`` of it (infinite at ``t = 2^64``)."""
    pi = Fraction(int(t), _TWO64)
    if pi >= 1:
        raise InvalidInputError("t = 2^64 (eps = inf) has no finite loss.")
    return 1 + M * pi / (1 - pi)


#: the server's per-cell weight ``e^eps - 1`` is capped here: ranking by ``h_c + w h_{c,K,r}`` with
#: integer hub counts below 2^20 is then the lexicographic order (h_{c,K,r}, h_c), the eps -> inf limit,
#: and every score is an exact float64 (no rounding can differ between Python and SQL)
MAX_CELL_WEIGHT = float(2 ** 20)


def cell_weight(epsilon) -> float:
    """The server's weight of the reported cell: ``min(e^eps - 1, MAX_CELL_WEIGHT)``; an item ``i``
    of class ``c`` scores ``h_c(i) + w * h_{c,K,r}(i)`` (proportional to the RR likelihood
    ``q h_c + (p - q) h_{c,K,r}``). The database is given this float, not eps, so both sides rank
    with the same float64 numbers."""
    e = _check_epsilon(epsilon)
    return MAX_CELL_WEIGHT if e >= math.log(MAX_CELL_WEIGHT + 1.0) else min(math.expm1(e), MAX_CELL_WEIGHT)


def location_weight(epsilon) -> float:
    """The server's weight of the reported cell, ``min(e^eps - 1, 2^20)``: an item ``i`` scores
    ``h(i) + w h_r(i)`` (proportional to the RR posterior's expected hub count, ``q h + (p - q) h_r``);
    the same capped weight as the cell release (:func:`cell_weight`)."""
    return cell_weight(epsilon)


class LocationRandomizedResponse:
    """The location release of one request (module doc: what it guarantees and why).

    ``epsilon`` (> 0, or ``inf``: no privacy, benchmarks only), ``n_cells`` (the level M, >= 2).
    :meth:`release` returns the report. ``threshold_`` is ``t``; ``p_``, ``q_`` the exact
    probabilities as floats."""

    delta = 0.0

    def __init__(self, epsilon, n_cells):
        self.epsilon = _check_epsilon(epsilon)
        self.n_cells = _check_level(n_cells)
        self.threshold_ = rr_threshold(self.epsilon, self.n_cells)
        pi = Fraction(self.threshold_, _TWO64)
        self.p_ = float(pi + (1 - pi) / self.n_cells)
        self.q_ = float((1 - pi) / self.n_cells)

    def _draw(self, a: np.ndarray, g) -> np.ndarray:
        m = a.shape[0]
        words = np.asarray(g.integers(0, 1 << 32, size=2 * m), dtype=np.int64).astype(np.uint64).reshape(m, 2)
        u = np.asarray(g.integers(0, self.n_cells, size=m, dtype=np.int64), dtype=np.int64)
        w = (words[:, 0] << np.uint64(32)) | words[:, 1]
        if self.threshold_ >= _TWO64:
            b = np.ones(m, dtype=bool)
        else:
            b = w < np.uint64(self.threshold_)
        return np.where(b, a, u)  # branch-free: both always drawn

    def release(self, true_cell: int, rng: np.random.Generator | None = None) -> int:
        """The report (int in ``[0, M)``) for the true cell ``true_cell``. ``rng``: a
        :func:`~pm_vector.privacy.secure_generator` (``None`` draws a fresh one; tests pass a seeded one)."""
        a = self._check_cell(true_cell)
        return int(self._draw(np.array([a], dtype=np.int64), require_generator(rng))[0])

    def sample(self, true_cell: int, size: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """``size`` iid reports (tests: the frequencies are p and q)."""
        a = self._check_cell(true_cell)
        return self._draw(np.full(int(size), a, dtype=np.int64), require_generator(rng))

    def _check_cell(self, true_cell) -> int:
        if isinstance(true_cell, bool) or not isinstance(true_cell, numbers.Integral) or \
                not 0 <= int(true_cell) < self.n_cells:
            raise InvalidInputError(f"true_cell must be an integer in [0, {self.n_cells}).")
        return int(true_cell)


# --------------------------------------------------------------------------- the public plan
#: what a request may cost by default, in bytes on the wire, both ways
DEFAULT_MAX_BYTES = 50_000
#: the bytes of a request that do not grow with the candidates: the request body, the answer's
#: envelope and the HTTP headers both ways (measured: about 1,100 with msgpack and an API key)
FIXED_BYTES = 1_500
#: bytes of one candidate's id in an answer (uint32 in msgpack; ids below 2^32)
ID_BYTES = 4
#: bytes of one candidate's id in a JSON answer (up to 10 digits and a comma; ids below 2^32)
JSON_ID_BYTES = 11
#: how an answer travels (pm_vector.client.transport.WIRES)
WIRES = ("msgpack", "json")
#: the most candidates an answer may hold (pm_vector.protocol.location.MAX_CANDIDATES)
MAX_CANDIDATES = 65_536
#: the candidates a wider code must leave,
#: ``S*(eps, N) = S_FLOOR (N / 10^4)^S_SIZE + S_SCALE (N / 10^4)^S_SCALE_SIZE e^(-S_RATE (eps - 4))`` (measured on Fashion-MNIST
#: at 10,000 and 68,000 items, docs/guide/queries.md, "Choosing the release"): at small eps the location is unsure and
#: recall needs many candidates (narrow codes); as eps grows the location is sure and wide codes win,
#: the more so on a small collection (a cell's neighbourhood holds fewer items)
S_FLOOR, S_SIZE, S_SCALE, S_SCALE_SIZE, S_RATE = 250.0, 0.18, 760.0, 0.13, 0.48
#: and at least ``min(S_COVER N e^-eps, R / 2)``, R the candidates the budget holds at the narrowest
#: width: a pure-eps report puts at most e^eps times the prior on any location, so while eps is small
#: recall follows the share of the collection an answer covers (docs/benchmarks.md, "Where the limit binds"); wider
#: codes only once that share is held, and never for fewer than half the candidates the budget allows
#: while it is not (measured: 68,000 items at 350 kB and eps 4, 32-byte codes for 8,840 candidates .57
#: against 240-byte codes for 1,428 .49)
S_COVER = 7.0
#: the level's target, ``M*(eps, N, S) = M_SCALE e^(M_RATE eps + M_CURVE eps^2) (N / (8 S))^M_SIZE``
#: (measured: the best level grows slowly with eps up to 4, then fast, and with the items per candidate)
M_SCALE, M_RATE, M_CURVE, M_SIZE = 2.2, 0.3, 0.025, 0.25
#: the level's cap, ``M <= M_CELLS N / S``: a finer level has cells of fewer than about S / M_CELLS
#: items, whose lists are then filled mostly from the neighbouring cells' hubs (measured, 50 kB:
#: Fashion-MNIST 10,000 items at eps 16, level 1000 .820 against level 256 .838; a 5,000-item
#: 32-d collection noise-free, level 1000 .889 against level 256 .943; at 68,000 items the cap
#: is above the finest level and changes nothing)
M_CELLS = 10.0


@dataclass(frozen=True)
class LocationPlan:
    """What a location request asks for: the level M, the candidates S and the code width (bytes
    per candidate), and the byte budget they were chosen for. A public function of eps, the
    collection's public size and the published levels and widths: nothing about the query."""

    level: int
    candidates: int
    code_bytes: int
    max_bytes: int
    payload_bytes: int = 0
    wire: str = "msgpack"

    def answer_bytes(self) -> int:
        """The most this plan's exchange may cost on the wire (bytes, both ways)."""
        return FIXED_BYTES + self.candidates * candidate_bytes(self.code_bytes, self.payload_bytes, self.wire)


def check_max_bytes(max_bytes) -> int:
    """The byte budget of one request on the wire, both ways (None: :data:`DEFAULT_MAX_BYTES`),
    checked: an integer in ``(FIXED_BYTES, 2^34]``. The one check of it: the plan's, and the
    client's ``max_answer_bytes`` (its default) when the client is made."""
    mb = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    if isinstance(mb, bool) or not isinstance(mb, numbers.Integral) or not FIXED_BYTES < int(mb) <= 1 << 34:
        raise InvalidInputError(f"max_bytes must be an integer in ({FIXED_BYTES}, 2^34]; got {mb!r:.40}.")
    return int(mb)


def candidate_bytes(code_bytes: int, payload_bytes: int = 0, wire: str = "msgpack") -> int:
    """The most one candidate adds to a location answer on the wire: its id, its code prefix and
    its payload (``payload_bytes``: as it may travel on ``wire``,
    :func:`pm_vector.protocol.location.payload_wire_bytes`). msgpack: the id in 4 bytes of a uint32
    array and the code in ``code_bytes`` of one binary blob; JSON: the id as up to 10 digits and a
    comma, the codes as one base64 string (4 characters per 3 bytes, rounded up per candidate)."""
    if wire not in WIRES:
        raise InvalidInputError(f"wire must be one of {list(WIRES)}; got {wire!r:.40}.")
    b, p = int(code_bytes), int(payload_bytes)
    return ID_BYTES + b + p if wire == "msgpack" else JSON_ID_BYTES + -(-4 * b // 3) + p


def candidates_within(max_bytes: int, code_bytes: int, n_items: int, payload_bytes: int = 0,
                      wire: str = "msgpack") -> int:
    """The most candidates of ``code_bytes`` each (and ``payload_bytes`` of payload, as it
    travels) whose exchange on ``wire`` fits ``max_bytes`` (:func:`candidate_bytes`), at most
    ``n_items`` and :data:`MAX_CANDIDATES`; 0 if none fits."""
    per = candidate_bytes(code_bytes, payload_bytes, wire)
    return max(0, min(int(n_items), MAX_CANDIDATES, (int(max_bytes) - FIXED_BYTES) // per))


def target_candidates(epsilon: float, n_items: int, reachable: int | None = None) -> float:
    """``S*(eps, N)``: the candidates a wider code must leave (module constants): the measured need,
    or the coverage term ``min(S_COVER N e^-eps, reachable / 2)`` when larger (``reachable``: the
    most candidates the budget holds at the narrowest width; None: no such cap)."""
    e = _check_epsilon(epsilon)
    n = int(n_items) / 1e4
    need = S_FLOOR * n ** S_SIZE
    if math.isinf(e):
        return need
    need += S_SCALE * n ** S_SCALE_SIZE * math.exp(min(-S_RATE * (e - 4.0), 700.0))
    cover = min(float(n_items), S_COVER * int(n_items) * math.exp(-e))
    return max(need, cover if reachable is None else min(cover, reachable / 2.0))


def target_level(epsilon: float, n_items: int, candidates: int) -> float:
    """``M*(eps, N, S)`` (module constants), at most the cap ``M_CELLS N / S`` (the cap alone at
    ``eps = inf``)."""
    e = _check_epsilon(epsilon)
    cap = M_CELLS * int(n_items) / max(1, int(candidates))
    if math.isinf(e):
        return cap
    return min(cap, M_SCALE * math.exp(min(M_RATE * e + M_CURVE * e * e, 700.0)) *
               (int(n_items) / (8.0 * max(1, int(candidates)))) ** M_SIZE)


def plan(epsilon, *, n_items: int, levels, widths, max_bytes: int | None = None, payload_bytes: int = 0,
         level: int | None = None, candidates: int | None = None, code_bytes: int | None = None,
         wire: str = "msgpack") -> LocationPlan:
    """The public plan of a location request (any of ``level``, ``candidates``, ``code_bytes`` given
    is kept; the rest follow the rule):

    * the code width: the widest published width (``widths``) whose candidates within
      ``max_bytes`` (:func:`candidates_within`) still reach :func:`target_candidates` (else the
      narrowest);
    * the candidates: as many as fit ``max_bytes`` at that width (at most ``n_items``);
    * the level: the published level nearest in log to :func:`target_level` (ties to the finer).

    ``n_items``: the collection's public size; ``max_bytes``: the byte budget of one request on the
    wire, both ways (default :data:`DEFAULT_MAX_BYTES`); ``payload_bytes``: what one candidate's
    payload may cost on the wire (:func:`pm_vector.protocol.location.payload_wire_bytes` of what the
    collection publishes its payloads may take: its bound, or the smaller high-water mark of the
    payloads it stored, ``payload_bytes_max``; 0 when it stores none); ``wire``: ``"msgpack"`` or ``"json"``, how
    the answer travels (:func:`candidate_bytes`). An answer with every payload at its bound then
    costs at most ``max_bytes`` on the wire, both ways."""
    e = _check_epsilon(epsilon)
    for name, v, lo in (("n_items", n_items, 1), ("payload_bytes", payload_bytes, 0)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or int(v) < lo:
            raise InvalidInputError(f"{name} must be an integer >= {lo}; got {v!r:.40}.")
    mb = check_max_bytes(max_bytes)
    widths = sorted({int(w) for w in widths})
    lv = sorted({int(k) for k in levels})
    if not widths or widths[0] < 1:
        raise InvalidInputError("the collection publishes no code widths; run a new embedding job.")
    if not lv or lv[0] < 2:
        raise InvalidInputError("the collection publishes no location levels; run a new embedding job.")
    if code_bytes is not None:
        if code_bytes not in widths:
            raise InvalidInputError(f"code_bytes must be one of the published widths {widths}; got {code_bytes!r:.40}.")
        w = int(code_bytes)
    else:
        need = target_candidates(e, n_items, candidates_within(mb, widths[0], n_items, payload_bytes, wire))
        fit = [x for x in widths if candidates_within(mb, x, n_items, payload_bytes, wire) >= min(need, int(n_items))]
        w = fit[-1] if fit else widths[0]
    if candidates is not None:
        if isinstance(candidates, bool) or not isinstance(candidates, numbers.Integral) or \
                not 1 <= int(candidates) <= MAX_CANDIDATES:
            raise InvalidInputError(f"candidates must be an integer in [1, {MAX_CANDIDATES}]; got {candidates!r:.40}.")
        S = int(candidates)
    else:
        S = candidates_within(mb, w, n_items, payload_bytes, wire)
        if S < 1:
            raise InvalidInputError(f"max_bytes {mb} leaves no room for one candidate of {w} code bytes; raise it "
                                    f"above {FIXED_BYTES + candidate_bytes(w, payload_bytes, wire)}.")
    if level is not None:
        if level not in lv:
            raise InvalidInputError(f"level must be one of the published levels {lv}; got {level!r:.40}.")
        M = int(level)
    else:
        t = target_level(e, n_items, S)
        M = min(lv, key=lambda k: (abs(math.log(k) - math.log(t)), -k))
    return LocationPlan(level=M, candidates=S, code_bytes=w, max_bytes=mb, payload_bytes=int(payload_bytes), wire=wire)
