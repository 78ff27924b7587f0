"""Public cells: per class, k-means centroids of the class's public anchor rows at several levels K.

The cell release (:mod:`pm_vector.privacy.cell_release`) reports which of the K cells of its class the
query lies in. The cells are fit on the **public anchor only** (raw features as stored: unit-norm
rows) with scikit-learn's :class:`~sklearn.cluster.KMeans` and a fixed ``random_state``, so they
are a public, reproducible function of public data and carry nothing about any query or any
private item. A cell of a point ``x`` of class ``c`` at level ``K`` is the index of its nearest
centroid of class ``c`` at that level (squared Euclidean distance, ties to the smallest index).

One level serves a whole request (the proof needs the same K in every class), so the usable levels
``levels_`` are those with ``K <= `` the smallest class's anchor count, and (``finest=True``) that
count itself when a requested level is above it: the finest cells the anchor allows.
"""

from __future__ import annotations

import hashlib
import json
import numbers

import numpy as np

from .._validation import as_labels, as_matrix
from ..errors import InvalidInputError

FORMAT = "pm_vector.public-cells/1"
#: the levels fit by default (K cells per class)
DEFAULT_LEVELS = (2, 4, 8, 16, 32, 64, 128)
#: from this level on the cells are faiss's k-means (scikit-learn's k-means++ seeding is slow at many cells)
FINE_LEVEL = 128
#: the levels of the location cells (the whole anchor as one class; the finest is the anchor itself)
LOCATION_LEVELS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _check_levels(levels) -> tuple[int, ...]:
    try:
        lv = tuple(levels)
    except TypeError:
        raise InvalidInputError(f"levels must be a sequence of integers >= 2; got {levels!r:.80}.") from None
    if not lv or any(isinstance(k, bool) or not isinstance(k, numbers.Integral) or int(k) < 2 for k in lv):
        raise InvalidInputError(f"levels must be a non-empty sequence of integers >= 2; got {levels!r:.80}.")
    return tuple(sorted({int(k) for k in lv}))


def _faiss_kmeans(R: np.ndarray, K: int, seed: int) -> np.ndarray:
    """``K`` centroids of the rows ``R`` by faiss's k-means (25 Lloyd iterations from ``seed``),
    float64; an empty cluster is split by faiss."""
    import faiss

    km = faiss.Kmeans(R.shape[1], int(K), niter=25, seed=int(seed) + 1, verbose=False, min_points_per_centroid=1,
                      max_points_per_centroid=1 << 20)
    km.train(np.ascontiguousarray(R, dtype=np.float32))
    return km.centroids.astype(np.float64)


