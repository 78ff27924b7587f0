"""Server-side resolution of a PrivateMail request: align, then k-NN every query row."""

from __future__ import annotations

import numpy as np
import torch

from .alignment import UmeyamaAlignment
from .client.request import PrivateMailRequest
from .errors import AlignmentError, InvalidInputError

# A client that used the published frame sends anchor rows that the similarity maps onto the
# server's almost exactly; a large residual means a different frame or corrupted rows.
MAX_RELATIVE_RESIDUAL = 0.5


def align_request(request: PrivateMailRequest, anchor_ids, anchor_embedding: np.ndarray) -> np.ndarray:
    """Map the request's query rows into the server's frame (Kabsch-Umeyama on anchor rows)."""
    ids = list(anchor_ids)
    if list(request.anchor_ids) != ids:
        raise InvalidInputError(f"the request's {len(request.anchor_ids)} anchor ids do not match the collection's "
                                f"anchor set ({len(ids)} ids, in order); fetch the current anchor set and rebuild.")
    E = np.asarray(anchor_embedding, dtype=np.float64)
    if request.embedding.shape[1] != E.shape[1]:
        raise InvalidInputError(f"request embedding has dimension {request.embedding.shape[1]}; the active run's "
                                f"is {E.shape[1]}.")
    al = UmeyamaAlignment().fit(request.anchor_rows, E)
    if al.relative_residual_ > MAX_RELATIVE_RESIDUAL:
        raise AlignmentError(f"the request's anchor rows do not match the collection's anchor frame (relative "
                             f"residual {al.relative_residual_:.3f}); rebuild it with the frame parameters of the "
                             "active run.")
    return al.transform(request.query_rows)


def knn(items: np.ndarray, queries: np.ndarray, k: int, batch: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Exact Euclidean k-NN: ``(indices, distances)``, each ``(q, k)``."""
    it = torch.as_tensor(np.asarray(items, dtype=np.float32))
    k = min(int(k), it.shape[0])
    idx, dist = [], []
    for s in range(0, len(queries), batch):
        d = torch.cdist(torch.as_tensor(np.asarray(queries[s:s + batch], dtype=np.float32)), it)
        v, i = torch.topk(d, k, dim=1, largest=False)
        idx.append(i.numpy())
        dist.append(v.numpy())
    return np.concatenate(idx), np.concatenate(dist)


# ----------------------------------------------------------------------------- pm_vector requests

#: neighbours per item in the server's raw k-NN graph
GRAPH_DEGREE = 16
#: prior items per row read by distance (index order); the rest enter through the class hub counts
MAX_PRIOR = 1024


class PosteriorShortlist:
    """The server's answer to a pm_vector request, in memory (the SQL of
    :func:`pm_vector.db.resolution.resolve` computes the same scores in one statement).

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
    ``max_prior`` items).

    Learned: ``neighbors_`` ``(N, graph_degree)``, ``prior_`` (per class: item indices and
    clipped coordinates), ``hubs_`` (per class: hub counts).
    """

    def __init__(self, graph_degree: int = GRAPH_DEGREE, max_prior: int = MAX_PRIOR):
        self.graph_degree = graph_degree
        self.max_prior = max_prior

    def fit(self, frames, X, y) -> "PosteriorShortlist":
        from ._validation import as_labels, as_matrix

        X = as_matrix(X, "items")
        y = as_labels(y, X.shape[0], "item labels")
        g = int(self.graph_degree)
        if g < 1 or int(self.max_prior) < 1:
            raise InvalidInputError("graph_degree and max_prior must be positive integers.")
        g = min(g, X.shape[0] - 1)
        self.neighbors_ = knn(X, X, g + 1)[0][:, 1:] if g > 0 else np.zeros((X.shape[0], 0), np.int64)
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
        np.add.at(s, self.neighbors_[idx[order]].ravel(), np.repeat(w - w_far, self.neighbors_.shape[1]))
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
