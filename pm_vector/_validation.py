"""Shared input checks: shape, finiteness, unit-norm rows, labels."""

from __future__ import annotations

import numpy as np

from .errors import InvalidInputError

UNIT_TOL = 1e-6


def as_matrix(x, name: str = "X", *, dtype=np.float64) -> np.ndarray:
    """Return ``x`` as a finite 2-d float array or raise :class:`InvalidInputError`."""
    a = np.asarray(x, dtype=dtype)
    if a.ndim == 1:
        raise InvalidInputError(f"{name} must be 2-d (rows x features); got a 1-d array of length {a.shape[0]}. "
                                f"Use {name}.reshape(1, -1) for a single row.")
    if a.ndim != 2:
        raise InvalidInputError(f"{name} must be 2-d (rows x features); got shape {a.shape}.")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise InvalidInputError(f"{name} is empty (shape {a.shape}).")
    if not np.all(np.isfinite(a)):
        bad = int(np.argwhere(~np.isfinite(a))[0][0])
        raise InvalidInputError(f"{name} contains NaN or infinite values (first at row {bad}); clean or drop those rows.")
    return a


def as_labels(y, n: int, name: str = "y") -> np.ndarray:
    """Return ``y`` as a 1-d int64 array of length ``n``."""
    a = np.asarray(y)
    if a.ndim != 1 or a.shape[0] != n:
        raise InvalidInputError(f"{name} must be a 1-d array with one label per row ({n}); got shape {a.shape}.")
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
            raise InvalidInputError(f"{name} must hold integer class labels; got non-integer values.")
    elif a.dtype.kind not in "iu":
        raise InvalidInputError(f"{name} must hold integer class labels; got dtype {a.dtype}.")
    return a.astype(np.int64)


def require_unit_rows(x: np.ndarray, name: str = "X", tol: float = UNIT_TOL) -> None:
    """Raise unless every row has Euclidean norm 1 (the sensitivity bounds assume it)."""
    norms = np.linalg.norm(x, axis=1)
    bad = np.flatnonzero(np.abs(norms - 1.0) > tol)
    if bad.size:
        raise InvalidInputError(
            f"{name} must have unit-norm rows (the privacy bound assumes it); row {int(bad[0])} has norm "
            f"{norms[bad[0]]:.6g}. Normalise with pm_vector.manifold.normalize_rows(X) first.")


def unit_query(x, name: str = "query") -> np.ndarray:
    """One query vector (any shape of one row) as a finite 1-d float64 vector of unit norm, or
    :class:`InvalidInputError`: empty, NaN or infinite, zero, or so small that its norm underflows
    (``np.full(64, 1e-300)``: its squares are 0) or is subnormal (its scaling is inexact). A
    client checks this before it asks a server anything (issue #35, finding 12c)."""
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if a.size == 0:
        raise InvalidInputError(f"{name} is empty.")
    if not np.all(np.isfinite(a)):
        raise InvalidInputError(f"{name} contains NaN or infinite values.")
    norm = float(np.linalg.norm(a))
    if norm == 0.0:
        why = "all zeros" if not np.any(a) else "so small that its norm underflows to 0"
        raise InvalidInputError(f"{name} is {why}: it has no direction to search; scale it up (only its "
                                "direction is used).")
    u = a / norm
    if norm < np.finfo(np.float64).tiny or abs(float(np.linalg.norm(u)) - 1.0) > UNIT_TOL:
        raise InvalidInputError(f"{name} is so small ({norm:.3g}) that its direction cannot be computed "
                                "exactly; scale it up (only its direction is used).")
    return u


def normalize_rows(x) -> np.ndarray:
    """Scale every row to unit Euclidean norm; zero rows are refused."""
    a = as_matrix(x)
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise InvalidInputError(f"cannot normalise a zero row (row {int(np.flatnonzero(norms[:, 0] == 0)[0])}).")
    return a / norms
