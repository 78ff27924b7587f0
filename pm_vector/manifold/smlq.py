"""The supervised manifold learning query (SMLQ) of PrivateMail, as estimators.

The iterate (paper eq. 4) is ``X_t = X_{t-1} + 1/2 Diag(L_X)^{-1} (alpha L_Y - L_X) X_{t-1}``,
the majorisation-minimisation step of ``v(X) = Tr(X^T L_X X) - alpha Tr(X^T L_Y X)``
(Theorem 1: each step does not increase ``v``). The iterate is linear, ``X_T = A^T Q``, so
without a normalisation it shrinks or overflows (NOTES 3); ``normalize=True`` centres the
columns and rescales to unit RMS row norm after each step. Because ``v`` is homogeneous of
degree 2 that rescaling changes ``v`` by a positive factor, so the MM guarantee holds step by
step (``v(step(Z)) <= v(Z)``), not across the rescaling -- :attr:`SMLQ.objective_pairs_` keeps
both values of every step so this can be checked.

Defaults (measured): unit-norm rows are at typical
neighbour distance 0.1-0.4, so the paper's ``sigma = 5-6`` makes every kernel weight ~1 and the
embedding carries no feature information (NOTES 2); ``sigma = 0.3`` does. ``alpha`` is given
relative to the graphs (``alpha_scale="relative"``): the effective weight is
``alpha * median(deg L_X) / median(deg L_Y)``, because the two degrees differ by orders of
magnitude and an absolute alpha is either negligible or makes the low-degree rows explode.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._validation import as_labels, as_matrix
from ..errors import InvalidInputError
from .laplacian import (DTYPE, GraphLaplacian, LabelLaplacian, cross_laplacian, feature_laplacian,
                        label_laplacian, resolve_device, to_tensor)


def public_init(n_rows: int, n_components: int, seed: int) -> np.ndarray:
    """Data-independent Gaussian initialisation from a *public* seed (standard normal entries).

    Q carries no information about any data set, so sharing its seed costs no privacy; the
    client and the server derive the same anchor initialisation from it (NOTES 8)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), 0x504D56])).standard_normal(
        (n_rows, n_components))


def _normalize(Z: torch.Tensor, mode: str = "whiten") -> torch.Tensor:
    """Centre the columns, then ``"scale"``: unit RMS row norm, or ``"whiten"``: orthonormal
    columns scaled to ``Z^T Z / n = I / k`` (subspace iteration). Plain scaling lets every
    column converge to the same dominant eigenvector -- the embedding collapses to one
    direction (seen on Fashion-MNIST: one class carried all the norm)."""
    Z = Z - Z.mean(0, keepdim=True)
    if not bool(torch.isfinite(Z).all()):
        raise FloatingPointError("SMLQ iterate overflowed; lower alpha or raise sigma.")
    if mode == "whiten":
        Qm, R = torch.linalg.qr(Z)
        if bool((R.diagonal().abs() <= 1e-12 * R.diagonal().abs().max()).any()):
            raise FloatingPointError("SMLQ iterate lost rank; lower n_components or raise sigma.")
        return Qm * math.sqrt(Z.shape[0] / Z.shape[1])
    rms = torch.sqrt((Z * Z).sum() / Z.shape[0])
    if rms == 0:
        raise FloatingPointError("SMLQ iterate collapsed to a constant; lower alpha or raise sigma.")
    return Z / rms


STABLE_RATIO = 0.9


def effective_alpha(alpha: float, scale: str, LX, LY) -> float:
    """The weight of ``L_Y`` in eq. 4.

    ``"absolute"``: ``alpha`` itself. ``"relative"``: ``alpha * median(deg L_X) / median(deg L_Y)``.
    ``"stable"``: ``alpha * min_i deg_X(i) / deg_Y(i)``; for ``alpha < 1`` every row's own
    coefficient in the step, ``1/2 + alpha_eff deg_Y(i) / (2 deg_X(i))``, stays below 1, so an
    iteration with fixed neighbours converges instead of diverging on its weakest row.
    """
    if scale == "absolute":
        return float(alpha)
    if scale == "stable":
        dx, dy = LX.degree, LY.degree
        ok = dy > 0
        return float(alpha) * float((dx[ok] / dy[ok]).min()) if bool(ok.any()) else 0.0
    if scale != "relative":
        raise InvalidInputError(f"alpha_scale must be 'relative', 'stable' or 'absolute'; got {scale!r}.")
    dy = float(torch.median(LY.degree))
    return 0.0 if dy == 0 else float(alpha) * float(torch.median(LX.degree)) / dy


