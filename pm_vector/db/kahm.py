"""KAHM roles of a collection, stored in the database (the KAHM paper's tools as server jobs).

::

    fabricate_anchor_set(collection, epsilon, *, value_range, ...) -> dict
        a differentially private anchor set + dummy pool fabricated from the collection's own
        items (Definition 14, Remark 4), registered as the collection's current anchor and dummy
        sets: the next embedding job uses them, so they serve the private query protocol.
    fit_kahm_models(collection, *, kind="raw"|"noisy"|"fabricated", ...) -> dict
        one wide KAHM per class (Definition 7; Definitions 12/15 for the private kinds), stored
        with the class-matching scores (Definition 8) of every item. The newest model serves:
        resolve() returns each returned item's scores with its row.
    score_new_items(collection) -> dict          scores for items ingested after the model
    list_kahm_models(collection=None) -> list    load_kahm_model(collection, model_id=None)
    class_scores(collection, features) -> dict   the current model on given feature rows
    party_distances(collection, features) -> dict
        what one party sends in federation: its distance values per class (no items)
    federated_classify(parties, features) -> dict
        the global classifier of eq 104 over several collections (or remote parties)
    run_membership_audit(collection, epsilon, *, value_range, ...) -> dict
        membership-inference scores (eq 69) of raw, noisy and fabricated models, stored
    list_audits(collection=None) -> list

Privacy unit (the KAHM paper's Definition 10): one *element* of the item feature matrix, which
may change by at most ``d``. Features are clipped to the public ``value_range = (lo, hi)``
first, so ``d = hi - lo`` is a true bound. A whole item row of ``p`` features then costs up to
``p * epsilon`` by basic composition; the provenance stored with each result says so.

Every job validates its input before it writes, computes everything in memory and writes in
one transaction at the end: a job that dies leaves nothing behind and the previous model or
anchor keeps serving.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from contextlib import contextmanager
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from .api import _check_name, _collection_row, _features, _iso, _json_safe, _load_items, _worker, cleanup
from .engine import connect
from .errors import DatabaseError, DimensionMismatchError, translate_sql_error

__all__ = [
    "fabricate_anchor_set", "fit_kahm_models", "score_new_items", "list_kahm_models", "load_kahm_model",
    "class_scores", "party_distances", "federated_classify", "run_membership_audit", "list_audits",
    "NoKAHMModelError", "KINDS",
]

KINDS = ("raw", "noisy", "fabricated")
#: items whose ingest is still running (or failed) are not part of a job's snapshot
_SETTLED = ("AND NOT EXISTS (SELECT 1 FROM pm_vector.ingests g WHERE g.id = i.ingest_id "
            "AND g.status <> 'succeeded')")

ProgressFn = Callable[[str, int, int], None]
#: PostgreSQL's limit for one bytea value is 1 GB; keep a margin for the row
MAX_MODEL_BYTES = 1_000_000_000


class NoKAHMModelError(DatabaseError, LookupError):
    """The collection has no stored KAHM model (or not the one asked for)."""


def _noop(*_a, **_k) -> None:
    return None


@contextmanager
def _transaction():
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

def _value_range(value_range) -> tuple[float, float]:
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


def _privacy(epsilon, delta, value_range) -> dict[str, Any]:
    from ..kahm import OptimalNoise

    lo, hi = _value_range(value_range)
    noise = OptimalNoise(epsilon, delta, hi - lo)  # validates epsilon, delta, sensitivity
    return {"epsilon": float(noise.epsilon), "delta": float(noise.delta), "sensitivity": hi - lo,
            "value_range": [lo, hi], "unit": "one element of the item feature matrix (Definition 10)"}


def _positive_int(name: str, v, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < lo:
        raise InvalidInputError(f"{name} must be an integer >= {lo}; got {v!r}.")
    return int(v)


def _load(collection: str):
    """The collection row and its settled items (``id``, ``label``, ``features`` float64)."""
    _check_name(collection)
    cleanup(collection)  # undo ingests of dead processes first (also: unknown collection -> clear error)
    with connect() as conn:
        coll = _collection_row(conn, collection)
        items = _load_items(conn, coll, _SETTLED)
        conn.rollback()
    if items["id"].shape[0] == 0:
        raise InvalidInputError(f"collection {collection!r} has no items; ingest some first.")
    items["features"] = np.asarray(items["features"], dtype=np.float64)
    return coll, items


def _class_counts_check(coll, labels: np.ndarray, need: int, what: str) -> np.ndarray:
    classes = np.asarray(sorted(int(c) for c in coll["labels"]), dtype=np.int64)
    counts = {int(c): int(n) for c, n in zip(*np.unique(labels, return_counts=True))}
    for c in classes:
        if counts.get(int(c), 0) < need:
            raise InvalidInputError(
                f"class {int(c)} of collection {coll['name']!r} has {counts.get(int(c), 0)} item(s); {what} needs at "
                f"least {need} per class. Ingest more items of that class or lower the per-class sizes / "
                "n_components.")
    return classes


# ----------------------------------------------------------------------------- DP anchor

def fabricate_anchor_set(collection: str, epsilon: float, *, value_range, delta: float = 1e-5,
                         anchors_per_class: int = 100, dummies_per_class: int = 20,
                         source_per_class: int | None = None, n_components: int = 20,
                         smoothing_steps: int | None = 5, max_smoothing_steps: int = 200, sample_seed: int = 0,
                         noise_seed: int | None = None, description: str | None = None, n_jobs: int = -1,
                         progress: ProgressFn | None = None) -> dict[str, Any]:
    """Fabricate a differentially private anchor set and dummy pool from the collection's items
    and register them (one transaction) as its current anchor and dummy sets.

    Per class, ``source_per_class`` items (default ``anchors_per_class + dummies_per_class``)
    are drawn with the public ``sample_seed`` (every class must have that many: the sizes are
    then public constants), clipped to ``value_range``, perturbed element-wise with Result 1's
    ``(epsilon, delta)`` noise (sensitivity ``hi - lo``) and fabricated (Definitions 13-14): the
    rows released are KAHM images of the smoothed noisy rows, with their labels. More source rows
    smooth the noise better at no privacy cost (the unit is one element, each with its own noise).
    Of each class's fabricated rows, ``anchors_per_class + dummies_per_class`` are drawn (public
    seed), normalised to unit norm and split into anchor and dummy rows -- post-processing.

    ``smoothing_steps`` (default 5) fixes the number of smoothing steps, so the release is a
    function of the noisy rows only: ``(epsilon, delta)``-DP per element with no caveat.
    ``None`` runs the paper's stopping rule (eq 92), whose threshold ``r`` is computed from the
    original rows of each class -- one scalar per class outside the guarantee; measured on
    digits and Fashion-MNIST it also gave worse anchors (``pm-vector bench kahm --part anchor``). ``noise_seed=None`` draws the noise from a cryptographically seeded generator (an int
    is for tests only).

    The next embedding job (``pm-vector embed``) builds its frame on this anchor, and clients
    download it as the public anchor. Returns ``{"anchor": {...}, "dummy": {...}, "provenance": {...},
    "fabrication": [...], "seconds": ...}``.
    """
    from ..kahm import fabricate_anchor

    report = progress or _noop
    priv = _privacy(epsilon, delta, value_range)
    a = _positive_int("anchors_per_class", anchors_per_class)
    dmy = _positive_int("dummies_per_class", dummies_per_class, 0)
    n = _positive_int("n_components", n_components)
    if smoothing_steps is not None:
        _positive_int("smoothing_steps", smoothing_steps, 0)
    if description is not None and not isinstance(description, str):
        raise InvalidInputError("description must be a string.")
    t0 = time.perf_counter()
    report("load", 0, 1)
    coll, items = _load(collection)
    report("load", 1, 1)
    per = a + dmy
    src = per if source_per_class is None else _positive_int("source_per_class", source_per_class)
    if src < per:
        raise InvalidInputError(f"source_per_class={src} is below anchors_per_class + dummies_per_class = {per}.")
    if n >= src:
        raise InvalidInputError(f"n_components={n} needs at least n+1 = {n + 1} source rows per class; got {src}.")
    if n > coll["feature_dim"]:
        raise InvalidInputError(f"n_components={n} exceeds the collection's {coll['feature_dim']} features.")
    classes = _class_counts_check(coll, items["label"], src, "fabricating the anchor")
    rng = np.random.default_rng(sample_seed)  # public bookkeeping, not a privacy mechanism
    pick = np.concatenate([rng.choice(np.flatnonzero(items["label"] == c), src, replace=False) for c in classes])
    lo, hi = priv["value_range"]
    X = np.clip(items["features"][pick], lo, hi)
    y = items["label"][pick]
    report("fabricate", 0, 1)
    import warnings

    from ..kahm import FabricationWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FabricationWarning)
        Xf, yf = fabricate_anchor(X, y, priv["epsilon"], n=n, seed=noise_seed, delta=priv["delta"],
                                  sensitivity=priv["sensitivity"], branch_size=max(src, 1000),
                                  max_smoothing_steps=max_smoothing_steps, smoothing_steps=smoothing_steps,
                                  n_jobs=n_jobs)
    report("fabricate", 1, 1)
    if not np.all(np.isfinite(Xf)):
        raise DatabaseError("the fabricated anchor has non-finite rows (the KAHM image is undefined for this "
                            "data); rescale the features or raise epsilon. Nothing was registered.")
    # the protocol's public anchor has unit-norm rows (PrivateMail's sensitivity bound assumes it):
    # normalising is post-processing of the DP release
    norms = np.linalg.norm(Xf, axis=1)
    if np.any(norms < 1e-12):
        raise DatabaseError("a fabricated anchor row is zero and cannot be normalised; raise epsilon or the "
                            "per-class sizes. Nothing was registered.")
    Xf = Xf / norms[:, None]
    anchor_rows, dummy_rows = [], []
    for c in classes:
        idx = np.flatnonzero(yf == c)
        idx = idx[rng.permutation(idx.size)]
        anchor_rows.append(idx[:a])
        dummy_rows.append(idx[a:per])
    ia, idm = np.concatenate(anchor_rows), np.concatenate(dummy_rows)
    p = int(coll["feature_dim"])
    prov = {
        "mechanism": "KAHM fabricated data (Definitions 13-14, Remark 4) over Result 1's optimal noise",
        **priv,
        "row_epsilon": priv["epsilon"] * p, "row_delta": priv["delta"] * p,
        "row_note": f"a whole item row of {p} features costs up to {p} x epsilon (basic composition)",
        "post_processing": "rows normalised to unit norm (the protocol's anchor rows must be unit-norm)",
        "smoothing": ("stopping rule eq 92; r from the original rows of each class (a scalar outside the "
                      "guarantee)") if smoothing_steps is None else f"fixed {int(smoothing_steps)} steps (public)",
        "n_components": n, "anchors_per_class": a, "dummies_per_class": dmy, "source_per_class": src,
        "source_items": int(pick.size),
        "classes": classes.tolist(), "sample_seed": int(sample_seed),
        "noise": "cryptographically seeded" if noise_seed is None else "fixed test seed (NOT private)",
        "warnings": [str(w.message) for w in caught][:10],
    }
    desc = description or f"DP fabricated anchor (KAHM, epsilon={priv['epsilon']:g} per element)"
    from .api import register_anchor_sets

    report("register", 0, 1)
    sets = [("anchor", Xf[ia], yf[ia], desc, prov)]
    if dmy:
        sets.append(("dummy", Xf[idm], yf[idm], desc.replace("anchor", "dummy pool"), prov))
    out = register_anchor_sets(collection, sets)
    report("register", 1, 1)
    return {"anchor": out[0], "dummy": out[1] if dmy else None, "provenance": prov,
            "seconds": round(time.perf_counter() - t0, 3)}


# ----------------------------------------------------------------------------- class models

def _make_model(kind: str, priv: dict | None, n_components, n_layers, branch_size, smoothing_steps, noise_seed,
                n_jobs, dtype="float64"):
    from ..kahm import FabricatedKAHMClassifier, KAHMClassifier, NoisyKAHMClassifier

    common = dict(n_components=n_components, n_layers=n_layers, branch_size=branch_size, n_jobs=n_jobs,
                  dtype=dtype)
    if kind == "raw":
        return KAHMClassifier(**common)
    dp = dict(epsilon=priv["epsilon"], delta=priv["delta"], sensitivity=priv["sensitivity"], noise_seed=noise_seed)
    if kind == "noisy":
        return NoisyKAHMClassifier(**dp, **common)
    return FabricatedKAHMClassifier(**dp, **common, smoothing_steps=smoothing_steps)


def _model_bytes(model) -> bytes:
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


def _model_from_bytes(blob: bytes):
    from ..kahm import load_model

    fd, path = tempfile.mkstemp(suffix=".kahm")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        return load_model(path)
    finally:
        os.remove(path)


def _scores_of(model, X: np.ndarray, chunk: int = 20000) -> tuple[np.ndarray, np.ndarray]:
    """(scores (N, C) float32, predicted labels (N,)) of rows X under a fitted classifier."""
    from ..kahm import matching_scores

    S, P = [], []
    for s in range(0, X.shape[0], chunk):
        D = model.class_distances(X[s:s + chunk])
        S.append(matching_scores(D).astype(np.float32))
        # eq 62; a row no class can model (all distances infinite) gets the first class, score 0 everywhere
        P.append(model.classes_[np.argmin(np.where(np.isfinite(D), D, np.inf), axis=1)])
    return np.concatenate(S), np.concatenate(P)


def _write_scores(conn, model_id: int, item_ids: np.ndarray, predicted: np.ndarray, scores: np.ndarray) -> None:
    with conn.cursor() as cur:
        with cur.copy("COPY pm_vector.kahm_item_scores (model_id, item_id, predicted, scores) FROM STDIN") as cp:
            for i, p_, s in zip(item_ids.tolist(), predicted.tolist(), scores.tolist()):
                cp.write_row((model_id, i, p_, s))


def fit_kahm_models(collection: str, *, kind: str = "raw", epsilon: float | None = None, delta: float = 1e-5,
                    value_range=None, n_components: int = 20, n_layers: int | None = None, branch_size: int = 1000,
                    smoothing_steps: int | None = None, noise_seed: int | None = None, keep_previous: int = 1,
                    dtype: str = "float32", n_jobs: int = -1, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Fit one wide KAHM per class on the collection's items, score every item, store both.

    ``kind``: ``"raw"`` (Definition 7 on the items as stored), ``"noisy"`` (Definition 12) or
    ``"fabricated"`` (Definition 15); the private kinds need ``epsilon`` and the public
    ``value_range`` (features clipped to it; sensitivity ``hi - lo``). The model and the
    class-matching scores (Definition 8) of every item are written in one transaction and the
    model becomes the collection's current one (``keep_previous`` older models are kept, the
    rest deleted). Returns the model's row (:func:`list_kahm_models` shape) plus ``timings``.

    ``dtype``: precision of the stored model. float32 by default: a wide KAHM keeps an
    ``N_s x p`` matrix per branch and layer (about 160 MB per 10,000 items of 784 features in
    float32), and class scores agree with float64 to about 1e-5. A model above PostgreSQL's
    1 GB value limit is refused before anything is written (the message says what to lower).
    """
    report = progress or _noop
    if kind not in KINDS:
        raise InvalidInputError(f"kind must be one of {KINDS}; got {kind!r}.")
    priv = None
    if kind != "raw":
        if epsilon is None:
            raise InvalidInputError(f"kind={kind!r} is differentially private: give epsilon (and value_range).")
        priv = _privacy(epsilon, delta, value_range)
    elif epsilon is not None:
        raise InvalidInputError("epsilon is for the private kinds ('noisy', 'fabricated'); kind='raw' adds no noise.")
    n = _positive_int("n_components", n_components)
    L = min(5, n) if n_layers is None else _positive_int("n_layers", n_layers)  # default: 5 layers, at most n
    bs = _positive_int("branch_size", branch_size)
    keep = _positive_int("keep_previous", keep_previous, 0)
    if smoothing_steps is not None and kind != "fabricated":
        raise InvalidInputError("smoothing_steps is a parameter of kind='fabricated'.")
    timings: dict[str, float] = {}
    t = time.perf_counter()
    report("load", 0, 1)
    coll, items = _load(collection)
    report("load", 1, 1)
    timings["load_s"] = time.perf_counter() - t
    if n > coll["feature_dim"]:
        raise InvalidInputError(f"n_components={n} exceeds the collection's {coll['feature_dim']} features (n <= p).")
    _class_counts_check(coll, items["label"], n + 1, f"a KAHM with n_components={n}")
    X = items["features"] if priv is None else np.clip(items["features"], *priv["value_range"])
    t = time.perf_counter()
    report("fit", 0, 1)
    if dtype not in ("float32", "float64"):
        raise InvalidInputError(f"dtype must be 'float32' or 'float64'; got {dtype!r}.")
    model = _make_model(kind, priv, n, L, bs, smoothing_steps, noise_seed, n_jobs, dtype)
    model.fit(X, items["label"])
    report("fit", 1, 1)
    timings["fit_s"] = time.perf_counter() - t
    t = time.perf_counter()
    report("score", 0, items["id"].shape[0])
    scores, pred = _scores_of(model, items["features"])
    report("score", items["id"].shape[0], items["id"].shape[0])
    timings["score_s"] = time.perf_counter() - t
    blob = _model_bytes(model)
    if len(blob) >= MAX_MODEL_BYTES:
        raise InvalidInputError(
            f"the fitted model takes {len(blob) / 1e6:.0f} MB, above PostgreSQL's 1 GB limit for one value; lower "
            f"n_layers (now {L}) or use dtype='float32', or fit on a sample of the items. Nothing was written.")
    params = {"n_components": n, "n_layers": L, "branch_size": bs, "dtype": dtype}
    if smoothing_steps is not None:
        params["smoothing_steps"] = int(smoothing_steps)
    if priv is not None:
        p = int(coll["feature_dim"])
        priv = {**priv, "noise": "cryptographically seeded" if noise_seed is None else "fixed test seed (NOT private)",
                "row_epsilon": priv["epsilon"] * p}
    t = time.perf_counter()
    report("write", 0, 1)
    from psycopg.types.json import Jsonb

    with _transaction() as conn:
        c2 = _collection_row(conn, collection, lock="FOR SHARE")
        if c2["id"] != coll["id"]:
            raise DatabaseError(f"collection {collection!r} was dropped and re-created while the job ran.")
        mid = conn.execute(
            "INSERT INTO pm_vector.kahm_models (collection_id, kind, params, privacy, classes, n_features, "
            "n_items, model, timings, worker) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
            [coll["id"], kind, Jsonb(params), None if priv is None else Jsonb(priv),
             [int(c) for c in model.classes_], int(model.n_features_in_), int(items["id"].shape[0]), blob,
             Jsonb({k: round(v, 4) for k, v in timings.items()}), Jsonb(_worker())]).fetchone()[0]
        _write_scores(conn, mid, items["id"], pred, scores)
        conn.execute("DELETE FROM pm_vector.kahm_models WHERE collection_id = %s AND id < %s AND id NOT IN "
                     "(SELECT id FROM pm_vector.kahm_models WHERE collection_id = %s AND id < %s "
                     "ORDER BY id DESC LIMIT %s)", [coll["id"], mid, coll["id"], mid, keep])
    report("write", 1, 1)
    timings["write_s"] = time.perf_counter() - t
    model.model_id_ = int(mid)  # as load_kahm_model() sets it: the cached model must carry its id too
    _cache_put(coll, mid, model)
    out = list_kahm_models(collection, model_id=mid)[0]
    out["timings"] = {k: round(v, 3) for k, v in timings.items()}
    out["training_accuracy"] = float(np.mean(pred == items["label"]))
    return out


