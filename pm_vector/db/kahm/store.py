"""The KAHM store: what the KAHM jobs (:mod:`pm_vector.db.kahm.roles`, :mod:`pm_vector.db.kahm.anchor`,
:mod:`pm_vector.db.kahm.audit`) share, below all of them: validation, the element-level privacy
record, the one-transaction write, the job's item snapshot, and the stored models (made from a
kind and its privacy record, serialised to and from the ``kahm_models.model`` bytes, their rows
read). The audit imports only this module of the KAHM jobs."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import numpy as np
from psycopg import sql
from psycopg.rows import dict_row

from ...defaults import DEFAULT_SMOOTHING_STEPS  # noqa: F401  (the library's, one home)
from ...errors import InvalidInputError
from ..core.collection import collection_row, load_items
from ..store._names import check_name
from ..core.abandoned import cleanup
from ..postgres import connect
from ..errors import (DatabaseError, NoKAHMModelError, RawFeaturesNotAllowedError,  # noqa: F401
                      RawKAHMDistancesNotAllowedError, translate_sql_error)
from ...kahm import FabricatedKAHMClassifier, KAHMClassifier, NoisyKAHMClassifier, load_model
from ...kahm.privacy import make_noise
from ..errors import KAHMRefitNeededError

KINDS = ("raw", "noisy", "fabricated")
#: items whose ingest is still running (or failed) are not part of a job's snapshot
SETTLED_ITEMS_SQL = ("AND NOT EXISTS (SELECT 1 FROM pm_vector.ingests g WHERE g.id = i.ingest_id "
            "AND g.status <> 'succeeded')")

ProgressFn = Callable[[str, int, int], None]


def raw_distances_allowed(coll) -> bool:
    """The collection's opt-in to serving outputs of raw models (default: no):
    ``settings["kahm"]["raw_distances"] = true``."""
    k = (coll.get("settings") or {}).get("kahm")
    return isinstance(k, dict) and k.get("raw_distances") is True


#: the KAHM kinds fitted with differential privacy (their outputs may leave the database)
PRIVATE_KINDS = ("noisy", "fabricated")
#: the stored kind of each model class (``KAHMClassifier._kind``); any other class counts as raw
_KIND_OF_CLASS = {"noisy_kahm_classifier": "noisy", "fabricated_kahm_classifier": "fabricated"}


def kind_of(model) -> str:
    """The stored kind (:data:`KINDS`) of a fitted model object."""
    return _KIND_OF_CLASS.get(getattr(model, "_kind", None), "raw")


def model_outputs_allowed(coll, kind) -> bool:
    """The one policy for what a collection's KAHM model computes on its items: distances
    (``/kahm/distances``, :func:`pm_vector.db.kahm.roles.party_distances`), class scores and
    predicted labels (resolve's ``class_scores``/``predicted``). A private kind's
    (:data:`PRIVATE_KINDS`) may leave the database; a raw model's (fitted on the items as
    stored: its outputs tell members from non-members) only where the collection opted in
    (:func:`raw_distances_allowed`). An unknown kind counts as raw."""
    return kind in PRIVATE_KINDS or raw_distances_allowed(coll)


def noop(*_a, **_k) -> None:
    return None


@contextmanager
def job_transaction():
    """A connection whose work commits at the end of the block, or rolls back and raises the
    translated error (:func:`~pm_vector.db.errors.translate_sql_error`): the one write of a job."""
    with connect() as conn:
        try:
            yield conn
            conn.commit()
        except BaseException as exc:
            conn.rollback()
            err = translate_sql_error(exc) if isinstance(exc, Exception) else exc
            if err is exc:
                raise
            raise err from exc


# ----------------------------------------------------------------------------- validation

def checked_value_range(value_range) -> tuple[float, float]:
    if value_range is None:
        raise InvalidInputError(
            "value_range=(lo, hi) is required for a differentially private job: features are clipped to it and "
            "d = hi - lo bounds how much one element can change (Definition 10). It must be public, e.g. (0, 1) "
            "for pixels in [0, 1] or (-1, 1) for unit-norm rows -- never computed from the data.")
    try:
        if isinstance(value_range, (str, bytes)):  # "01" would otherwise unpack to (0, 1)
            raise TypeError
        lo, hi = (float(v) for v in value_range)
    except (TypeError, ValueError):
        raise InvalidInputError(f"value_range must be two numbers (lo, hi); got {value_range!r}.") from None
    if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo):
        raise InvalidInputError(f"value_range must be finite with lo < hi; got ({lo}, {hi}).")
    return lo, hi



#: what the element-level jobs do not protect; stored with every privacy record
OUTSIDE_ELEMENT = ("labels, per-class counts and item ids (public here); a whole item row of p features costs up to "
                   "p x epsilon (see row_epsilon)")


def kahm_privacy(epsilon, delta, value_range, noise: str = "grid") -> dict[str, Any]:
    lo, hi = checked_value_range(value_range)
    mech = make_noise(epsilon, delta, hi - lo, noise)  # validates epsilon, delta, sensitivity, noise
    return {**mech.record(), "epsilon": float(mech.epsilon), "delta": float(mech.delta), "sensitivity": hi - lo,
            "value_range": [lo, hi], "noise": noise,
            "unit": "element", "unit_note": "one element of the item feature matrix (Definition 10)",
            "outside_guarantee": OUTSIDE_ELEMENT}


def checked_smoothing_steps(smoothing_steps):
    return None if smoothing_steps is None else positive_int("smoothing_steps", smoothing_steps, 0)


def smoothing_record(smoothing_steps) -> str:
    if smoothing_steps is None:
        return ("paper's stopping rule (eq 92): its threshold r comes from the original rows -- outside the guarantee "
                "(the value is not stored)")
    return f"fixed {int(smoothing_steps)} steps (public)"


def positive_int(name: str, v, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < lo:
        raise InvalidInputError(f"{name} must be an integer >= {lo}; got {v!r}.")
    return int(v)


def load_settled_items(collection: str):
    """The collection row and its settled items (``id``, ``label``, ``features`` float64)."""
    check_name(collection)
    cleanup(collection)  # undo ingests of dead processes first (also: unknown collection -> clear error)
    with connect() as conn:
        coll = collection_row(conn, collection)
        items = load_items(conn, coll, SETTLED_ITEMS_SQL)
        conn.rollback()
    if items["id"].shape[0] == 0:
        raise InvalidInputError(f"collection {collection!r} has no items; ingest some first.")
    items["features"] = np.asarray(items["features"], dtype=np.float64)
    return coll, items


def class_counts_check(coll, labels: np.ndarray, need: int, what: str) -> np.ndarray:
    classes = np.asarray(sorted(int(c) for c in coll["labels"]), dtype=np.int64)
    counts = {int(c): int(n) for c, n in zip(*np.unique(labels, return_counts=True))}
    for c in classes:
        if counts.get(int(c), 0) < need:
            raise InvalidInputError(
                f"class {int(c)} of collection {coll['name']!r} has {counts.get(int(c), 0)} item(s); {what} needs at "
                f"least {need} per class. Ingest more items of that class or lower the per-class sizes / "
                "n_components.")
    return classes


# ----------------------------------------------------------------------------- stored models

def make_model(kind: str, priv: dict | None, n_components, n_layers, branch_size, smoothing_steps, noise_seed,
                n_jobs, dtype="float64"):
    common = dict(n_components=n_components, n_layers=n_layers, branch_size=branch_size, n_jobs=n_jobs,
                  dtype=dtype)
    if kind == "raw":
        return KAHMClassifier(**common)
    dp = dict(epsilon=priv["epsilon"], delta=priv["delta"], sensitivity=priv["sensitivity"], noise_seed=noise_seed,
              noise=priv.get("noise", "grid"))
    if kind == "noisy":
        return NoisyKAHMClassifier(**dp, **common)
    return FabricatedKAHMClassifier(**dp, **common, smoothing_steps=smoothing_steps)


def model_bytes(model) -> bytes:
    fd, path = tempfile.mkstemp(suffix=".kahm")
    os.close(fd)
    try:
        model.save(path)
        with open(path, "rb") as f:
            return f.read()
    finally:
        for p in (path, path + ".tmp"):
            if os.path.exists(p):
                os.remove(p)


def model_from_bytes(blob: bytes):
    fd, path = tempfile.mkstemp(suffix=".kahm")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        return load_model(path)
    finally:
        os.remove(path)


def model_row(conn, coll, model_id: int | None, *, with_blob: bool = False) -> dict[str, Any]:
    cols = sql.SQL("id, kind, classes, n_features, n_items, params, privacy, created_at, erased_at{}").format(
        sql.SQL(", model") if with_blob else sql.SQL(""))
    with conn.cursor(row_factory=dict_row) as cur:
        if model_id is None:
            cur.execute(sql.SQL("SELECT {} FROM pm_vector.kahm_models WHERE collection_id = %s ORDER BY id DESC LIMIT 1").format(
                cols), [coll["id"]])
        else:
            cur.execute(sql.SQL("SELECT {} FROM pm_vector.kahm_models WHERE collection_id = %s AND id = %s").format(cols),
                        [coll["id"], int(model_id)])
        row = cur.fetchone()
    if row is not None and row["kind"] == "raw" and row["erased_at"] is not None:
        raise KAHMRefitNeededError(
            f"KAHM model {row['id']} of collection {coll['name']!r} is a raw model fit before items were deleted "
            f"(erased at {row['erased_at'].isoformat()}): it may hold them, so its outputs are refused. Refit it with "
            f"`pm-vector kahm fit {coll['name']}` (noisy and fabricated models keep serving).")
    if row is None:
        which = f"KAHM model {model_id}" if model_id is not None else "KAHM model"
        raise NoKAHMModelError(f"collection {coll['name']!r} has no {which}; fit one with "
                               f"`pm-vector kahm fit {coll['name']}` (pm_vector.db.kahm.roles.fit_kahm_models).")
    return row
