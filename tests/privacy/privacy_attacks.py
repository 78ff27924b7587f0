"""Attacks on the class-rows release that use only what a server sees, and the bounds they face.

What the server sees (:class:`ServerView` and the request): the released rows, the noise of each
row and the other public fields of the request, the published class frames and the public dummy
pool. An attack here is a function of those and of the candidate queries the adversary chose
*before* the request (in the DP game the adversary names the candidates; the client's secret is
which one it used). The guess functions take no secret: they receive the request as it travels
(``ClassRowsRequest.from_dict(request.to_dict())``), and the harness compares their guess with the
secret only to score it.

Bounds (uniform prior over the hypotheses):

* **which row**, ``C`` hypotheses ``H_i``: "the query is candidate ``i`` (class ``i``)". If every
  pair is (eps, delta)-indistinguishable, any guess succeeds with probability at most
  ``(e^eps + (C-1) delta) / (C - 1 + e^eps)``: with ``A_i`` the outputs where the guess is ``i``,
  ``P_i(A_i) <= e^eps P_j(A_i) + delta`` for each ``j != i``; summing over ``j != i`` and ``i``
  gives ``(C-1) C S <= e^eps C (1 - S) + C (C-1) delta``.
  The release's own bound is tighter. Give the attacker every dummy draw (side information can
  only help): then ``H_i`` moves row ``i`` (alone) off the dummy's value by a vector of norm at
  most ``a`` noise standard deviations, ``a = row_sensitivity / (G s)`` (in grid units a row moves
  by at most ``row_sensitivity`` steps; the noise is ``s G`` steps). The rows are independent,
  so the likelihood ratio of ``H_i`` depends on the projection of row ``i`` on its shift only:
  ``C`` independent N(0, 1) statistics, one of them shifted by at most ``a``. A shift ``b < a`` is
  the shift ``a`` scaled by ``b/a`` plus independent noise, so equal shifts ``a`` are the
  hardest case, where the best guess (the largest statistic) succeeds with probability
  ``P_C(a) = int phi(t - a) Phi(t)^(C-1) dt`` (the classical M-ary orthogonal-signal formula).
* **two queries** ``x0, x1``: any guess succeeds with probability at most ``(1 + TV) / 2``;
  under (eps, delta) that is ``(e^eps + delta) / (1 + e^eps)``; for the release (coupled
  dummies, joint convexity of TV = the hockey-stick at eps 0) the Gaussian's
  ``Phi(mu / 2)``, ``mu = sqrt(rows changed) a`` (two rows when the classes differ, one otherwise).

Both Gaussian bounds are exact for a continuous Gaussian; the release's discrete Gaussian at
``>= 2,000`` grid steps per standard deviation differs from the rounded continuous one by a total
variation of order ``C d / sigma_grid^2 < 1e-5`` per request, far below the sampling error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import integrate, special, stats

from pm_vector._validation import normalize_rows
from pm_vector.client.query import PrivateKNN, ClassRowsRequest
from pm_vector.manifold.class_frames import ClassFrames
from pm_vector.privacy.class_rows import row_sensitivity


# --------------------------------------------------------------------------- bounds
def which_row_dp_bound(epsilon: float, delta: float, n_classes: int) -> float:
    """Best success of any guess of the real row among ``C`` under pairwise (eps, delta)-DP."""
    return (math.exp(epsilon) + (n_classes - 1) * delta) / (n_classes - 1 + math.exp(epsilon))


def which_row_gaussian_bound(shift: float, n_classes: int) -> float:
    """``P_C(a)``: best success of any guess of which of ``C`` independent N(0, 1) statistics is
    shifted by ``a`` (the release's bound, module doc)."""
    f = lambda t: stats.norm.pdf(t - shift) * stats.norm.cdf(t) ** (n_classes - 1)  # noqa: E731
    return float(integrate.quad(f, -12.0, 12.0 + shift, epsabs=1e-13, limit=200)[0])


def distinguish_dp_bound(epsilon: float, delta: float) -> float:
    """Best success of any guess between two queries under (eps, delta)-DP."""
    return (math.exp(epsilon) + delta) / (1.0 + math.exp(epsilon))


def distinguish_gaussian_bound(shift: float, rows_changed: int) -> float:
    """``Phi(mu / 2)``, ``mu = sqrt(rows_changed) * shift``: the Gaussian's best two-query guess."""
    return float(special.ndtr(math.sqrt(rows_changed) * shift / 2.0))


def release_shift(client: PrivateKNN) -> float:
    """``a``: the largest move of one row, in noise standard deviations of the release
    (grid units: ``row_sensitivity(d, G)`` steps against ``sigma / gamma`` steps)."""
    m = client.mechanism
    sigma_steps = float(np.min(m.sigmas_ / m.grid_))
    return row_sensitivity(m.dim, m.grid_steps) / sigma_steps


# --------------------------------------------------------------------------- the server's knowledge
@dataclass
class ServerView:
    """Public data: the frames and the dummy pool's frame coordinates per class (row order)."""

    frames: ClassFrames
    pool: list

    @classmethod
    def from_public(cls, frames: ClassFrames, dummy_features, dummy_labels) -> "ServerView":
        D = np.asarray(dummy_features, dtype=np.float64)
        yd = np.asarray(dummy_labels)
        return cls(frames, [frames.clipped(D[yd == c], np.full(int((yd == c).sum()), c)) for c in frames.classes_])

    def coords(self, x, j: int) -> np.ndarray:
        """Frame coordinates of a raw query in row ``j`` (the client's own path: unit norm, clip)."""
        x = normalize_rows(np.asarray(x, dtype=np.float64).reshape(1, -1))
        return self.frames.clipped(x, [self.frames.classes_[j]])[0]


def _log_gauss(y, z, sigma):
    return -((np.asarray(y) - z) ** 2).sum(-1) / (2.0 * sigma ** 2)


def _log_dummy(view: ServerView, y, j: int, sigma: float) -> float:
    """log-likelihood of row ``j`` under "a uniform dummy of the pool" (same constant as _log_gauss)."""
    d = _log_gauss(view.pool[j], y, sigma)
    return float(special.logsumexp(d) - math.log(d.shape[0]))


def far_candidate(view: ServerView, j: int, *, away_from=None) -> np.ndarray:
    """A raw unit-norm query of class ``j`` whose frame coordinates lie far from ``away_from``
    (default: the class's dummy pool), found among a few public directions: a function of public
    data only."""
    fr = view.frames
    mu, U, r = fr.means_[j], fr.components_[j], fr.radii_[j]
    ref = view.pool[j] if away_from is None else np.atleast_2d(away_from)
    best, best_score = None, -1.0
    dirs = [-ref.mean(0)] + [s * e for e in np.eye(U.shape[0]) for s in (1.0, -1.0)]
    for v in dirs:
        v = v / max(np.linalg.norm(v), 1e-12)
        for lam in (0.25, 0.5, 1.0, 2.0, 4.0, 16.0):
            x = mu + lam * r * (v @ U)
            z = view.coords(x, j)
            score = float(np.linalg.norm(ref - z, axis=1).mean())
            if score > best_score:
                best, best_score = normalize_rows(x.reshape(1, -1))[0], score
    return best


# --------------------------------------------------------------------------- the attacks (no secret)
def guess_real_row(view: ServerView, request: ClassRowsRequest, hypotheses) -> int:
    """The Bayes guess of the real row: ``hypotheses[j]`` are the frame coordinates the adversary's
    class-``j`` candidate would have in row ``j``; row ``j`` is scored by log N(row; hypothesis) -
    log(mixture over the public pool), and the largest score wins."""
    sig = np.asarray(request.sigmas)
    scores = [float(_log_gauss(request.rows[j], hypotheses[j], sig[j])) - _log_dummy(view, request.rows[j], j, sig[j])
              for j in range(request.n_rows)]
    return int(np.argmax(scores))


def guess_which_query(view: ServerView, request: ClassRowsRequest, h0, h1) -> int:
    """The Bayes guess between two candidates ``h = (row, frame coordinates in that row)``: the
    log-likelihood ratio of the rows they touch (the other rows have the same law in both)."""
    (j0, z0), (j1, z1) = h0, h1
    sig = np.asarray(request.sigmas)
    y = request.rows
    if j0 == j1:
        llr = float(_log_gauss(y[j0], z0, sig[j0]) - _log_gauss(y[j0], z1, sig[j0]))
    else:
        llr = (float(_log_gauss(y[j0], z0, sig[j0])) - _log_dummy(view, y[j0], j0, sig[j0])
               + _log_dummy(view, y[j1], j1, sig[j1]) - float(_log_gauss(y[j1], z1, sig[j1])))
    return 0 if llr > 0 else 1


def _wire(req: ClassRowsRequest) -> ClassRowsRequest:
    """The request as the server receives it."""
    return ClassRowsRequest.from_dict(req.to_dict())


def _client(frames, Xd, yd, eps, rng, noise_factor):
    """A seeded client and the nominal release's ``a``; ``noise_factor`` then scales its noise (a
    deliberately changed calibration, for the blindness and power checks)."""
    client = PrivateKNN(frames, Xd, yd, eps)._inject_generator(rng)
    shift = release_shift(client)
    if noise_factor != 1.0:
        client.mechanism.sigmas_ = client.mechanism.sigmas_ * noise_factor
    return client, shift


def which_row_rate(frames, Xd, yd, eps: float, n: int, rng, *, noise_factor: float = 1.0):
    """Share of ``n`` requests whose real row :func:`guess_real_row` names, the class drawn
    uniformly and the query being the adversary's candidate of that class; with the release's
    ``a`` (:func:`release_shift`, at the nominal calibration)."""
    view = ServerView.from_public(frames, Xd, yd)
    client, shift = _client(frames, Xd, yd, eps, rng, noise_factor)
    C = len(frames.classes_)
    cands = [far_candidate(view, j) for j in range(C)]
    hyps = [view.coords(cands[j], j) for j in range(C)]
    wins = 0
    for _ in range(n):
        c = int(rng.integers(C))
        req, secret = client.request(cands[c], int(frames.classes_[c]))
        wins += int(guess_real_row(view, _wire(req), hyps) == secret.real_row)
    return wins / n, shift


def distinguish_rate(frames, Xd, yd, eps: float, n: int, rng, *, same_class: bool, noise_factor: float = 1.0):
    """Share of ``n`` requests for which :func:`guess_which_query` names the candidate used (drawn
    with probability 1/2). Each trial draws a fresh pair of classes (equal if ``same_class``);
    same class: two candidates far apart on the class's clip sphere; different classes: each far
    from its class's dummy pool."""
    view = ServerView.from_public(frames, Xd, yd)
    client, shift = _client(frames, Xd, yd, eps, rng, noise_factor)
    C = len(frames.classes_)
    far = [far_candidate(view, j) for j in range(C)]
    opposite = [far_candidate(view, j, away_from=view.coords(far[j], j)) for j in range(C)]
    wins = 0
    for _ in range(n):
        j0 = int(rng.integers(C))
        if same_class:
            pair = [(j0, far[j0]), (j0, opposite[j0])]
        else:
            j1 = int((j0 + 1 + rng.integers(C - 1)) % C)
            pair = [(j0, far[j0]), (j1, far[j1])]
        b = int(rng.integers(2))
        j, x = pair[b]
        req, _ = client.request(x, int(frames.classes_[j]))
        h = [(jj, view.coords(xx, jj)) for jj, xx in pair]
        wins += int(guess_which_query(view, _wire(req), h[0], h[1]) == b)
    return wins / n, shift
