"""Input checks shared by :mod:`pm_vector.db.store.api` and :mod:`pm_vector.db.store.bulk`: collection names,
feature matrices, labels, JSON values and a new collection's column values. They raise
:class:`~pm_vector.errors.InvalidInputError` (and the ``db.errors`` subclasses) before anything
is written."""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

import numpy as np

from ..._validation import as_labels, as_matrix
from ...errors import InvalidInputError
from ._names import NAME_PATTERN, check_name  # noqa: F401  (re-exported)
from ..errors import DimensionMismatchError, UnknownLabelError
from . import partitioned, payloads

METRICS = ("l2", "cosine", "ip")
ROLES = ("anchor", "dummy")
HALFVEC_MAX = 65504.0
MAX_FEATURE_DIM = 16000


def checked_features(x, coll: Mapping[str, Any], what: str) -> np.ndarray:
    """Validated float32 matrix of the collection's dimension (NaN/inf refused, halfvec range checked).

    Converts to float32 once (no float64 copy of a large float32 input)."""
    if x is None:
        raise InvalidInputError(f"{what} is missing.")
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise InvalidInputError(f"{what} must be numeric; got dtype {a.dtype}.")
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        as_matrix(a, what)  # raises the shape error
    if a.shape[1] != coll["feature_dim"]:
        raise DimensionMismatchError(
            f"{what} has {a.shape[1]} features per row, but collection {coll['name']!r} has {coll['feature_dim']}.")
    if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
        bad = int(np.argwhere(~np.isfinite(a))[0][0])
        raise InvalidInputError(f"{what} contains NaN or infinite values (first at row {bad}); clean or drop those "
                                "rows.")
    a32 = np.ascontiguousarray(a, dtype=np.float32)
    if not np.all(np.isfinite(a32)):
        raise InvalidInputError(f"{what} has values too large for float32; rescale the features.")
    if coll["feature_type"] == "halfvec" and np.abs(a32).max() > HALFVEC_MAX:
        raise InvalidInputError(
            f"{what} has values beyond +-{HALFVEC_MAX:g}, which half precision (used above 2,000 dimensions) "
            "cannot hold; rescale the features (e.g. normalise rows).")
    return a32


def checked_labels(y, n: int, coll: Mapping[str, Any], what: str) -> np.ndarray:
    lab = as_labels(y, n, what)
    allowed = np.asarray(coll["labels"], dtype=np.int64)
    bad = np.flatnonzero(~np.isin(lab, allowed))
    if bad.size:
        raise UnknownLabelError(
            f"{what}[{int(bad[0])}] = {int(lab[bad[0]])} is not in the label set of collection {coll['name']!r} "
            f"({sorted(int(v) for v in allowed)}); {bad.size} row(s) affected.")
    return lab


def json_safe(obj: Any, what: str) -> Any:
    try:
        json.dumps(obj, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} is not JSON-serialisable ({exc}); use dicts, lists, str, int, float, "
                                "bool, None.") from exc
    return obj


def collection_spec(name: str, dim: int, labels: Iterable[int] | None, metric: str = "l2",
                     allow_raw_features: bool = False, *, description: str | None = None, hnsw_m: int = 16,
                     hnsw_ef_construction: int = 64, keep_previous_runs: int = 1,
                     settings: Mapping[str, Any] | None = None, partitions: int | None = None,
                     max_payload_bytes: int | None = None) -> dict[str, Any]:
    """The validated column values of a new collection (see :func:`create_collection`)."""
    check_name(name)
    labels, part_settings = partitioned.creation(labels, partitions)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 1 <= int(dim) <= MAX_FEATURE_DIM:
        raise InvalidInputError(f"dim must be an integer in 1..{MAX_FEATURE_DIM}, got {dim!r}.")
    dim = int(dim)
    lab = np.asarray(list(labels) if not isinstance(labels, np.ndarray) else labels)
    if lab.size == 0:
        raise InvalidInputError("labels must list at least one class label.")
    lab = as_labels(lab.ravel(), lab.size, "labels")
    if np.unique(lab).size != lab.size:
        raise InvalidInputError("labels must not repeat a label.")
    if metric not in METRICS:
        raise InvalidInputError(f"metric must be one of {METRICS}, got {metric!r}.")
    if not isinstance(allow_raw_features, bool):
        raise InvalidInputError("allow_raw_features must be True or False.")
    if not 2 <= int(hnsw_m) <= 100:
        raise InvalidInputError(f"hnsw_m must be in 2..100, got {hnsw_m}.")
    if not 4 <= int(hnsw_ef_construction) <= 1000 or int(hnsw_ef_construction) < 2 * int(hnsw_m):
        raise InvalidInputError(
            f"hnsw_ef_construction must be in 4..1000 and at least 2 * hnsw_m ({2 * int(hnsw_m)}), "
            f"got {hnsw_ef_construction}.")
    if int(keep_previous_runs) < 0:
        raise InvalidInputError("keep_previous_runs must be >= 0.")
    st: dict[str, Any] = dict(settings or {})
    if partitioned.SETTINGS_KEY in st:
        raise InvalidInputError(f"settings[{partitioned.SETTINGS_KEY!r}] is set by partitions=, not by hand.")
    if part_settings is not None:
        st[partitioned.SETTINGS_KEY] = part_settings
    st.update({"allow_raw_features": allow_raw_features, "hnsw_m": int(hnsw_m),
               "hnsw_ef_construction": int(hnsw_ef_construction), "keep_previous_runs": int(keep_previous_runs)})
    if max_payload_bytes is None:
        max_payload_bytes = st.get(payloads.SETTINGS_KEY, payloads.DEFAULT_MAX_PAYLOAD_BYTES)
    st[payloads.SETTINGS_KEY] = payloads.check_limit(max_payload_bytes)
    st[payloads.HIGH_KEY] = 0  # a new collection stores no payload yet: its high-water mark (payloads.py)
    if description is not None:
        st["description"] = str(description)
    json_safe(st, "settings")
    return {"name": name, "feature_dim": dim, "feature_type": "vector" if dim <= 2000 else "halfvec",
            "metric": metric, "labels": [int(v) for v in sorted(lab)], "settings": st}