def _model_row(conn, coll, model_id: int | None, *, with_blob: bool = False) -> dict[str, Any]:
    from psycopg.rows import dict_row

    cols = "id, kind, classes, n_features, n_items, params, privacy, created_at" + (", model" if with_blob else "")
    with conn.cursor(row_factory=dict_row) as cur:
        if model_id is None:
            cur.execute(f"SELECT {cols} FROM pm_vector.kahm_models WHERE collection_id = %s ORDER BY id DESC LIMIT 1",
                        [coll["id"]])
        else:
            cur.execute(f"SELECT {cols} FROM pm_vector.kahm_models WHERE collection_id = %s AND id = %s",
                        [coll["id"], int(model_id)])
        row = cur.fetchone()
    if row is None:
        which = f"KAHM model {model_id}" if model_id is not None else "KAHM model"
        raise NoKAHMModelError(f"collection {coll['name']!r} has no {which}; fit one with "
                               f"`pm-vector kahm fit {coll['name']}` (pm_vector.db.kahm.fit_kahm_models).")
    return row


_models: dict[tuple, Any] = {}
_models_lock = threading.Lock()


def _cache_key(coll, model_id):
    from .server import database_url

    return (database_url(), int(coll["id"]), int(model_id))


def _cache_put(coll, model_id, model) -> None:
    with _models_lock:
        if len(_models) >= 16:
            _models.pop(next(iter(_models)))
        _models[_cache_key(coll, model_id)] = model


