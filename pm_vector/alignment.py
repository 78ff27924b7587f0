"""Kabsch-Umeyama similarity alignment of point sets.

Umeyama (1991): the least-squares similarity ``dst ~ c R src + t`` with ``R`` a rotation
(``det R = +1``; the reflection fix flips the last singular direction when the SVD would give
``det = -1``), ``c > 0`` a scale and ``t`` a translation.
"""

from __future__ import annotations

import numpy as np

from ._validation import as_matrix
from typing import TYPE_CHECKING

from .errors import AlignmentError, InvalidInputError

if TYPE_CHECKING:
    from .protocol.paper import PrivateMailRequest


class UmeyamaAlignment:
    """Estimator: ``fit(src, dst)`` learns ``scale_``, ``rotation_``, ``translation_``;
    ``transform(X)`` maps points of the source frame into the destination frame.

    ``with_scale=False`` gives the rigid (Kabsch) transform. Degenerate anchors (fewer rows
    than dimensions + 1, or a source set of (near) rank < k after centring) raise
    :class:`AlignmentError`: the transform would not be unique.
    """

    def __init__(self, with_scale: bool = True, rank_tol: float = 1e-10):
        self.with_scale = with_scale
        self.rank_tol = rank_tol

    def fit(self, src, dst) -> "UmeyamaAlignment":
        src = as_matrix(src, "src")
        dst = as_matrix(dst, "dst")
        if src.shape != dst.shape:
            raise AlignmentError(f"anchor sets differ in shape: {src.shape} vs {dst.shape}; the rows must be the "
                                 "same anchors in the same order.")
        n, k = src.shape
        if n < k + 1:
            raise AlignmentError(f"{n} anchor rows cannot determine a similarity in {k} dimensions; need >= {k + 1}.")
        mu_s, mu_d = src.mean(0), dst.mean(0)
        s0, d0 = src - mu_s, dst - mu_d
        var_s = float((s0 * s0).sum() / n)
        sv_src = np.linalg.svd(s0, compute_uv=False)
        if var_s == 0 or sv_src[-1] <= self.rank_tol * max(sv_src[0], 1e-300):
            raise AlignmentError("source anchors are degenerate (collinear/coincident after centring); "
                                 "the alignment is not unique.")
        H = d0.T @ s0 / n
        U, S, Vt = np.linalg.svd(H)
        d = np.ones(k)
        if np.linalg.det(U) * np.linalg.det(Vt) < 0:
            d[-1] = -1.0  # reflection fix: the best proper rotation
        R = (U * d) @ Vt
        c = float((S * d).sum() / var_s) if self.with_scale else 1.0
        self.rotation_ = R
        self.scale_ = c
        self.translation_ = mu_d - c * R @ mu_s
        aligned = self.transform(src)
        self.residual_rms_ = float(np.sqrt(((aligned - dst) ** 2).sum(1).mean()))
        self.relative_residual_ = float(np.sqrt(((aligned - dst) ** 2).sum() / max((d0 * d0).sum(), 1e-300)))
        return self

    def transform(self, X) -> np.ndarray:
        if not hasattr(self, "rotation_"):
            raise AlignmentError("alignment is not fitted; call fit(src, dst) first.")
        X = as_matrix(X)
        if X.shape[1] != self.rotation_.shape[0]:
            raise AlignmentError(f"points have {X.shape[1]} dimensions; the alignment was fitted in "
                                 f"{self.rotation_.shape[0]}.")
        return self.scale_ * X @ self.rotation_.T + self.translation_


def umeyama(src, dst, with_scale: bool = True) -> UmeyamaAlignment:
    """Shorthand for ``UmeyamaAlignment(with_scale).fit(src, dst)``."""
    return UmeyamaAlignment(with_scale).fit(src, dst)


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
