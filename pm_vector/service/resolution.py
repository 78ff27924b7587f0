"""The service's view of the server-side protocol: public anchor, client frame, resolve.

Delegates to :mod:`pm_vector.db.resolution` when it is installed (the SQL path: align + one
``pm_knn_batch`` statement + the request log) and normalises its answers to the shapes the
HTTP API documents. A small fallback built on :mod:`pm_vector.db`'s public API is used
otherwise, so the service does not depend on that module's internals.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import numpy as np

from ..errors import InvalidInputError


def _db_resolution():
    try:
        from ..db import resolution  # type: ignore[attr-defined]
    except ImportError:
        return None
    if all(hasattr(resolution, f) for f in ("public_anchor", "resolve")):
        return resolution
    return None


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


# ----------------------------------------------------------------------------- fallback

def _run_anchor_embedding(run_id: int, dim: int) -> np.ndarray:
    from ..db.engine import connect

    with connect() as conn:
        rows = conn.execute(f"SELECT position, embedding FROM pm_vector.run_{int(run_id)}_anchors "
                            "ORDER BY position").fetchall()
    return np.array([np.asarray(r[1].to_numpy() if hasattr(r[1], "to_numpy") else r[1], dtype=np.float64)
                     for r in rows]).reshape(len(rows), dim)


def _fallback_public_anchor(collection: str):
    from .. import db
    from ..client import PublicAnchor
    from ..db.errors import NoActiveRunError

    info = db.collection_info(collection)
    if info.get("active_run_id") is None:
        raise NoActiveRunError(f"collection {collection!r} has no active embedding run; start a job "
                               f"(POST /collections/{collection}/jobs or pm-vector demo) first.")
    run = db.run_info(info["active_run_id"])
    a = db.get_anchor_set(collection, "anchor", anchor_set_id=run["anchor_set_id"])
    d = db.get_anchor_set(collection, "dummy")
    ids = [f"{a.anchor_set_id}:{i}" for i in range(len(a))]
    E = _run_anchor_embedding(run["run_id"], int(run["embedding_dim"]))
    pa = PublicAnchor(ids, a.features.astype(np.float64), a.labels, d.features.astype(np.float64), d.labels)
    frame = {"run_id": int(run["run_id"]), "anchor_set_id": int(a.anchor_set_id),
             "dummy_set_id": int(d.anchor_set_id), "params": dict(run["params"] or {}), "seed": int(run["seed"]),
             "embedding_dim": int(run["embedding_dim"]), "anchor_embedding": E}
    return pa, frame


def _fallback_resolve(collection: str, request, k: int, include_features: bool) -> dict[str, Any]:
    from .. import db
    from ..resolve import align_request

    received = dt.datetime.now(dt.timezone.utc)
    t0 = time.perf_counter()
    pa, frame = _fallback_public_anchor(collection)
    Z = align_request(request, pa.ids, frame["anchor_embedding"])
    res = db.knn_batch(collection, Z, int(k))
    feats = None
    if include_features:
        flat = [int(i) for i in res["item_ids"].ravel() if i >= 0]
        got = db.fetch_items(collection, flat, include_features=True) if flat else {"features": []}
        feats = dict(zip(flat, got["features"]))
    rows = []
    for qi in range(Z.shape[0]):
        n = int(res["counts"][qi])
        row = {"item_ids": res["item_ids"][qi, :n], "external_ids": res["external_ids"][qi][:n],
               "labels": res["labels"][qi, :n], "distances": res["distances"][qi, :n]}
        if feats is not None:
            row["features"] = [feats[int(i)] for i in res["item_ids"][qi, :n]]
        rows.append(row)
    ms = (time.perf_counter() - t0) * 1000
    log_id = db.log_request(collection, request.to_dict(), run_id=frame["run_id"], row_count=len(rows),
                            received_at=received, finished_at=dt.datetime.now(dt.timezone.utc), duration_ms=ms)
    return {"collection": collection, "run_id": frame["run_id"], "k": int(k), "rows": rows, "request_id": log_id}


# ----------------------------------------------------------------------------- public

def public_anchor(collection: str):
    """``(PublicAnchor, frame_info)``; ``frame_info`` holds ``params``, ``seed``, ``anchor_embedding`` (array)."""
    mod = _db_resolution()
    if mod is None:
        return _fallback_public_anchor(collection)
    pa, frame = mod.public_anchor(collection)
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


def _rows_from(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-row results from whatever shape the resolver returned."""
    if "rows" in result and isinstance(result["rows"], list):
        return result["rows"]
    for key in ("results", "per_row"):
        if key in result and isinstance(result[key], list):
            return result[key]
    if "item_ids" in result:  # arrays (rows, k)
        ids = np.asarray(result["item_ids"])
        out = []
        for i in range(ids.shape[0]):
            keep = ids[i] >= 0
            row = {"item_ids": ids[i][keep]}
            for key in ("labels", "distances"):
                if key in result:
                    row[key] = np.asarray(result[key])[i][keep]
            if "external_ids" in result:
                row["external_ids"] = [e for e, m in zip(result["external_ids"][i], keep) if m]
            if "features" in result and result["features"] is not None:
                row["features"] = [f for f, m in zip(result["features"][i], keep) if m]
            out.append(row)
        return out
    raise InvalidInputError("the resolver returned no per-row results.")


def resolve(collection: str, request, *, k: int = 8, include_features: bool = False, conn=None,
            max_query_rows: int | None = None) -> dict[str, Any]:
    """Resolve a validated :class:`PrivateMailRequest`; returns ``{"collection", "run_id", "k", "rows", ...}``
    with one entry of ``rows`` per query row (``item_ids``, ``external_ids``, ``labels``, ``distances``,
    and ``features`` when asked for and allowed). ``conn``: an idle pooled connection to run on."""
    mod = _db_resolution()
    if mod is None:
        out = _fallback_resolve(collection, request, k, include_features)
    else:
        kw: dict[str, Any] = {"conn": conn}
        if max_query_rows is not None:
            kw["max_query_rows"] = int(max_query_rows)
        res = dict(mod.resolve(collection, request, k=k, include_features=include_features, **kw))
        out = {key: v for key, v in res.items() if key not in ("rows", "results", "per_row", "item_ids", "labels",
                                                                "distances", "external_ids", "features", "counts")}
        out.update({"collection": collection, "k": int(k), "rows": _rows_from(res)})
    return _plain(out)