def load_kahm_model(collection: str, model_id: int | None = None):
    """The fitted :class:`~pm_vector.kahm.KAHMClassifier` (or its DP subclass) stored for the
    collection: the current one, or ``model_id``. Cached per database and model id."""
    with connect() as conn:
        coll = _collection_row(conn, collection)
        row = _model_row(conn, coll, model_id)
        key = _cache_key(coll, row["id"])
        with _models_lock:
            hit = _models.get(key)
        if hit is not None:
            conn.rollback()
            return hit
        blob = conn.execute("SELECT model FROM pm_vector.kahm_models WHERE id = %s", [row["id"]]).fetchone()[0]
        conn.rollback()
    model = _model_from_bytes(bytes(blob))
    model.model_id_ = int(row["id"])
    _cache_put(coll, row["id"], model)
    return model


def list_kahm_models(collection: str | None = None, *, model_id: int | None = None) -> list[dict[str, Any]]:
    """Stored models (newest first), from the ``pm_vector.pm_kahm_models`` view."""
    from psycopg.rows import dict_row

    with connect() as conn:
        if collection is not None:
            _collection_row(conn, collection)
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT * FROM pm_vector.pm_kahm_models WHERE (%s::text IS NULL OR collection = %s) "
                        "AND (%s::bigint IS NULL OR model_id = %s) ORDER BY model_id DESC",
                        [collection, collection, model_id, model_id])
            rows = cur.fetchall()
    return [{k: _iso(v) for k, v in r.items()} for r in rows]