def smlq_step(Z_rows: torch.Tensor, LX, LY, alpha: float, Z_all: torch.Tensor | None = None) -> torch.Tensor:
    """One application of eq. 4 to the rows (``Z_all`` holds the full state when some
    columns are fixed nodes)."""
    D = LX.degree
    if torch.any(D <= 0):
        i = int(torch.nonzero(D <= 0)[0])
        raise InvalidInputError(f"row {i} has no neighbour with non-zero kernel weight; raise sigma.")
    return Z_rows + 0.5 * (alpha * LY.apply(Z_rows, Z_all) - LX.apply(Z_rows, Z_all)) / D[:, None]


def smlq_objective(Z: torch.Tensor, LX, LY, alpha: float) -> float:
    """``v(Z) = Tr(Z^T L_X Z) - alpha Tr(Z^T L_Y Z)``."""
    return float((Z * LX.apply(Z)).sum() - alpha * (Z * LY.apply(Z)).sum())


def public_bandwidth(anchor_X: np.ndarray) -> float:
    """Median distance from an anchor to its nearest other anchor.

    Computed from the public anchor set only, so the bandwidth leaks nothing private
    (NOTES 2); on unit-norm digits / Fashion-MNIST it is 0.31 / 0.35, where the embedding
    carries the neighbourhood structure (the paper's 5-6 makes all weights ~1)."""
    A = torch.as_tensor(anchor_X, dtype=DTYPE)
    d = torch.cdist(A, A)
    d.fill_diagonal_(float("inf"))
    return float(torch.median(d.min(1).values))