def nearest_centroid(X: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Index of the nearest row of ``centroids`` for every row of ``X`` (squared L2 in float64,
    ties to the smallest index)."""
    X = np.asarray(X, dtype=np.float64)
    Cn = np.asarray(centroids, dtype=np.float64)
    d2 = (X * X).sum(1)[:, None] - 2.0 * X @ Cn.T + (Cn * Cn).sum(1)[None, :]
    return np.argmin(d2, axis=1).astype(np.int64)


class PublicCells:
    """K-means cells of each class's public anchor rows, at every level of ``levels``.

    Parameters: ``levels`` (the K fit, each >= 2), ``random_state`` (k-means seeding: the cells are
    public, a fixed seed makes them reproducible), ``n_init`` (scikit-learn k-means restarts
    below :data:`FINE_LEVEL`; faiss's k-means from there; a level of as many cells as rows takes the rows), ``finest`` (also
    fit K = the smallest class's anchor count when a requested level exceeds it).

    Learned: ``classes_`` (sorted labels), ``levels_`` (usable K ascending: ``K <=`` the smallest
    class's anchor count), ``centroids_`` (dict ``K -> float64 array (C, K, D)``, class order),
    ``n_features_in_``.
    """

    def __init__(self, levels=DEFAULT_LEVELS, random_state: int = 0, n_init: int = 10, finest: bool = True):
        self.levels = levels
        self.random_state = random_state
        self.n_init = n_init
        self.finest = finest

    def fit(self, X_anchor, y_anchor) -> "PublicCells":
        from sklearn.cluster import KMeans

        X = as_matrix(X_anchor, "anchor features")
        y = as_labels(y_anchor, X.shape[0], "anchor labels")
        levels = _check_levels(self.levels)
        rs = self.random_state
        if isinstance(rs, bool) or not isinstance(rs, numbers.Integral) or rs < 0:
            raise InvalidInputError(f"random_state must be a non-negative int; got {rs!r}.")
        if isinstance(self.n_init, bool) or not isinstance(self.n_init, numbers.Integral) or self.n_init < 1:
            raise InvalidInputError(f"n_init must be a positive int; got {self.n_init!r}.")
        classes = np.unique(y)
        rows = [X[y == c] for c in classes]
        smallest = min(r.shape[0] for r in rows)
        usable = tuple(k for k in levels if k <= smallest)
        if self.finest and smallest >= 2 and levels[-1] > smallest and smallest not in usable:
            usable = usable + (smallest,)
        if not usable:
            raise InvalidInputError(f"the smallest class has {smallest} anchor row(s): no level of {levels} fits "
                                    "(each class needs at least K anchor rows).")
        self.classes_ = classes
        self.levels_ = usable
        self.n_features_in_ = X.shape[1]
        self.centroids_ = {}
        for K in usable:
            cen = np.empty((classes.size, K, X.shape[1]))
            for ci, R in enumerate(rows):
                if K == R.shape[0]:  # as many cells as rows: the rows themselves (the k-means optimum)
                    cen[ci] = R
                    continue
                if K >= FINE_LEVEL:  # faiss's k-means (k-means++ seeding costs K passes over the rows)
                    cen[ci] = _faiss_kmeans(R, K, int(rs))
                    continue
                km = KMeans(n_clusters=K, random_state=int(rs), n_init=int(self.n_init)).fit(R)
                cen[ci] = km.cluster_centers_
            self.centroids_[K] = cen
        return self

    # ------------------------------------------------------------------ use
    def _level(self, K) -> int:
        if isinstance(K, bool) or not isinstance(K, numbers.Integral) or int(K) not in self.centroids_:
            raise InvalidInputError(f"K must be one of the published levels {list(self.levels_)}; got {K!r}.")
        return int(K)

    def class_index(self, labels) -> np.ndarray:
        """Positions of ``labels`` in ``classes_`` (an unknown label is refused)."""
        lab = np.asarray(labels).reshape(-1)
        pos = np.searchsorted(self.classes_, lab)
        pos = np.clip(pos, 0, self.classes_.size - 1)
        if lab.size and not np.all(self.classes_[pos] == lab):
            raise InvalidInputError(f"unknown label(s) {sorted(set(lab[self.classes_[pos] != lab].tolist()))[:5]}; "
                                    f"the cells have classes {self.classes_.tolist()[:20]}.")
        return pos.astype(np.int64)

    def assign(self, X, class_index, K) -> np.ndarray:
        """The cell (int64 in ``[0, K)``) of every row of ``X``: its nearest centroid of class
        ``classes_[class_index]`` at level ``K``. ``class_index``: a scalar or one per row."""
        K = self._level(K)
        X = as_matrix(np.atleast_2d(np.asarray(X, dtype=np.float64)), "features")
        if X.shape[1] != self.n_features_in_:
            raise InvalidInputError(f"features have {X.shape[1]} columns; the cells have {self.n_features_in_}.")
        ci = np.asarray(class_index)
        if ci.dtype.kind not in "iu":
            raise InvalidInputError("class_index must be integer position(s) in classes_.")
        ci = np.broadcast_to(ci.reshape(-1) if ci.ndim else ci, (X.shape[0],)).astype(np.int64)
        if ci.size and (ci.min() < 0 or ci.max() >= self.classes_.size):
            raise InvalidInputError(f"class_index must lie in [0, {self.classes_.size}).")
        out = np.empty(X.shape[0], dtype=np.int64)
        cen = self.centroids_[K]
        for c in np.unique(ci):
            m = ci == c
            out[m] = nearest_centroid(X[m], cen[c])
        return out

    # ------------------------------------------------------------------ publication
    def to_dict(self) -> dict:
        """JSON-able; floats round-trip exactly (Python's float repr)."""
        return {"format": FORMAT, "classes": [int(c) for c in self.classes_], "levels": list(self.levels_),
                "n_features": int(self.n_features_in_), "random_state": int(self.random_state),
                "centroids": {str(K): self.centroids_[K].tolist() for K in self.levels_}}

    @classmethod
    def from_dict(cls, d) -> "PublicCells":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise InvalidInputError(f"not a public-cells document (format {FORMAT!r} expected).")
        unknown = sorted(set(d) - {"format", "classes", "levels", "n_features", "random_state", "centroids"})
        if unknown:
            raise InvalidInputError(f"unknown public-cells field(s) {unknown}.")
        try:
            levels = _check_levels(d["levels"])
            classes = np.asarray([int(c) for c in d["classes"]], dtype=np.int64)
            D = int(d["n_features"])
            cens = {K: np.asarray(d["centroids"][str(K)], dtype=np.float64) for K in levels}
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInputError(f"bad public-cells document ({exc!s:.120}).") from None
        if classes.size < 1 or np.any(np.diff(classes) <= 0):
            raise InvalidInputError("public cells: classes must be sorted and distinct.")
        for K, a in cens.items():
            if a.shape != (classes.size, K, D) or not np.all(np.isfinite(a)):
                raise InvalidInputError(f"public cells: level {K} must be {classes.size} x {K} x {D} finite numbers.")
        obj = cls(levels=levels, random_state=int(d.get("random_state", 0)))
        obj.classes_, obj.levels_, obj.n_features_in_, obj.centroids_ = classes, levels, D, cens
        return obj

    def digest(self) -> str:
        """sha256 (hex) over a canonical layout: a JSON header (classes, levels, features) then each
        level's centroids as little-endian float64 (C, K, D) in ascending K (``-0.0`` as ``0.0``)."""
        h = hashlib.sha256()
        head = {"classes": [int(c) for c in self.classes_], "levels": list(self.levels_),
                "n_features": int(self.n_features_in_)}
        h.update(json.dumps(head, sort_keys=True, separators=(",", ":")).encode())
        for K in self.levels_:
            h.update(np.ascontiguousarray(self.centroids_[K] + 0.0, dtype="<f8").tobytes())
        return h.hexdigest()


def fit_location_cells(X_anchor, levels=LOCATION_LEVELS, random_state: int = 0) -> PublicCells:
    """The location release's cells (:mod:`pm_vector.privacy.location`): :class:`PublicCells` of the
    whole public anchor as ONE class (label 0), at ``levels`` (those up to the anchor's size, and
    the anchor's size itself as the finest). Public data only, a fixed seed: reproducible."""
    X = as_matrix(X_anchor, "anchor features")
    return PublicCells(levels=levels, random_state=random_state, n_init=3).fit(X, np.zeros(X.shape[0], np.int64))
