"""The JSON documents the service serves: the public anchor document and resolve answers.

The server's resolve itself is :func:`pm_vector.db.resolution.resolve`; this module only turns
its answers (and the public anchor) into JSON-safe data.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np

from ..db import resolution as db_resolution


def _plain(v: Any) -> Any:
    """JSON-safe copy: numpy arrays/scalars to lists/numbers, NaN to None, datetimes to ISO."""
    if isinstance(v, np.ndarray):
        return _plain(v.tolist())
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if np.isfinite(f) else None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    return v


# ----------------------------------------------------------------------------- public

def public_anchor(collection: str):
    """``(PublicAnchor, frame_info)``; ``frame_info`` holds ``params``, ``seed``, ``anchor_embedding`` (array)."""
    pa, frame = db_resolution.public_anchor(collection)
    frame = dict(frame)
    if "anchor_embedding" in frame:
        frame["anchor_embedding"] = np.asarray(frame["anchor_embedding"], dtype=np.float64)
    return pa, frame


def anchor_document(collection: str) -> dict[str, Any]:
    """The public anchor as the JSON the API serves."""
    pa, frame = public_anchor(collection)
    return _plain({"collection": collection, "anchor_ids": list(pa.ids), "features": pa.features,
                   "labels": pa.labels, "dummy_features": pa.dummy_features, "dummy_labels": pa.dummy_labels,
                   "frame": frame})


def resolve_document(collection: str, request, *, k: int = 8, include_features: bool = False, conn=None,
                     max_query_rows: int | None = None, include_codes: bool = False) -> dict[str, Any]:
    """:func:`pm_vector.db.resolution.resolve` of a validated request, as JSON-safe data: one
    entry of ``rows`` per request row. ``conn``: an idle pooled connection to run on."""
    kw: dict[str, Any] = {"conn": conn}
    if include_codes:  # class-rows requests: every candidate's published compact code
        kw["include_codes"] = True
    if max_query_rows is not None:
        kw["max_query_rows"] = int(max_query_rows)
    return _plain(db_resolution.resolve(collection, request, k=k, include_features=include_features, **kw))
