"""The public anchor frame, rebuilt and verified: one function for the client and the server.

A run's :class:`~pm_vector.manifold.AnchorFrame` is a function of public data only (the anchor
set, its parameters, its seed). The server publishes the anchor embedding the run stored; the
client rebuilds the frame from the anchor document (:func:`frame_from_document`) and the server
rebuilds it from its tables (:func:`pm_vector.db.resolve.frame.client_frame`), both with
:func:`rebuild_frame`, which refuses a frame that does not reproduce the published embedding.

**One tolerance**, :data:`FRAME_TOLERANCE` = 1e-4, absolute for coordinates of order 1 and
relative to the largest coordinate above 1. Why this one: the stored embedding is float32 (a
rounding of about 6e-8 relative), and the client rebuilds on other hardware, BLAS and torch
builds than the embedding job ran on, whose float64 results drift in the last digits through
the frame's iterations; 1e-4 leaves room for both and still refuses another embedding
function or a frame shifted by 1e-3. The check is about agreement, not privacy: the client
always queries with the frame it rebuilt itself, never with the published embedding.

**One error**, :class:`~pm_vector.errors.FrameMismatchError` (an
:class:`~pm_vector.errors.AlignmentError`: the public frame and the published one do not
align), raised on both sides, so a caller catches the same class whether it asked a service
(the client) or its own database (:mod:`pm_vector.db`, which re-exports the name).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import FrameMismatchError, InvalidInputError
from .anchor import PublicAnchor
from ..manifold import AnchorFrame

#: how far a rebuilt frame may be from the published anchor embedding (module doc: why this one)
FRAME_TOLERANCE = 1e-4
#: AnchorFrame keyword arguments that say how to compute, not what: left out of the rebuild
_EXECUTION_PARAMS = ("seed", "device")


def rebuild_frame(anchor_features, anchor_labels, params: Mapping[str, Any], seed: int, anchor_embedding,
                  *, run_id: int | None = None, tolerance: float = FRAME_TOLERANCE):
    """Fit ``AnchorFrame(**params, seed=seed)`` on the anchors and check that it reproduces
    ``anchor_embedding`` to ``tolerance`` (scaled by the largest coordinate when above 1).
    Raises :class:`~pm_vector.errors.FrameMismatchError` when it does not, or when ``params``
    are not AnchorFrame's; the fitted frame carries ``reproduction_error_``."""
    what = f"run {run_id}" if run_id is not None else "the run"
    kwargs = {k: v for k, v in dict(params).items() if k not in _EXECUTION_PARAMS}
    try:
        frame = AnchorFrame(**kwargs, seed=int(seed)).fit(anchor_features, anchor_labels)
    except TypeError as exc:
        raise FrameMismatchError(
            f"{what} was not built with an AnchorFrame embedding (its parameters {dict(params)!r} are not "
            f"AnchorFrame's: {exc}); clients cannot rebuild its frame. Re-embed with `pm-vector embed`.") from None
    except InvalidInputError as exc:
        raise FrameMismatchError(f"the AnchorFrame of {what} cannot be rebuilt from its anchors: {exc}") from None
    ref = np.asarray(anchor_embedding, dtype=np.float64)
    if frame.anchor_embedding_.shape != ref.shape:
        raise FrameMismatchError(
            f"the AnchorFrame rebuilt for {what} has shape {frame.anchor_embedding_.shape}, but the stored anchor "
            f"embedding has shape {ref.shape}: it does not reproduce the published anchor embedding (was the run "
            "built with other parameters?).")
    err = float(np.abs(frame.anchor_embedding_ - ref).max()) if ref.size else 0.0
    scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    if not err <= tolerance * scale:
        raise FrameMismatchError(
            f"the AnchorFrame rebuilt from {what}'s anchors, parameters {dict(params)!r} and seed {seed} does not "
            f"reproduce the published anchor embedding: it differs from the stored anchor embedding by {err:.3g} "
            f"(tolerance {tolerance * scale:.3g}); the run was not built by this AnchorFrame (another code version "
            "or embedding function, or the server's frame is not the public one). Refusing to use it.")
    frame.reproduction_error_ = err
    return frame


def frame_from_document(doc: Mapping[str, Any]):
    """``(AnchorFrame, PublicAnchor)`` from a service's anchor document, the frame rebuilt and
    checked by :func:`rebuild_frame` against the document's published anchor embedding."""
    fr = doc.get("frame") or {}
    if "seed" not in fr or fr.get("anchor_embedding") is None:
        raise InvalidInputError("the server's anchor document has no frame seed or anchor embedding; it cannot be "
                                "verified (is the collection embedded?).")
    anchor = PublicAnchor(doc["anchor_ids"], np.asarray(doc["features"], dtype=np.float64), doc["labels"],
                          np.asarray(doc["dummy_features"], dtype=np.float64), doc["dummy_labels"])
    frame = rebuild_frame(anchor.features, anchor.labels, dict(fr.get("params") or {}), fr["seed"],
                          fr["anchor_embedding"], run_id=doc.get("run_id"))
    return frame, anchor