def score_new_items(collection: str, model_id: int | None = None) -> dict[str, Any]:
    """Score the items that have no scores under the current model (ingested after it was fitted).
    One transaction; returns ``{"model_id", "scored"}``."""
    model = load_kahm_model(collection, model_id)
    mid = int(model.model_id_)
    with connect() as conn:
        coll = _collection_row(conn, collection)
        items = _load_items(conn, coll, _SETTLED + f" AND NOT EXISTS (SELECT 1 FROM pm_vector.kahm_item_scores s "
                                                   f"WHERE s.model_id = {mid} AND s.item_id = i.id)")
        conn.rollback()
    if items["id"].shape[0] == 0:
        return {"model_id": mid, "scored": 0}
    scores, pred = _scores_of(model, np.asarray(items["features"], dtype=np.float64))
    with _transaction() as conn:
        # the model must still exist when the scores land (a concurrent fit may prune it)
        if conn.execute("SELECT 1 FROM pm_vector.kahm_models WHERE id = %s FOR SHARE", [int(mid)]).fetchone() is None:
            raise NoKAHMModelError(f"KAHM model {int(mid)} of collection {collection!r} was replaced and pruned "
                                   "meanwhile; run score_new_items again.")
        _write_scores(conn, int(mid), items["id"], pred, scores)
    return {"model_id": int(mid), "scored": int(items["id"].shape[0])}


