"""The whole answer of a class-rows request (one list per query row), checked before the client's
secret picks its row.

A client keeps one row of such an answer, the one its secret names. If it checked only that row, a
malicious server could malform one row and learn from the client's reaction (an error, a retry, no
next query) whether that row is the real one. :func:`check_rows_answer` checks EVERY row against the
public shape of the request (``n_rows`` rows in order, each at most ``k'`` distinct ids, codes of
exactly the width asked, raw features of the collection's width, payloads one per candidate) and
raises one :class:`~pm_vector.errors.InvalidInputError` whose text depends on the answer alone."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidInputError
from .published_codes import row_codes
from ..deprecation import renamed_keywords

#: the per-candidate lists a row of a full answer may carry beside its ids
_LISTS = ("external_ids", "labels", "scores", "distances", "payloads", "predicted", "class_scores")


def _ids(value: Any, shortlist: int, where: str) -> np.ndarray:
    a = np.asarray(value if value is not None else [])
    if isinstance(value, (bytes, bytearray, str)) or a.ndim != 1 or (a.size and a.dtype.kind not in "ui"):
        raise InvalidInputError(f"{where}: item_ids must be a list of integers.")
    a = a.astype(np.int64)
    if a.size > shortlist or (a.size and (a.min() < 0 or np.unique(a).size != a.size)):
        raise InvalidInputError(f"{where}: item_ids must be at most {shortlist} distinct non-negative integers.")
    return a


@renamed_keywords(k_prime="shortlist")  # its old keyword, until 0.3.0
def check_rows_answer(rows: Any, *, n_rows: int, shortlist: int, code_bytes: int | None = None,
                      n_features: int | None = None) -> list[dict]:
    """Every row of a class-rows answer, checked (module doc); returns them with ``item_ids`` as
    int64 arrays and, when asked, ``codes`` as ``(n, code_bytes)`` uint8 and ``features`` as
    ``(n, n_features)`` float64."""
    if not isinstance(rows, list) or len(rows) != int(n_rows):
        raise InvalidInputError(f"the answer must have exactly {int(n_rows)} rows, one per query row.")
    out = []
    for j, r in enumerate(rows):
        if not isinstance(r, dict):
            raise InvalidInputError("every answer row must be a document.")
        where = "an answer row"
        row = dict(r)
        ids = _ids(r.get("item_ids"), int(shortlist), where)
        n = int(ids.size)
        row["item_ids"] = ids
        if code_bytes is not None:
            row["codes"] = row_codes(r.get("codes"), n, int(code_bytes))
        if n_features is not None and r.get("features") is not None:
            try:
                F = np.asarray(r["features"], dtype=np.float64)
            except (TypeError, ValueError):
                raise InvalidInputError(f"{where}: features must be numbers.") from None
            if F.shape != (n, int(n_features)) or not np.all(np.isfinite(F)):
                raise InvalidInputError(f"{where}: features must be {n} x {int(n_features)} finite numbers.")
            row["features"] = F
        for key in _LISTS:
            v = r.get(key)
            if v is not None and (isinstance(v, (str, bytes)) or len(v) != n):
                raise InvalidInputError(f"{where}: {key} must have one entry per candidate.")
        out.append(row)
    return out
