"""The JSON documents the service serves: the public anchor document and resolve answers.

The server's resolve itself is :func:`pm_vector.db.resolve.resolution.resolve`, and what the anchor
document reads is in :mod:`pm_vector.db.store` (:func:`~pm_vector.db.store.collections.collection_uuid`,
:func:`~pm_vector.db.store.partitioned.public_partitions`); this module runs no SQL, it only turns
the answers (and the public anchor) into JSON-safe data.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import orjson

from ..db.resolve import resolution as db_resolution
from ..db.store.collections import collection_uuid
from ..db.store.partitioned import public_partitions
from ..protocol.codec import float_arrays


def plain_json(v: Any) -> Any:
    """JSON-safe copy: numpy arrays/scalars to lists/numbers, NaN to None, datetimes to ISO."""
    if isinstance(v, np.ndarray):
        return plain_json(v.tolist())
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if np.isfinite(f) else None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, dict):
        return {str(k): plain_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain_json(x) for x in v]
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
    """The public anchor as the API serves it, with ``collection_uuid`` (information; not a budget
    key): features, labels, the anchor embedding and every matrix of the frame (class frames,
    cells, codebooks) as numpy arrays of the same values, which :mod:`pm_vector.protocol.codec`
    writes as arrays in msgpack and as lists in JSON."""
    pa, frame = public_anchor(collection)
    return {"collection": collection, "collection_uuid": collection_uuid(collection),
            "anchor_ids": plain_json(list(pa.ids)), "features": np.asarray(pa.features),
            "labels": np.asarray(pa.labels), "dummy_features": np.asarray(pa.dummy_features),
            "dummy_labels": np.asarray(pa.dummy_labels), "frame": float_arrays(frame),
            "partitions": float_arrays(public_partitions(collection))}


def resolve_document(collection: str, request, *, k: int = 8, include_features: bool = False, conn=None,
                     max_query_rows: int | None = None, answer: dict[str, Any] | None = None,
                     read_conn=None) -> dict[str, Any]:
    """:func:`pm_vector.db.resolve.resolution.resolve` of a validated request: one entry of ``rows`` per
    request row, numpy arrays as resolve returns them (:func:`json_bytes` writes it). ``conn``: an
    idle pooled connection to run on; ``read_conn``: one to a replica that answers it (the log is
    written on ``conn``). ``answer``: ``{"compact", "code_bytes"}`` from
    :func:`pm_vector.service.validation.check_resolve_body`.

    The compact answer (the default of class-rows and cell requests) is, besides the answer's
    top-level fields (``collection``, ``run_id``, ``format``, ``release``, ``n_cells``,
    ``k_prime``, ``n_query_rows``, ``timings_ms``, ``request_log_id``), ``answer: "compact"`` and
    ``codes: {"bytes": b, "digest"}`` (the code prefix and the digest of the published codes),
    one entry of ``rows`` per request row: ``{"row", "item_ids": uint32 array (k',), "codes":
    uint8 array (k', b)[, "payloads": [...]]}`` (payloads when any candidate of the answer has
    one). Its size is about ``C k' (b + 4)`` bytes in msgpack; in JSON the arrays are lists."""
    kw: dict[str, Any] = {"conn": conn}
    if read_conn is not None:
        kw["read_conn"] = read_conn
    if answer and answer.get("compact"):
        kw["compact"] = True
    if answer and answer.get("code_bytes") is not None:
        kw["code_bytes"] = int(answer["code_bytes"])
    if max_query_rows is not None:
        kw["max_query_rows"] = int(max_query_rows)
    return db_resolution.resolve(collection, request, k=k, include_features=include_features, **kw)


def json_bytes(v: Any) -> bytes:
    """JSON of a document as :func:`plain_json` would make it (numpy arrays and scalars as lists and
    numbers, NaN and infinities as null, datetimes in ISO 8601), written by orjson in C, with
    no Python step per number (``plain_json`` + ``json`` made one for each of an answer's values);
    float32 arrays in their shortest float32 form (they read back exactly)."""
    return orjson.dumps(v, default=_plain_default, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def _plain_default(v: Any) -> Any:
    """What orjson cannot write itself (numpy arrays of other dtypes, odd scalars): as plain_json."""
    out = plain_json(v)
    if out is v:
        raise TypeError(f"not JSON serialisable: {type(v).__name__}")
    return out