def _query_rows(features, coll) -> np.ndarray:
    return np.asarray(_features(features, coll, "features"), dtype=np.float64)


def class_scores(collection: str, features, model_id: int | None = None) -> dict[str, Any]:
    """The collection's current model on feature rows: ``{"model_id", "classes", "scores" (Q, C),
    "distances" (Q, C), "predicted" (Q,)}`` (Definitions 6-8)."""
    from ..kahm import matching_scores

    with connect() as conn:
        coll = _collection_row(conn, collection)
        conn.rollback()
    X = _query_rows(features, coll)
    model = load_kahm_model(collection, model_id)
    D = model.class_distances(X)
    return {"collection": collection, "model_id": int(model.model_id_),
            "classes": model.classes_.tolist(), "distances": D, "scores": matching_scores(D),
            "predicted": model.classes_[np.argmin(D, axis=1)]}


# ----------------------------------------------------------------------------- federation

def party_distances(collection: str, features, model_id: int | None = None) -> dict[str, Any]:
    """What a party (a collection) sends in federated classification: for every query row, the
    distance value of each class it holds (Definition 6) -- no items, no model.
    ``{"party", "model_id", "n_features", "classes", "distances": {class: [per row]}}``."""
    with connect() as conn:
        coll = _collection_row(conn, collection)
        conn.rollback()
    try:
        X = np.asarray(features, dtype=np.float64) if np.ndim(features) == 2 else None
    except (TypeError, ValueError):
        raise InvalidInputError("features must be a 2-d numeric array (rows of equal length).") from None
    if X is not None and X.shape[1] != coll["feature_dim"]:
        raise DimensionMismatchError(
            f"the query has {X.shape[1]} features but party {collection!r} models {coll['feature_dim']}; every party "
            "must model the same feature space.")
    X = _query_rows(features, coll)
    model = load_kahm_model(collection, model_id)
    D = model.class_distances(X)
    return {"party": collection, "model_id": int(model.model_id_),
            "n_features": int(model.n_features_in_), "classes": model.classes_.tolist(),
            "distances": {int(c): D[:, j] for j, c in enumerate(model.classes_)}}


