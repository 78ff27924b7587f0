"""Public partitions: the classes of a collection without labels.

K-means of the **public anchor** into ``n_partitions`` parts (scikit-learn, fixed ``random_state``):
every item and every query gets the partition of its nearest centroid. A partition is a public
function of the features, so a client's partition is a function of its query, exactly as a label
chosen by a classifier is: every release keeps its guarantee (it protects the features and the
class, and the class is now the partition). The partitions then stand for the classes everywhere
(frames, cells, rows of a request).
"""

from __future__ import annotations

import numbers

import numpy as np

from .._validation import as_matrix
from ..errors import InvalidInputError
from .public_cells import nearest_centroid

#: partitions of a collection without labels, unless it sets its own
DEFAULT_PARTITIONS = 10


class PublicPartitions:
    """``n_partitions`` k-means centroids of the public anchor; :meth:`predict` is the nearest.

    Learned: ``centroids_`` ``(n_partitions, D)`` float64, ``classes_`` (``0..n_partitions-1``),
    ``n_features_in_``.
    """

    def __init__(self, n_partitions: int = DEFAULT_PARTITIONS, random_state: int = 0, n_init: int = 3):
        self.n_partitions = n_partitions
        self.random_state = random_state
        self.n_init = n_init

    def fit(self, X_anchor, y=None) -> "PublicPartitions":
        from sklearn.cluster import KMeans

        X = as_matrix(X_anchor, "anchor features")
        n = self.n_partitions
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 2:
            raise InvalidInputError(f"n_partitions must be an integer >= 2; got {n!r}.")
        if n > X.shape[0]:
            raise InvalidInputError(f"{n} partitions need at least {n} anchor rows; the anchor has {X.shape[0]}.")
        rs = self.random_state
        if isinstance(rs, bool) or not isinstance(rs, numbers.Integral) or rs < 0:
            raise InvalidInputError(f"random_state must be a non-negative int; got {rs!r}.")
        km = KMeans(n_clusters=int(n), random_state=int(rs), n_init=int(self.n_init)).fit(X)
        self.centroids_ = np.asarray(km.cluster_centers_, dtype=np.float64)
        self.classes_ = np.arange(int(n), dtype=np.int64)
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X) -> np.ndarray:
        """The partition (int64) of every row: its nearest centroid (ties to the smallest index)."""
        X = as_matrix(np.atleast_2d(np.asarray(X, dtype=np.float64)), "features")
        if X.shape[1] != self.n_features_in_:
            raise InvalidInputError(f"features have {X.shape[1]} columns; the partitions have {self.n_features_in_}.")
        return nearest_centroid(X, self.centroids_)

    def to_dict(self) -> dict:
        return {"format": "pm_vector.public-partitions/1", "centroids": self.centroids_.tolist()}

    @classmethod
    def from_dict(cls, d) -> "PublicPartitions":
        if not isinstance(d, dict) or d.get("format") != "pm_vector.public-partitions/1" or set(d) != {"format",
                                                                                                       "centroids"}:
            raise InvalidInputError("not a public-partitions document.")
        try:
            c = np.asarray(d["centroids"], dtype=np.float64)
        except (TypeError, ValueError):
            raise InvalidInputError("public partitions: centroids must be a list of equal-length lists.") from None
        if c.ndim != 2 or c.shape[0] < 2 or not np.all(np.isfinite(c)):
            raise InvalidInputError("public partitions: at least 2 finite centroids.")
        obj = cls(n_partitions=int(c.shape[0]))
        obj.centroids_, obj.classes_, obj.n_features_in_ = c, np.arange(c.shape[0], dtype=np.int64), c.shape[1]
        return obj