class _Params:
    def _check_common(self):
        if int(self.n_components) < 1:
            raise InvalidInputError(f"n_components must be >= 1; got {self.n_components}.")
        if int(self.n_iter) < 0:
            raise InvalidInputError(f"n_iter must be >= 0; got {self.n_iter}.")
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise InvalidInputError(f"alpha must be finite and >= 0 (Theorem 1 needs alpha >= 0); got {self.alpha}.")
        for name in ("sigma", "label_sigma"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise InvalidInputError(f"{name} must be positive and finite; got {v}.")


class SMLQ(_Params):
    """Supervised manifold learning query (eq. 4) on one labelled set.

    Parameters are stored as given and validated in :meth:`fit` (scikit-learn style).
    Learned state: ``embedding_`` (n, n_components), ``alpha_`` (effective weight),
    ``objective_pairs_`` (v before and after each step), ``n_iter_``.
    """

    def __init__(self, n_components: int = 8, *, sigma: float = 0.3, label_sigma: float = 1.0,
                 alpha: float = 0.8, alpha_scale: str = "relative", n_iter: int = 10,
                 label_graph: str = "between", label_encoding: str = "onehot", graph: str = "dense",
                 n_neighbors: int = 30, normalize: bool | str = True, random_state: int | None = 0, device=None):
        self.n_components = n_components
        self.sigma = sigma
        self.label_sigma = label_sigma
        self.alpha = alpha
        self.alpha_scale = alpha_scale
        self.n_iter = n_iter
        self.label_graph = label_graph
        self.label_encoding = label_encoding
        self.graph = graph
        self.n_neighbors = n_neighbors
        self.normalize = normalize
        self.random_state = random_state
        self.device = device

    def laplacians(self, X, y):
        X = as_matrix(X)
        y = as_labels(y, X.shape[0])
        LX = feature_laplacian(X, self.sigma, graph=self.graph, n_neighbors=self.n_neighbors, device=self.device)
        LY = label_laplacian(y, self.label_sigma, encoding=self.label_encoding, kind=self.label_graph,
                             device=self.device)
        return LX, LY

    def fit(self, X, y, init=None, *, laplacians=None) -> "SMLQ":
        self._check_common()
        X = as_matrix(X)
        n = X.shape[0]
        if n < 2:
            raise InvalidInputError("SMLQ needs at least 2 rows.")
        LX, LY = laplacians if laplacians is not None else self.laplacians(X, y)
        device = LX.degree.device
        if init is None:
            init = public_init(n, self.n_components, 0 if self.random_state is None else self.random_state)
        init = as_matrix(init, "init")
        if init.shape != (n, self.n_components):
            raise InvalidInputError(f"init must have shape {(n, self.n_components)}; got {init.shape}.")
        alpha = effective_alpha(self.alpha, self.alpha_scale, LX, LY)
        Z = to_tensor(init, device)
        pairs = []
        for _ in range(int(self.n_iter)):
            before = smlq_objective(Z, LX, LY, alpha)
            Z = smlq_step(Z, LX, LY, alpha)
            pairs.append((before, smlq_objective(Z, LX, LY, alpha)))
            if self.normalize:
                Z = _normalize(Z, "scale" if self.normalize == "scale" else "whiten")
        self.alpha_ = alpha
        self.objective_pairs_ = pairs
        self.n_iter_ = int(self.n_iter)
        self.embedding_ = Z.cpu().numpy()
        return self

    def fit_transform(self, X, y, init=None) -> np.ndarray:
        return self.fit(X, y, init).embedding_


class AnchorFrame(_Params):
    """A shared coordinate frame for the server's items and the clients' queries.

    ``fit`` embeds the *public* anchor set with :class:`SMLQ` from a *public* seed
    (``anchor_embedding_``): anyone holding the anchor set and the seed computes the same
    frame, and it depends on no private data. :meth:`extend` embeds further labelled rows
    (server items, new items, a client's query rows) by iterating eq. 4 on those rows with
    the anchor rows held fixed -- the out-of-sample extension. Each new row sees its
    ``n_neighbors`` nearest anchors (and, for small sets, the other new rows), so the server
    cost is linear in the number of items and no ``n x n`` matrix is formed.

    Defaults (measured with ``pm-vector bench privacy``): ``n_iter=5`` as in the paper;
    ``init="labels"`` starts each anchor class around its own public random centre -- with a
    plain random start the frame's class structure was 1 % of its variance on Fashion-MNIST
    (0.3 on digits) and private queries landed in one class; ``n_components=16`` (8 gave
    precision@8 0.86 instead of 0.91 on Fashion-MNIST); ``sigma="auto"`` is the public
    bandwidth :func:`public_bandwidth`.
    """

    def __init__(self, n_components: int = 16, *, sigma: float | str = "auto", label_sigma: float = 1.0,
                 alpha: float = 0.3, n_iter: int = 5, n_extend_iter: int = 10, n_neighbors: int = 10,
                 label_graph: str = "between", label_encoding: str = "onehot", graph: str = "dense",
                 init: str = "labels", seed: int = 0, device=None):
        self.n_components = n_components
        self.sigma = sigma
        self.label_sigma = label_sigma
        self.alpha = alpha
        self.n_iter = n_iter
        self.n_extend_iter = n_extend_iter
        self.n_neighbors = n_neighbors
        self.label_graph = label_graph
        self.label_encoding = label_encoding
        self.graph = graph
        self.init = init
        self.seed = seed
        self.device = device

    def _smlq(self) -> SMLQ:
        return SMLQ(self.n_components, sigma=self.sigma_, label_sigma=self.label_sigma, alpha=self.alpha,
                    n_iter=self.n_iter, label_graph=self.label_graph, label_encoding=self.label_encoding,
                    graph=self.graph, n_neighbors=self.n_neighbors, random_state=self.seed, device=self.device)

    def fit(self, anchor_X, anchor_y) -> "AnchorFrame":
        X = as_matrix(anchor_X, "anchor_X")
        y = as_labels(anchor_y, X.shape[0], "anchor_y")
        if X.shape[0] < int(self.n_components) + 2:
            raise InvalidInputError(f"the anchor set has {X.shape[0]} rows; an anchor frame of dimension "
                                    f"{self.n_components} needs at least {int(self.n_components) + 2}.")
        if len(np.unique(y)) < 2:
            raise InvalidInputError("the anchor set must hold at least two classes.")
        self.sigma_ = public_bandwidth(X) if self.sigma == "auto" else float(self.sigma)
        saved, self.sigma = self.sigma, self.sigma_
        try:
            self._check_common()
        finally:
            self.sigma = saved
        s = self._smlq()
        init = public_init(X.shape[0], int(self.n_components), int(self.seed))
        if self.init == "labels":
            # a label prior: each class starts around its own public random centre; the SMLQ
            # iterations then bend it along the anchors' feature graph (all public data)
            classes, idx = np.unique(y, return_inverse=True)
            centres = public_init(len(classes), int(self.n_components), int(self.seed) + 1)
            init = centres[idx] + 0.3 * init
        elif self.init != "random":
            raise InvalidInputError(f"init must be 'labels' or 'random'; got {self.init!r}.")
        self.anchor_embedding_ = s.fit(X, y, init).embedding_
        self.anchor_features_ = X
        self.anchor_labels_ = y
        self.classes_ = np.unique(y)
        self.alpha_ = s.alpha_
        # The scale of the relative alpha for k-NN extensions is fixed here, from the anchors'
        # own extension graph, so that a row's embedding never depends on its batch.
        G = cross_laplacian(X, X, self.sigma_, n_neighbors=min(int(self.n_neighbors) + 1, X.shape[0]),
                            device=self.device)
        LY = LabelLaplacian.build(y, self.label_sigma, fixed_labels=y, link_rows=False,
                                  encoding=self.label_encoding, kind=self.label_graph, classes=self.classes_,
                                  device=self.device)
        self.extension_alpha_scale_ = effective_alpha(1.0, "relative", G, LY)
        return self

    def _check_fitted(self):
        if not hasattr(self, "anchor_embedding_"):
            raise InvalidInputError("AnchorFrame is not fitted; call fit(anchor_X, anchor_y) first.")

    def extend(self, X, y, *, graph: GraphLaplacian | None = None, init=None, n_iter: int | None = None,
               alpha: float | None = None, alpha_scale: str = "relative", batch_size: int = 50000,
               progress=None) -> np.ndarray:
        """Embed labelled rows into the frame (anchors fixed). Returns ``(n, n_components)``.

        ``graph`` overrides the feature graph (columns ``[rows..., anchors...]``): the client's
        post-processing passes the graph rebuilt from its noisy release. Without it, rows are
        processed in batches against their nearest anchors, with ``progress(done, total)``.
        ``alpha`` overrides the frame's alpha for this call; with a caller's graph,
        ``alpha_scale`` says how it is scaled (see :func:`effective_alpha`).
        """
        self._check_fitted()
        y = np.asarray(y)
        n_iter = self.n_extend_iter if n_iter is None else int(n_iter)
        alpha = self.alpha if alpha is None else float(alpha)
        if graph is not None:  # a caller's graph (one block): alpha relative to that graph
            return self._extend_block(y, graph, init, n_iter, alpha, alpha_scale)
        # float32 rows stay float32 (each batch is converted alone: no float64 copy of all of them)
        X = as_matrix(X, dtype=np.float32 if getattr(X, "dtype", None) == np.float32 else np.float64)
        if X.shape[1] != self.anchor_features_.shape[1]:
            raise InvalidInputError(f"rows have {X.shape[1]} features; the anchor set has "
                                    f"{self.anchor_features_.shape[1]}.")
        y = as_labels(y, X.shape[0])
        out = np.empty((X.shape[0], int(self.n_components)))
        for start in range(0, X.shape[0], batch_size):
            sl = slice(start, start + batch_size)
            G = cross_laplacian(np.asarray(X[sl], dtype=np.float64), self.anchor_features_, self.sigma_, n_neighbors=self.n_neighbors,
                                device=self.device)
            out[sl] = self._extend_block(y[sl], G, None if init is None else init[sl], n_iter,
                                         alpha * self.extension_alpha_scale_, "absolute")
            if progress is not None:
                progress(min(start + batch_size, X.shape[0]), X.shape[0])
        return out

    def _extend_block(self, y, G: GraphLaplacian, init, n_iter: int, alpha: float, scale) -> np.ndarray:
        n = G.n_rows
        y = as_labels(y, n)
        if G.W.shape[1] != n + self.anchor_embedding_.shape[0]:
            raise InvalidInputError("graph columns must be the rows followed by the frame's anchors.")
        unknown = np.setdiff1d(np.unique(y), self.classes_)
        if unknown.size:
            raise InvalidInputError(f"labels {unknown.tolist()} are not in the anchor set's classes "
                                    f"{self.classes_.tolist()}.")
        # rows see each other in the label graph only where they do in the feature graph
        link_rows = G.W.layout == torch.strided and bool((G.W[:, :n] != 0).any())
        LY = LabelLaplacian.build(y, self.label_sigma, fixed_labels=self.anchor_labels_, link_rows=link_rows,
                                  encoding=self.label_encoding, kind=self.label_graph, classes=self.classes_,
                                  device=G.degree.device)
        alpha = effective_alpha(alpha, scale, G, LY)
        # Per-row safeguard: a row's own coefficient in the step is 1/2 + alpha deg_Y/(2 deg_X);
        # capping alpha at STABLE_RATIO deg_X/deg_Y keeps it below 1, so a row with few close
        # anchors converges instead of growing without bound (seen: one Fashion-MNIST class
        # reached norm 8 against 0.2-0.7). The cap depends on the row alone, not on its batch.
        dy = LY.degree
        cap = torch.where(dy > 0, STABLE_RATIO * G.degree / dy.clamp_min(1e-300), torch.full_like(dy, float("inf")))
        alpha_rows = torch.clamp(cap, max=alpha)[:, None]
        E = to_tensor(self.anchor_embedding_, G.degree.device)
        Z = torch.zeros(n, E.shape[1], dtype=DTYPE, device=E.device) if init is None else to_tensor(init, E.device)
        D = G.degree
        if torch.any(D <= 0):
            i = int(torch.nonzero(D <= 0)[0])
            raise InvalidInputError(f"row {i} has no anchor with non-zero kernel weight; raise sigma.")
        for _ in range(n_iter):
            full = torch.cat([Z, E])
            Z = Z + 0.5 * (alpha_rows * LY.apply(Z, full) - G.apply(Z, full)) / D[:, None]
        return Z.cpu().numpy()