def federated_classify(parties: Sequence[Any], features, *, classes: Sequence[int] | None = None) -> dict[str, Any]:
    """The global classifier of eq 104 over several parties, from their distances only.

    ``parties``: collection names of this database, or callables ``f(features) -> dict`` of the
    :func:`party_distances` shape (e.g. a remote party behind the HTTP service,
    :meth:`pm_vector.client.http.Client.kahm_distances`). A class a party does not hold counts as
    infinitely far for that party (Remark 5). Returns ``{"predicted", "classes", "distances"
    (Q, C) min over parties, "scores" (Definition 8 of those), "party" (per row, the party whose
    model is nearest for the predicted class), "parties": [{"party", "model_id", "classes"}]}``.
    Raises on parties of different feature dimensions, before any distance is combined.
    """
    from ..kahm import federated_predict, matching_scores

    if isinstance(parties, (str, bytes)) or not isinstance(parties, Sequence) or len(parties) == 0:
        raise InvalidInputError("parties must be a non-empty list of collection names or callables.")
    Q = np.asarray(features, dtype=np.float64)
    if Q.ndim == 1:
        Q = Q[None, :]
    dims = {}
    for p in parties:  # dimensions first: a mismatch is refused before any party is asked
        if isinstance(p, str):
            with connect() as conn:
                dims[p] = int(_collection_row(conn, p)["feature_dim"])
                conn.rollback()
    if len(set(dims.values())) > 1:
        raise DimensionMismatchError(f"parties model different feature dimensions {dims}; federated classification "
                                     "needs one feature space.")
    answers = []
    for p in parties:
        ans = party_distances(p, Q) if isinstance(p, str) else p(Q)
        if not isinstance(ans, Mapping) or "distances" not in ans:
            raise InvalidInputError("a party callable must return a mapping with 'distances' "
                                    "({class: distances}), as party_distances() does.")
        answers.append(ans)
    nf = {a.get("party", f"party {i}"): a.get("n_features") for i, a in enumerate(answers)}
    if len({v for v in nf.values() if v is not None}) > 1:
        raise DimensionMismatchError(f"parties model different feature dimensions {nf}.")
    maps = [{int(c): np.asarray(v, dtype=np.float64) for c, v in a["distances"].items()} for a in answers]
    pred, cls, D = federated_predict(maps, classes=classes, return_distances=True)
    names = [a.get("party", f"party {i}") for i, a in enumerate(answers)]
    col = {int(c): j for j, c in enumerate(cls)}
    rows = np.arange(Q.shape[0])
    per_party = np.full((len(maps), Q.shape[0]), np.inf)
    for qi, m in enumerate(maps):
        for r in rows:
            c = int(pred[r])
            if c in m:
                per_party[qi, r] = m[c][r]
    winner = np.argmin(per_party, axis=0)
    return {"predicted": pred, "classes": cls.tolist(), "distances": D, "scores": matching_scores(D),
            "party": [names[w] for w in winner],
            "parties": [{"party": names[i], "model_id": a.get("model_id"), "classes": list(a.get("classes", []))}
                        for i, a in enumerate(answers)],
            "predicted_column": [col[int(c)] for c in pred]}


