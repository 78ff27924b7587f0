"""The public anchor document's data as a client holds it (:class:`PublicAnchor`)."""

from __future__ import annotations

import math
import numbers

from .._validation import as_labels, as_matrix, require_unit_rows
from ..errors import InvalidInputError


class PublicAnchor:
    """The public data a server publishes: anchor rows (ids, features, labels) and the dummy pool."""

    def __init__(self, ids, features, labels, dummy_features, dummy_labels):
        self.features = as_matrix(features, "anchor features")
        require_unit_rows(self.features, "anchor features")
        self.labels = as_labels(labels, self.features.shape[0], "anchor labels")
        self.ids = list(ids)
        if len(self.ids) != self.features.shape[0] or len(set(self.ids)) != len(self.ids):
            raise InvalidInputError("anchor ids must be unique, one per anchor row.")
        self.dummy_features = as_matrix(dummy_features, "dummy features")
        require_unit_rows(self.dummy_features, "dummy features")
        self.dummy_labels = as_labels(dummy_labels, self.dummy_features.shape[0], "dummy labels")
        if self.dummy_features.shape[1] != self.features.shape[1]:
            raise InvalidInputError("dummy pool and anchor rows have different feature dimensions.")


#: (low, high) of the numeric AnchorFrame parameters of a run: what a service's embedding job
#: accepts (:func:`pm_vector.service.jobs.check_params`) and what a client agrees to rebuild a frame
#: with (an anchor document saying ``n_iter = 10**9`` is refused, not run for hours)
FRAME_PARAM_BOUNDS: dict[str, tuple[float, float]] = {
    "n_components": (1, 256), "n_iter": (1, 50), "n_extend_iter": (1, 100), "n_neighbors": (1, 200),
    "alpha": (0.0, 1.0), "label_sigma": (1e-6, 1e6), "sigma": (1e-6, 1e6)}
#: the integer ones among them
FRAME_INT_PARAMS = ("n_components", "n_iter", "n_extend_iter", "n_neighbors")
#: most anchor rows a client rebuilds a frame from: the frame's dense kernel holds rows^2 float64
#: (800 MB at 10,000; a service's request bound ``max_rows`` is 5,000 by default)
MAX_FRAME_ANCHORS = 10_000


def check_frame_params(params, n_anchors: int) -> dict:
    """A run's published AnchorFrame parameters, checked before anything is computed with them:
    a map of at most 32 entries, each number within :data:`FRAME_PARAM_BOUNDS` (integers where
    :data:`FRAME_INT_PARAMS`; ``sigma`` may be ``"auto"``), strings of at most 40 characters, and
    at most :data:`MAX_FRAME_ANCHORS` anchor rows. :class:`InvalidInputError` says which."""
    if params is None:
        params = {}
    if not isinstance(params, dict) or len(params) > 32:
        raise InvalidInputError("the frame's parameters are not a map of AnchorFrame parameters.")
    if not 0 <= int(n_anchors) <= MAX_FRAME_ANCHORS:
        raise InvalidInputError(f"the anchor set has {int(n_anchors):,} rows; a client rebuilds a frame from at most "
                                f"{MAX_FRAME_ANCHORS:,} (its kernel is rows^2).")
    for k, v in params.items():
        if not isinstance(k, str) or len(k) > 40:
            raise InvalidInputError("the frame's parameters hold a name that is not AnchorFrame's.")
        if isinstance(v, str):
            if len(v) > 40:
                raise InvalidInputError(f"frame parameter {k!r} is a string of {len(v)} characters; at most 40.")
            if k in FRAME_PARAM_BOUNDS and not (k == "sigma" and v == "auto"):
                raise InvalidInputError(f"frame parameter {k!r} must be a number, not {v[:40]!r}.")
            continue
        if v is None or isinstance(v, bool):
            continue
        if not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
            raise InvalidInputError(f"frame parameter {k!r} must be a finite number or a short string.")
        if k in FRAME_PARAM_BOUNDS:
            lo, hi = FRAME_PARAM_BOUNDS[k]
            if not lo <= float(v) <= hi or (k in FRAME_INT_PARAMS and float(v) != int(v)):
                raise InvalidInputError(f"frame parameter {k} = {v!r} is outside {lo:g}..{hi:g}"
                                        f"{' (an integer)' if k in FRAME_INT_PARAMS else ''}: refused before the "
                                        "frame is rebuilt.")
    return dict(params)
