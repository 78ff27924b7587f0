"""The server's shortlist for a pm_vector request (one noised row per class).

:class:`PosteriorShortlist` is the ranking: fit on the server's items (what the embedding job
stores per run), it scores every item for a released row. :func:`noise_free_shortlist` is the
benchmark-only endpoint without noise. The SQL that answers requests in the database,
``pm_vector.pm_shortlist``, computes exactly these scores (a test compares them).
"""

from __future__ import annotations

import numpy as np

from .errors import InvalidInputError
from .neighbors import neighbor_graph

#: neighbours per item in the server's raw k-NN graph
GRAPH_DEGREE = 16
#: prior items per row read by distance (index order); the rest enter through the class hub counts.
#: 512: the statement aggregates C x max_prior x graph_degree contributions, half as many as at 1024,
#: for nn_recall@8 0.328 / 0.333 / 0.361 / 0.574 at eps 1 / 4 / 16 / 64 on Fashion-MNIST against
#: 0.329 / 0.343 / 0.361 / 0.572 (README "latency")
MAX_PRIOR = 512
#: a retained prior item whose weight exceeds the far weight by less than this adds nothing of its
#: own (it counts as far, through the hub counts): the statement then aggregates only the items
#: that move a score by at least this much (see PosteriorShortlist and README "latency")
MIN_WEIGHT = 0.0


class PosteriorShortlist:
    """The server's answer to a pm_vector request: fitted on the items (the embedding job stores
    ``neighbors_``, the prior and ``hubs_`` in the run's tables) and scored in memory here, in
    SQL by ``pm_vector.pm_shortlist`` (``sql/0005_class_rows.sql``: the same scores, one
    statement per request).

    A released row ``z_c`` of class ``c`` with noise ``sigma_c`` says where the query probably
    lies in class ``c``'s frame. The server's items of class ``c`` are the prior: item ``j``
    gets the weight ``w_j = exp(-(||z_c - p_j||^2 - min) / (2 sigma_c^2))`` (``p_j`` its clipped
    frame coordinates), and every item ``i`` the score ``sum_j w_j [i in N(j)]``, ``N(j)`` the
    ``graph_degree`` nearest items of ``j`` by raw features (of any class). The ``k'`` best
    scored items are the row's shortlist. When the noise is large the weights are flat and the
    shortlist holds the class's hubs (what the label alone gives); as epsilon grows it narrows
    to the query's neighbourhood. Only the ``max_prior`` nearest prior items are weighted
    individually; the others share the weight of the farthest of those, through the precomputed
    per-class hub counts ``h_c(i) = sum_{j in c} [i in N(j)]`` (exact when a class has at most
    ``max_prior`` items). A retained item whose excess ``w_j - w_far`` is below ``min_weight``
    is treated as far too (its neighbours get only the hub term): each such item moves a score by
    less than ``min_weight``, and the SQL statement then unnests only the neighbour lists of the
    items that matter -- at small epsilon (flat weights) almost none, at large epsilon a few dozen.

    Learned: ``neighbors_`` ``(N, graph_degree)``, ``prior_`` (per class: item indices and
    clipped coordinates), ``hubs_`` (per class: hub counts).
    """

    def __init__(self, graph_degree: int = GRAPH_DEGREE, max_prior: int = MAX_PRIOR, min_weight: float = MIN_WEIGHT):
        self.graph_degree = graph_degree
        self.max_prior = max_prior
        self.min_weight = min_weight

    def fit(self, frames, X, y) -> "PosteriorShortlist":
        from ._validation import as_labels, as_matrix

        X = as_matrix(X, "items")
        y = as_labels(y, X.shape[0], "item labels")
        g = int(self.graph_degree)
        if g < 1 or int(self.max_prior) < 1:
            raise InvalidInputError("graph_degree and max_prior must be positive integers.")
        mw = self.min_weight
        if isinstance(mw, bool) or not isinstance(mw, (int, float, np.floating)) or not 0 <= float(mw) < 1:
            raise InvalidInputError(f"min_weight must be a number in [0, 1), got {mw!r}.")
        self.neighbors_ = neighbor_graph(X, g)
        self.n_items_ = X.shape[0]
        self.frames_ = frames
        self.prior_, self.hubs_ = {}, {}
        for c in frames.classes_:
            idx = np.flatnonzero(y == c)
            self.prior_[int(c)] = (idx, frames.clipped(X[idx], np.full(idx.size, c)) if idx.size else
                                   np.zeros((0, frames.components_.shape[1])))
            self.hubs_[int(c)] = np.bincount(self.neighbors_[idx].ravel(), minlength=X.shape[0]).astype(np.float64)
        return self

    def scores(self, z, sigma: float, label: int) -> np.ndarray:
        """Score of every item for one released row ``z`` of class ``label`` with noise ``sigma``."""
        idx, P = self.prior_[int(label)]
        s = np.zeros(self.n_items_)
        if idx.size == 0:
            return s
        d2 = ((P - np.asarray(z, dtype=np.float64)) ** 2).sum(1)
        order = np.argsort(d2, kind="stable")[: int(self.max_prior)]
        d2n = d2[order]
        w = np.exp(-(d2n - d2n[0]) / (2.0 * float(sigma) ** 2))
        w_far = w[-1] if order.size < idx.size else 0.0
        dw = w - w_far
        keep = dw >= float(self.min_weight)
        np.add.at(s, self.neighbors_[idx[order[keep]]].ravel(), np.repeat(dw[keep], self.neighbors_.shape[1]))
        if w_far > 0:
            s += w_far * self.hubs_[int(label)]
        return s

    def shortlist(self, request, k_prime: int | None = None) -> list[np.ndarray]:
        """For every row of a :class:`~pm_vector.client.query.QueryRequest`, the ``k'`` item
        indices with the highest scores (ties by index)."""
        kp = int(k_prime or request.shortlist)
        out = []
        for z, sigma, c in zip(request.rows, request.sigmas, request.classes):
            s = self.scores(z, sigma, c)
            order = np.lexsort((np.arange(s.size), -s))
            out.append(order[:kp])
        return out


def noise_free_shortlist(frames, X, query_coords, labels, k_prime: int) -> np.ndarray:
    """Benchmark only: the ``k'`` items of *any* class nearest to each query's clipped frame
    coordinates, ranked in its class's frame without noise (the endpoint the private answers
    approach as epsilon grows). Never part of a request."""
    out = np.empty((len(labels), int(k_prime)), dtype=np.int64)
    coords = {}
    for i, (z, c) in enumerate(zip(np.asarray(query_coords), labels)):
        if int(c) not in coords:
            coords[int(c)] = frames.transform(X, np.full(X.shape[0], c))
        d2 = ((coords[int(c)] - z) ** 2).sum(1)
        out[i] = np.argsort(d2, kind="stable")[: int(k_prime)]
    return out