# ----------------------------------------------------------------------------- membership audit

def run_membership_audit(collection: str, epsilon: float, *, value_range, delta: float = 1e-5,
                         holdout_fraction: float = 0.3, max_items: int | None = 5000, n_components: int = 20,
                         n_layers: int | None = None, branch_size: int = 1000, smoothing_steps: int | None = None,
                         split_seed: int = 0, noise_seed: int | None = None, n_jobs: int = -1,
                         progress: ProgressFn | None = None) -> dict[str, Any]:
    """Membership-inference audit of the collection's models: the number a data owner checks
    before publishing a model (or anything fitted on the items).

    The items (at most ``max_items``, stratified, public ``split_seed``) are split into training
    and held-out rows (``holdout_fraction``, stratified). Three classifiers are fitted on the
    training rows -- ``raw`` (Definition 7, no noise), ``noisy`` (Definition 12) and
    ``fabricated`` (Definition 15) at ``epsilon`` -- and for each the membership-inference score
    of eq 69 (LSDD between the densities of ``min_c Gamma_c`` at training and held-out rows), the
    attack AUC and the held-out accuracy are reported. The report is stored
    (``pm_vector.pm_kahm_audits``) and returned, with ``audit_id``.
    """
    from sklearn.model_selection import train_test_split

    from ..kahm import membership_auc, membership_inference_score

    report = progress or _noop
    priv = _privacy(epsilon, delta, value_range)
    if not isinstance(holdout_fraction, (int, float)) or not 0.05 <= float(holdout_fraction) <= 0.95:
        raise InvalidInputError(f"holdout_fraction must be in [0.05, 0.95]; got {holdout_fraction!r}.")
    n = _positive_int("n_components", n_components)
    L = min(5, n) if n_layers is None else _positive_int("n_layers", n_layers)
    if max_items is not None:
        _positive_int("max_items", max_items, 2)
    report("load", 0, 1)
    coll, items = _load(collection)
    report("load", 1, 1)
    X, y = items["features"], items["label"]
    def split(idx, labels, **kw):
        try:
            return train_test_split(idx, stratify=labels, random_state=split_seed, **kw)
        except ValueError as exc:  # e.g. fewer sample rows than classes
            raise InvalidInputError(f"cannot split the audit sample by class ({exc}); raise max_items or "
                                    "change holdout_fraction.") from None

    if max_items is not None and X.shape[0] > max_items:
        keep, _ = split(np.arange(X.shape[0]), y, train_size=int(max_items))
        X, y = X[keep], y[keep]
    classes, counts = np.unique(y, return_counts=True)
    need = int(np.ceil((n + 1) / (1.0 - float(holdout_fraction)))) + 2
    if counts.min() < need:
        c = int(classes[np.argmin(counts)])
        raise InvalidInputError(f"class {c} has {int(counts.min())} item(s) in the audit sample; with n_components={n} "
                                f"and holdout_fraction={holdout_fraction} each class needs at least {need}. Lower "
                                "n_components or raise max_items.")
    tr, ho = split(np.arange(X.shape[0]), y, test_size=float(holdout_fraction))
    Xc = np.clip(X, *priv["value_range"])
    out: dict[str, Any] = {"n_train": int(tr.size), "n_holdout": int(ho.size)}
    t0 = time.perf_counter()
    for i, kind in enumerate(KINDS):
        report("fit", i, len(KINDS))
        model = _make_model(kind, priv, n, L, int(branch_size), smoothing_steps if kind ==
                            "fabricated" else None, noise_seed, n_jobs)
        model.fit((X if kind == "raw" else Xc)[tr], y[tr])
        r_tr = model.min_distance(X[tr])
        r_ho = model.min_distance(X[ho])
        tag = {"raw": "raw", "noisy": "noisy", "fabricated": "fab"}[kind]
        fin = np.isfinite(r_tr).all() and np.isfinite(r_ho).all()
        out[f"mis_{tag}"] = membership_inference_score(r_tr, r_ho) if fin else None
        out[f"auc_{tag}"] = membership_auc(np.nan_to_num(r_tr, posinf=1e300), np.nan_to_num(r_ho, posinf=1e300))
        out[f"accuracy_{tag}"] = float(np.mean(model.predict(X[ho]) == y[ho]))
    report("fit", len(KINDS), len(KINDS))
    for base in ("raw", "noisy"):
        a, b = out.get(f"mis_{base}"), out.get("mis_fab")
        out[f"mis_reduction{'' if base == 'raw' else '_vs_noisy'}"] = (1.0 - b / a) if a and b is not None else None
    out["seconds"] = round(time.perf_counter() - t0, 3)
    params = {**priv, "holdout_fraction": float(holdout_fraction), "max_items": max_items, "n_components": n,
              "n_layers": L, "branch_size": int(branch_size), "smoothing_steps": smoothing_steps,
              "split_seed": int(split_seed),
              "noise": "cryptographically seeded" if noise_seed is None else "fixed test seed (NOT private)"}
    _json_safe(out, "audit report")
    from psycopg.types.json import Jsonb

    with _transaction() as conn:
        c2 = _collection_row(conn, collection)
        aid = conn.execute("INSERT INTO pm_vector.kahm_audits (collection_id, params, report) VALUES (%s, %s, %s) "
                           "RETURNING id", [c2["id"], Jsonb(params), Jsonb(out)]).fetchone()[0]
    return {"audit_id": int(aid), "collection": collection, "params": params, **out}


def list_audits(collection: str | None = None) -> list[dict[str, Any]]:
    """Stored audit reports (newest first), from the ``pm_vector.pm_kahm_audits`` view."""
    from psycopg.rows import dict_row

    with connect() as conn:
        if collection is not None:
            _collection_row(conn, collection)
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT * FROM pm_vector.pm_kahm_audits WHERE (%s::text IS NULL OR collection = %s) "
                        "ORDER BY audit_id DESC", [collection, collection])
            rows = cur.fetchall()
    return [{k: _iso(v) for k, v in r.items()} for r in rows]
