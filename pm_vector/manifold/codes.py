"""Compact public codes of items, for a client to re-rank candidates without raw features.

A collection that does not hand out raw features publishes a projection fit on its public
anchor set (the anchor mean and its top ``n_components`` principal directions) and stores
every item's code ``W (x - mean)`` as a ``halfvec``. With a request's answer the server returns
each candidate's code; the client projects its own query with the same public projection and
re-ranks by code distance. The projection is a function of public data; the codes are what the
collection chose to reveal about its items (``n_components`` numbers at half precision instead
of the raw features: 64 x 2 bytes instead of 784 x 4 on Fashion-MNIST).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .._validation import as_matrix
from ..errors import InvalidInputError

FORMAT = "pm_vector.public-projection/1"


class PublicProjection:
    """PCA projection of the public anchor set. Learned: ``mean_`` ``(p,)``, ``components_`` ``(m, p)``."""

    def __init__(self, n_components: int = 64):
        self.n_components = n_components

    def fit(self, X) -> "PublicProjection":
        m = self.n_components
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise InvalidInputError(f"n_components must be a positive integer; got {m!r}.")
        X = as_matrix(X, "anchor features")
        self.mean_ = X.mean(0)
        vt = np.linalg.svd(X - self.mean_, full_matrices=False)[2]
        W = np.zeros((int(m), X.shape[1]))
        W[: min(int(m), vt.shape[0])] = vt[: int(m)]
        s = np.sign(W[np.arange(W.shape[0]), np.argmax(np.abs(W), axis=1)])
        self.components_ = W * np.where(s == 0, 1.0, s)[:, None]
        return self

    def transform(self, X) -> np.ndarray:
        """Codes of the rows of ``X``, rounded to half precision as they are stored."""
        X = as_matrix(X, "features")
        if X.shape[1] != self.mean_.shape[0]:
            raise InvalidInputError(f"features have {X.shape[1]} columns; the projection has {self.mean_.shape[0]}.")
        return ((X - self.mean_) @ self.components_.T).astype(np.float16).astype(np.float64)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "n_components": int(self.n_components), "mean": self.mean_.tolist(),
                "components": self.components_.tolist()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PublicProjection":
        if not isinstance(d, Mapping) or d.get("format") != FORMAT:
            raise InvalidInputError(f"not a public-projection document (format {FORMAT!r} expected).")
        p = cls(int(d["n_components"]))
        p.mean_ = np.asarray(d["mean"], dtype=np.float64).reshape(-1)
        p.components_ = as_matrix(d["components"], "components")
        if p.components_.shape != (p.n_components, p.mean_.shape[0]):
            raise InvalidInputError("the public-projection document is inconsistent (shapes).")
        return p
