"""Per-class local coordinates computed from the public anchor set only.

For every class ``c`` of the public anchor set, :class:`ClassFrames` keeps

- ``means_[c]``: the mean ``mu_c`` of the anchor rows of ``c``;
- ``components_[c]``: the top ``n_components`` principal directions ``U_c`` (rows) of those
  anchor rows;
- ``radii_[c]``: the public clip radius ``r_c``, the ``clip_quantile`` quantile of
  ``||U_c (a - mu_c)||`` over the anchor rows ``a`` of ``c``.

A point ``x`` has coordinates ``U_c (x - mu_c)`` in class ``c``'s frame; ``clip`` maps them into
the ball of radius ``r_c``. Everything here is a function of public data, so publishing it (or
any client rebuilding it from the published anchor) costs no privacy. The frames are what the
private release (:mod:`pm_vector.privacy.class_rows`) noises and what the server ranks in.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .._validation import as_labels, as_matrix
from ..errors import InvalidInputError

FORMAT = "pm_vector.class-frames/1"


class ClassFrames:
    """Class-local PCA coordinates with public clip radii (fit on the public anchor set).

    Parameters: ``n_components`` (d, the dimension of every frame), ``clip_quantile`` (the
    quantile of the anchor rows' coordinate norms that becomes ``r_c``). Learned: ``classes_``,
    ``means_`` ``(C, p)``, ``components_`` ``(C, d, p)``, ``radii_`` ``(C,)``.
    """

    def __init__(self, n_components: int = 4, clip_quantile: float = 0.9):
        self.n_components = n_components
        self.clip_quantile = clip_quantile

    def _validate(self) -> None:
        d = self.n_components
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise InvalidInputError(f"n_components must be a positive integer; got {d!r}.")
        q = self.clip_quantile
        if not isinstance(q, (int, float, np.floating)) or not 0 < float(q) <= 1:
            raise InvalidInputError(f"clip_quantile must be in (0, 1]; got {q!r}.")

    def fit(self, X, y) -> "ClassFrames":
        """Fit one frame per class on the public anchor rows ``X`` with labels ``y``."""
        self._validate()
        X = as_matrix(X, "anchor features")
        y = as_labels(y, X.shape[0], "anchor labels")
        d = int(self.n_components)
        classes = np.unique(y)
        means, comps, radii = [], [], []
        for c in classes:
            A = X[y == c]
            if A.shape[0] < 2:
                raise InvalidInputError(f"class {int(c)} has {A.shape[0]} anchor row(s); a class frame needs at least "
                                        "2 (publish more anchor rows of that class).")
            mu = A.mean(0)
            _, _, vt = np.linalg.svd(A - mu, full_matrices=False)
            U = np.zeros((d, X.shape[1]))
            m = min(d, vt.shape[0])
            U[:m] = vt[:m]
            # a canonical sign per direction, so that a rebuild elsewhere gives the same frame
            s = np.sign(U[np.arange(d), np.argmax(np.abs(U), axis=1)])
            U *= np.where(s == 0, 1.0, s)[:, None]
            r = float(np.quantile(np.linalg.norm((A - mu) @ U.T, axis=1), float(self.clip_quantile)))
            if not r > 0:
                raise InvalidInputError(f"class {int(c)}'s anchor rows are all identical in its frame (clip radius 0); "
                                        "publish varied anchor rows.")
            means.append(mu)
            comps.append(U)
            radii.append(r)
        self.classes_ = classes.astype(np.int64)
        self.means_ = np.stack(means)
        self.components_ = np.stack(comps)
        self.radii_ = np.asarray(radii, dtype=np.float64)
        self.n_features_in_ = int(X.shape[1])
        return self

    # ------------------------------------------------------------------ coordinates
    def class_index(self, labels) -> np.ndarray:
        """Positions of ``labels`` in ``classes_``; unknown labels are refused."""
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        pos = np.searchsorted(self.classes_, labels)
        pos = np.minimum(pos, len(self.classes_) - 1)
        bad = self.classes_[pos] != labels
        if np.any(bad):
            raise InvalidInputError(f"label {int(labels[np.flatnonzero(bad)[0]])} is not a class of the public anchor "
                                    f"({self.classes_.tolist()}).")
        return pos

    def transform(self, X, frame_labels) -> np.ndarray:
        """Coordinates ``U_c (x - mu_c)`` of each row of ``X`` in the frame of its ``frame_labels`` entry."""
        X = as_matrix(X, "features")
        if X.shape[1] != self.n_features_in_:
            raise InvalidInputError(f"features have {X.shape[1]} columns; the frames were fit on {self.n_features_in_}.")
        ci = self.class_index(frame_labels)
        if ci.shape[0] != X.shape[0]:
            raise InvalidInputError(f"{X.shape[0]} rows but {ci.shape[0]} frame labels.")
        out = np.empty((X.shape[0], self.components_.shape[1]))
        for j in np.unique(ci):
            m = ci == j
            out[m] = (X[m] - self.means_[j]) @ self.components_[j].T
        return out

    def clip(self, Z, frame_labels) -> np.ndarray:
        """Scale each row of ``Z`` into the ball of radius ``r_c`` of its frame (unchanged inside)."""
        Z = np.asarray(Z, dtype=np.float64)
        r = self.radii_[self.class_index(frame_labels)]
        n = np.linalg.norm(Z, axis=1)
        f = np.where(n > r, r / np.maximum(n, np.finfo(float).tiny), 1.0)
        return Z * f[:, None]

    def clipped(self, X, frame_labels) -> np.ndarray:
        return self.clip(self.transform(X, frame_labels), frame_labels)

    # ------------------------------------------------------------------ publication
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "n_components": int(self.n_components), "clip_quantile": float(self.clip_quantile),
                "classes": self.classes_.tolist(), "means": self.means_.tolist(),
                "components": self.components_.tolist(), "radii": self.radii_.tolist()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ClassFrames":
        if not isinstance(d, Mapping) or d.get("format") != FORMAT:
            raise InvalidInputError(f"not a class-frames document (format {FORMAT!r} expected).")
        f = cls(int(d["n_components"]), float(d["clip_quantile"]))
        f.classes_ = np.asarray(d["classes"], dtype=np.int64)
        f.means_ = as_matrix(d["means"], "means")
        f.components_ = np.asarray(d["components"], dtype=np.float64)
        f.radii_ = np.asarray(d["radii"], dtype=np.float64)
        C = len(f.classes_)
        if f.components_.shape[:2] != (C, f.n_components) or f.means_.shape[0] != C or f.radii_.shape != (C,) or \
                not np.all(np.isfinite(f.components_)) or not np.all(f.radii_ > 0):
            raise InvalidInputError("the class-frames document is inconsistent (shapes or radii).")
        f.n_features_in_ = int(f.means_.shape[1])
        return f
