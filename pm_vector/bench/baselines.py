"""Baseline retrieval methods that PrivateMail is compared against.

All methods share one interface, in the style of scikit-learn estimators (parameters are
stored by ``__init__`` untouched, validated in ``fit``; learned state ends in ``_``)::

    method.fit(server_features, server_labels, rng)      # -> method
    idx = method.search(query_features, k, rng)          # (q, k) int64 indices into the server items

Server and query features must have unit-norm rows (as produced by
:mod:`pm_vector.datasets`); the privacy calibrations below rely on it. ``search`` returns
indices sorted by increasing Euclidean distance in the method's space (ties broken by the
lower index).

- :class:`RawKNN`: exact k-NN on the raw features. Not private; the reference.
- :class:`DPRandomProjection`: the query's Johnson-Lindenstrauss projection released with
  Gaussian noise, (epsilon, delta)-DP for the query.
- :class:`DPPCA`: the query's projection on the server's PCA basis released with Gaussian
  noise, (epsilon, delta)-DP for the query.
- :class:`ReferenceClassLDP`: the textbook local-DP release in public class frames (one clipped
  row per class, Gaussian noise split over the two rows a change of query alters); a reference
  for pm_vector's release, with its own interface (it needs the frames and the query's label).

Both DP baselines protect exactly what PrivateMail protects: the client's query vector, at
(epsilon, delta), under *replacement* (two neighbouring inputs are any two unit-norm query
vectors). Each call of ``release``/``search`` releases every query row once; rows are
released independently, so each row is (epsilon, delta)-DP for its own query, and several
queries from the same client compose (account for them with the privacy accountant).
Server items are not protected by either baseline (they are the server's own data, and
k-NN on the server is post-processing of the released query).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np

from .._validation import as_labels, as_matrix, require_unit_rows
from ..errors import InvalidInputError, PrivacyParameterError
from ..neighbors import knn_search
from ..privacy import AnalyticGaussianMechanism
from ..privacy.rng import SecureRandom, require_generator

__all__ = ["DPPCA", "DPRandomProjection", "RawKNN", "ReferenceClassLDP", "RetrievalMethod", "knn_search"]

_BATCH = 1024


# --------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------

def _check_rng(rng, what: str):
    """``rng`` as a generator: ``None`` is the OS CSPRNG (:func:`~pm_vector.privacy.secure_generator`)."""
    if rng is not None and not isinstance(rng, (SecureRandom, np.random.Generator)):
        raise InvalidInputError(f"{what} must be pm_vector.privacy.secure_generator() (or a seeded numpy.random.Generator "
                                f"in tests) or None; got {type(rng).__name__}.")
    return require_generator(rng)


def _check_privacy(epsilon, delta) -> tuple[float, float]:
    try:
        eps = float(epsilon)
        dlt = float(delta)
    except (TypeError, ValueError) as exc:
        raise PrivacyParameterError(f"epsilon and delta must be numbers; got {epsilon!r}, {delta!r}.") from exc
    if not math.isfinite(eps) or eps <= 0:
        raise PrivacyParameterError(f"epsilon must be a finite number > 0; got {epsilon!r}.")
    if not (0.0 < dlt < 1.0):
        raise PrivacyParameterError(f"delta must lie strictly between 0 and 1; got {delta!r}.")
    return eps, dlt


def _check_n_components(m) -> int:
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise InvalidInputError(f"n_components must be a positive integer; got {m!r}.")
    return int(m)


def _unit_queries(x, name: str = "query_features") -> np.ndarray:
    """Validated float64 queries, renormalised exactly to unit norm after the unit-norm check
    (so the sensitivity bound holds up to float rounding, not up to the check's tolerance)."""
    q = as_matrix(x, name)
    require_unit_rows(q, name)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


# --------------------------------------------------------------------------------------
# interface
# --------------------------------------------------------------------------------------

class RetrievalMethod(ABC):
    """Common interface: ``fit(server_features, server_labels, rng)`` then ``search(query_features, k, rng)``."""

    #: short name used in benchmark tables
    name: str = "method"
    #: whether the released query is differentially private
    is_private: bool = False

    batch_size: int = _BATCH

    def fit(self, server_features, server_labels, rng: np.random.Generator | None = None):
        """Validate the parameters and the server data, then learn the method's state. Returns ``self``."""
        x = as_matrix(server_features, "server_features")
        require_unit_rows(x, "server_features")
        y = as_labels(server_labels, x.shape[0], "server_labels")
        self._validate_params()
        self.n_features_in_ = int(x.shape[1])
        self.n_server_ = int(x.shape[0])
        self.server_labels_ = y
        self._fit(x, y, _check_rng(rng, "rng"))
        return self

    def search(self, query_features, k: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """Indices ``(q, k)`` into the server items, nearest first."""
        self._check_fitted()
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= self.n_server_:
            raise InvalidInputError(f"k must be an integer between 1 and the number of server items "
                                    f"({self.n_server_}); got {k!r}.")
        q = self._check_queries(query_features)
        emb = self._embed_queries(q, _check_rng(rng, "rng"))
        return knn_search(emb, self.server_embedding_, int(k), batch_size=self.batch_size,
                          item_sqnorms=self._server_sqnorms_)

    # -- to implement ------------------------------------------------------------------
    def _validate_params(self) -> None:
        """Raise if a constructor parameter is invalid."""
        b = self.batch_size
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise InvalidInputError(f"batch_size must be a positive integer; got {b!r}.")

    @abstractmethod
    def _fit(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> None:
        """Set ``server_embedding_`` and any other learned state."""

    @abstractmethod
    def _embed_queries(self, q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """What the server receives for the (validated, unit-norm) queries."""

    def privacy_statement(self) -> str:
        return "Not private: the server sees the raw query."

    # -- helpers -----------------------------------------------------------------------
    def _set_server_embedding(self, emb: np.ndarray) -> None:
        self.server_embedding_ = np.ascontiguousarray(emb, dtype=np.float64)
        self._server_sqnorms_ = np.einsum("ij,ij->i", self.server_embedding_, self.server_embedding_)

    def _check_fitted(self) -> None:
        if not hasattr(self, "server_embedding_"):
            raise InvalidInputError(f"{type(self).__name__} is not fitted yet; call fit(server_features, "
                                    f"server_labels, rng) first.")

    def _check_queries(self, query_features) -> np.ndarray:
        q = as_matrix(query_features, "query_features")
        if q.shape[1] != self.n_features_in_:
            raise InvalidInputError(f"query_features have {q.shape[1]} features but the server items have "
                                    f"{self.n_features_in_}.")
        return _unit_queries(q)

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.endswith("_") and not k.startswith("_"))
        return f"{type(self).__name__}({params})"


# --------------------------------------------------------------------------------------
# methods
# --------------------------------------------------------------------------------------

class RawKNN(RetrievalMethod):
    """Exact k-NN on the raw unit-norm features (Euclidean = cosine ranking). **Not private**:
    the non-private reference every private method is measured against. ``rng`` is unused."""

    name = "raw-knn"
    is_private = False

    def __init__(self, batch_size: int = _BATCH):
        self.batch_size = batch_size

    def _fit(self, x, y, rng) -> None:
        self._set_server_embedding(x)

    def _embed_queries(self, q, rng) -> np.ndarray:
        return q


class _NoisyLinearQuery(RetrievalMethod):
    """Shared machinery: the query's linear image ``W (x - mu)`` is released through the analytic
    Gaussian mechanism with L2 sensitivity ``2 ||W||_2`` (replacement of a unit-norm query)."""

    is_private = True

    def __init__(self, n_components: int, epsilon: float, delta: float, batch_size: int = _BATCH):
        self.n_components = n_components
        self.epsilon = epsilon
        self.delta = delta
        self.batch_size = batch_size

    def _validate_params(self) -> None:
        super()._validate_params()
        _check_privacy(self.epsilon, self.delta)
        _check_n_components(self.n_components)

    def _calibrate(self, components: np.ndarray, center: np.ndarray) -> None:
        """Set ``components_``, ``center_``, the spectral norm, the sensitivity and the mechanism."""
        eps, dlt = _check_privacy(self.epsilon, self.delta)
        self.components_ = np.ascontiguousarray(components, dtype=np.float64)
        self.center_ = np.asarray(center, dtype=np.float64)
        self.spectral_norm_ = float(np.linalg.norm(self.components_, 2))
        # sup over unit x, x' of ||W(x - x')|| = 2 ||W||_2 (x = -x' = top right singular vector)
        self.sensitivity_ = 2.0 * self.spectral_norm_
        self.mechanism_ = AnalyticGaussianMechanism(eps, dlt, self.sensitivity_)
        self.noise_sigma_ = float(self.mechanism_.sigma)

    def project(self, query_features) -> np.ndarray:
        """The noiseless projection ``(x - center_) @ components_.T`` (never sent; for analysis)."""
        self._check_fitted()
        return (self._check_queries(query_features) - self.center_) @ self.components_.T

    def release(self, query_features, rng: np.random.Generator | None = None) -> np.ndarray:
        """The client side: what the server receives, ``(q, n_components)``, one independent
        (epsilon, delta)-DP release per query row. ``rng`` defaults to a secure generator."""
        self._check_fitted()
        return self._embed_queries(self._check_queries(query_features), _check_rng(rng, "rng"))

    def _embed_queries(self, q, rng) -> np.ndarray:
        clean = (q - self.center_) @ self.components_.T
        noisy = np.asarray(self.mechanism_.release(clean, rng), dtype=np.float64)
        if noisy.shape != clean.shape:
            raise RuntimeError(f"mechanism returned shape {noisy.shape} for input {clean.shape}")
        return noisy

    def _set_projected_server(self, x: np.ndarray) -> None:
        self._set_server_embedding((x - self.center_) @ self.components_.T)


class DPRandomProjection(_NoisyLinearQuery):
    """Johnson-Lindenstrauss projection of the query, released with Gaussian noise.

    ``fit`` draws ``R`` (``n_components x d``, i.i.d. ``N(0, 1/n_components)`` entries) from
    ``rng`` and projects the server items ``R x_i`` without noise. ``search`` releases each
    query as ``R x + N(0, sigma^2 I)`` and returns its k nearest projected server items.

    **Privacy.** Protected: the query vector ``x`` (unit norm). Neighbouring inputs: ``x`` and
    any other unit-norm ``x'`` (replace-one). Guarantee: each released row is
    (epsilon, delta)-differentially private for its query. Calibration:
    ``||R x - R x'|| <= ||R||_2 ||x - x'|| <= 2 ||R||_2`` with ``||R||_2`` the spectral norm of the
    drawn ``R`` (``spectral_norm_``), so the L2 sensitivity is ``sensitivity_ = 2 ||R||_2`` and
    ``noise_sigma_`` is the analytic Gaussian mechanism's sigma (Balle & Wang 2018) for it.
    The projection matrix ``R`` is **public** (it carries no information about the query; it
    must only be drawn independently of the query). The server items and the k-NN search are
    not protected (server data; post-processing).
    """

    name = "dp-random-projection"

    def _fit(self, x, y, rng) -> None:
        m, d = int(self.n_components), x.shape[1]
        r = rng.standard_normal((m, d)) / math.sqrt(m)
        self._calibrate(r, np.zeros(d))
        self._set_projected_server(x)

    def privacy_statement(self) -> str:
        s = (f"Each query's random projection is released with Gaussian noise: ({self.epsilon}, {self.delta})-DP "
             f"for the query vector under replacement by any other unit-norm vector. The projection matrix is public.")
        if hasattr(self, "sensitivity_"):
            s += f" L2 sensitivity 2*||R||_2 = {self.sensitivity_:.4g}, noise std {self.noise_sigma_:.4g}."
        return s


class DPPCA(_NoisyLinearQuery):
    """Projection of the query on the server's PCA basis, released with Gaussian noise.

    Choice made here: the **server** computes the PCA basis (mean ``center_`` and the top
    ``n_components`` principal directions ``components_``, orthonormal rows) from its own items,
    without noise, and publishes it to clients; the client releases
    ``V^T (x - mu) + N(0, sigma^2 I)`` and the server returns the k nearest of its own items
    projected the same way (noise-free).

    **Privacy.** Protected: the query vector ``x`` (unit norm). Neighbouring inputs: ``x`` and
    any other unit-norm ``x'`` (replace-one). Guarantee: each released row is
    (epsilon, delta)-differentially private for its query. Calibration: the basis is fixed before
    the query and independent of it; ``||V^T (x - x')|| <= ||V||_2 ||x - x'|| <= 2`` for
    orthonormal ``V`` (``sensitivity_ = 2 ||V||_2``, computed, = 2 up to rounding; the public
    shift ``mu`` cancels), and ``noise_sigma_`` is the analytic Gaussian mechanism's sigma.
    **Not protected:** the server's items. The published basis is *not* differentially private
    with respect to them: it discloses the mean and principal directions of the server's
    collection to every client. (A DP basis, e.g. Analyze Gauss, would be needed if those
    had to be protected too; it does not change the query's guarantee.)
    """

    name = "dp-pca"

    def _fit(self, x, y, rng) -> None:
        m = int(self.n_components)
        if m > min(x.shape):
            raise InvalidInputError(f"n_components={m} exceeds min(n_server, n_features) = {min(x.shape)}.")
        mu = x.mean(axis=0)
        _, sv, vt = np.linalg.svd(x - mu, full_matrices=False)
        total = float(np.sum(sv ** 2))
        self.explained_variance_ratio_ = (sv[:m] ** 2 / total) if total > 0 else np.zeros(m)
        self._calibrate(vt[:m], mu)
        self._set_projected_server(x)

    def privacy_statement(self) -> str:
        s = (f"Each query's projection on the server's PCA basis is released with Gaussian noise: "
             f"({self.epsilon}, {self.delta})-DP for the query vector under replacement by any other unit-norm "
             f"vector. The PCA basis is computed from the server's items without noise and is published: it is "
             f"not private with respect to the server's data.")
        if hasattr(self, "sensitivity_"):
            s += f" L2 sensitivity {self.sensitivity_:.4g}, noise std {self.noise_sigma_:.4g}."
        return s


class ReferenceClassLDP:
    """Reference local-DP release in public class frames, and the server's ranking of it.

    Frames: a fitted :class:`~pm_vector.manifold.class_frames.ClassFrames` (public anchor): per
    class ``mu_c``, the top ``d`` directions ``U_c`` and the clip radius ``r_c``. A request holds
    one row per class -- the real query in its class, a public dummy in every other -- each
    ``clip_{r_c}(U_c (x - mu_c)) + N(0, sigma_c^2 I)`` with
    ``sigma_c = AnalyticGaussianMechanism(epsilon / 2, delta / 2, 2 r_c).sigma``.

    **Privacy.** Replacing the query ``(x, c)`` by ``(x', c')`` changes at most two rows (``c``
    and ``c'``), each by at most its diameter ``2 r_j``; each row is (epsilon/2, delta/2)-DP
    for its content, so the request is (epsilon, delta)-DP by basic composition (with the dummy
    draws coupled as in :mod:`pm_vector.privacy.class_rows`). pm_vector's own release calibrates
    the two rows jointly (sensitivity ``sqrt(2)`` after scaling), which needs less noise.

    ``fit(frames, server_features, server_labels)`` keeps the server items' clipped coordinates
    in their own class's frame; ``release(x, labels, rng)`` noises the rows (``epsilon=inf``:
    no noise, the benchmark's noise-free endpoint); ``shortlist(z, labels, k)`` ranks the items
    of each row's class by distance to ``z`` (ties by index). Only real rows need to be passed
    to the benchmark: a dummy row's answer does not depend on the query.
    """

    def __init__(self, epsilon: float, delta: float):
        self.epsilon = epsilon
        self.delta = delta

    def fit(self, frames, server_features, server_labels) -> "ReferenceClassLDP":
        x = as_matrix(server_features, "server_features")
        y = as_labels(server_labels, x.shape[0], "server_labels")
        if not hasattr(frames, "radii_"):
            raise InvalidInputError("frames must be a fitted ClassFrames (fit it on the public anchor first).")
        if isinstance(self.epsilon, (int, float, np.floating)) and self.epsilon == math.inf:
            self.sigmas_ = np.zeros(len(frames.classes_))
        else:
            eps, dlt = _check_privacy(self.epsilon, self.delta)
            self.sigmas_ = np.array([AnalyticGaussianMechanism(eps / 2, dlt / 2, 2.0 * float(r)).sigma
                                     for r in frames.radii_])
        self.frames_ = frames
        self.n_server_ = int(x.shape[0])
        self.items_ = {}
        for c in frames.classes_:
            idx = np.flatnonzero(y == c)
            self.items_[int(c)] = (idx, frames.clipped(x[idx], np.full(idx.size, c)))
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "frames_"):
            raise InvalidInputError("ReferenceClassLDP is not fitted yet; call fit(frames, features, labels) first.")

    def sigma_of(self, labels) -> np.ndarray:
        """Noise standard deviation of each row of class ``labels``."""
        self._check_fitted()
        return self.sigmas_[self.frames_.class_index(labels)]

    def release(self, features, labels, rng: np.random.Generator | None = None) -> np.ndarray:
        """Released rows ``(q, d)``: row ``i`` is ``features[i]`` in the frame of ``labels[i]``."""
        self._check_fitted()
        z = self.frames_.clipped(features, labels)
        s = self.sigma_of(labels)
        if np.all(s == 0):
            return z
        return z + _check_rng(rng, "rng").standard_normal(z.shape) * s[:, None]

    def shortlist(self, rows, labels, k: int) -> np.ndarray:
        """``(q, k)`` server item indices: the ``k`` items of each row's class nearest to the row.
        A class with fewer than ``k`` items is padded with other classes' items, lowest index first."""
        self._check_fitted()
        z = np.asarray(rows, dtype=np.float64)
        labels = np.asarray(labels).reshape(-1)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= self.n_server_:
            raise InvalidInputError(f"k must be an integer between 1 and the number of server items "
                                    f"({self.n_server_}); got {k!r}.")
        self.frames_.class_index(labels)
        out = np.empty((z.shape[0], int(k)), dtype=np.int64)
        for i, c in enumerate(labels):
            idx, P = self.items_[int(c)]
            order = np.argsort(((P - z[i]) ** 2).sum(1), kind="stable")[: int(k)]
            row = idx[order]
            if row.size < k:
                row = np.concatenate([row, np.setdiff1d(np.arange(self.n_server_), idx)[: int(k) - row.size]])
            out[i] = row
        return out
