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
    run_membership_audit(collection, epsilon=None, ...) -> dict
        membership-inference audit of the deployed configuration (or of raw, noisy and fabricated
        models at a given epsilon), repeated over splits and noise draws, stored (audit.py)
    list_audits(collection=None) -> list

Privacy units. The fabricated anchor is row level by default: each item row is clipped to a
public L2 norm and perturbed as a whole, so ``epsilon`` is per item. The class models (and the
anchor with ``unit="element"``) use the KAHM paper's unit (Definition 10): one *element* of the
item feature matrix, clipped to the public ``value_range = (lo, hi)`` (``d = hi - lo``); a whole
item row of ``p`` features then costs up to ``p * epsilon``. All noise is released on a public
grid (:mod:`pm_vector.kahm.grid`), every fabricating job smooths for a fixed public number of
steps, and every stored privacy record states its unit and what lies outside the guarantee; no
value computed from the raw rows is stored in it. Distances of raw models are not served by
:func:`party_distances` unless the collection opts in.

Every job validates its input before it writes, computes everything in memory and writes in
one transaction at the end: a job that dies leaves nothing behind and the previous model or
anchor keeps serving.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from ...errors import InvalidInputError
from ..core.collection import collection_row, iso_datetime, load_items, worker_identity
from ..store._validate import checked_features
from ..postgres import connect, database_url
from ..errors import DatabaseError, DimensionMismatchError, NoKAHMModelError, RawKAHMDistancesNotAllowedError
from . import audit
from .anchor import fabricate_anchor_set
from .store import (DEFAULT_SMOOTHING_STEPS, KINDS, OUTSIDE_ELEMENT, SETTLED_ITEMS_SQL,  # noqa: F401
                    ProgressFn, checked_smoothing_steps, checked_value_range, class_counts_check,
                    job_transaction, kahm_privacy, kind_of, load_settled_items, make_model, model_bytes,
                    model_from_bytes, model_outputs_allowed, model_row, noop, positive_int, raw_distances_allowed,
                    smoothing_record)
from ...kahm import federated_predict, matching_scores

#: PostgreSQL's limit for one bytea value is 1 GB; keep a margin for the row
MAX_MODEL_BYTES = 1_000_000_000

__all__ = [
    "fabricate_anchor_set", "fit_kahm_models", "score_new_items", "list_kahm_models", "load_kahm_model",
    "class_scores", "party_distances", "federated_classify", "run_membership_audit", "list_audits",
    "NoKAHMModelError", "RawKAHMDistancesNotAllowedError", "raw_distances_allowed", "KINDS",
    "DEFAULT_SMOOTHING_STEPS",
]

# ----------------------------------------------------------------------------- class models

def _scores_of(model, X: np.ndarray, chunk: int = 20000) -> tuple[np.ndarray, np.ndarray]:
    """(scores (N, C) float32, predicted labels (N,)) of rows X under a fitted classifier."""
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


def _kind_privacy(kind: str, epsilon, delta: float, value_range, noise: str) -> dict | None:
    """The private kinds' calibration (they need ``epsilon``), None for the raw kind (which takes none)."""
    if kind != "raw":
        if epsilon is None:
            raise InvalidInputError(f"kind={kind!r} is differentially private: give epsilon (and value_range).")
        return kahm_privacy(epsilon, delta, value_range, noise)
    if epsilon is not None:
        raise InvalidInputError("epsilon is for the private kinds ('noisy', 'fabricated'); kind='raw' adds no noise.")
    return None


def _privacy_record(priv: dict | None, kind: str, p: int, noise_seed, smoothing_steps) -> dict:
    """The model's stored privacy record: the calibration with its row-level cost over ``p`` features
    and the noise seed's nature, or, for the raw kind, what lies outside any guarantee."""
    if priv is None:
        return {"unit": "none", "epsilon": None,
                "outside_guarantee": "everything: the raw model is fitted on the items as stored (no noise); its "
                                     "distances are not served over HTTP unless the collection opts in "
                                     "(settings['kahm']['raw_distances'])"}
    priv = {**priv, "noise_seed": "cryptographically seeded" if noise_seed is None else
            "fixed test seed (NOT private)", "row_epsilon": priv["epsilon"] * p,
            "row_delta": min(1.0, priv["delta"] * p)}
    if kind == "fabricated":
        priv["smoothing"] = smoothing_record(smoothing_steps)
        if smoothing_steps is None:
            priv["outside_guarantee"] += "; the stopping rule's threshold r (from the original rows)"
    return priv


def _write_model(collection: str, coll, kind: str, params: dict, priv: dict, model, items, blob: bytes,
                 timings: dict, pred, scores, keep: int) -> int:
    """In one transaction: the model row and every item's class scores, and the older models beyond
    ``keep`` deleted (refused if the collection was re-created meanwhile). Returns the model's id."""
    with job_transaction() as conn:
        c2 = collection_row(conn, collection, lock="FOR SHARE")
        if c2["id"] != coll["id"]:
            raise DatabaseError(f"collection {collection!r} was dropped and re-created while the job ran.")
        mid = conn.execute(
            "INSERT INTO pm_vector.kahm_models (collection_id, kind, params, privacy, classes, n_features, "
            "n_items, model, timings, worker) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
            [coll["id"], kind, Jsonb(params), Jsonb(priv),
             [int(c) for c in model.classes_], int(model.n_features_in_), int(items["id"].shape[0]), blob,
             Jsonb({k: round(v, 4) for k, v in timings.items()}), Jsonb(worker_identity())]).fetchone()[0]
        _write_scores(conn, mid, items["id"], pred, scores)
        conn.execute("DELETE FROM pm_vector.kahm_models WHERE collection_id = %s AND id < %s AND id NOT IN "
                     "(SELECT id FROM pm_vector.kahm_models WHERE collection_id = %s AND id < %s "
                     "ORDER BY id DESC LIMIT %s)", [coll["id"], mid, coll["id"], mid, keep])
    return mid


def fit_kahm_models(collection: str, *, kind: str = "raw", epsilon: float | None = None, delta: float = 1e-5,
                    value_range=None, n_components: int = 20, n_layers: int | None = None, branch_size: int = 1000,
                    smoothing_steps: int | None = DEFAULT_SMOOTHING_STEPS, noise: str = "grid",
                    noise_seed: int | None = None, keep_previous: int = 1,
                    dtype: str = "float32", n_jobs: int = -1, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Fit one wide KAHM per class on the collection's items, score every item, store both.

    ``kind``: ``"raw"`` (Definition 7 on the items as stored), ``"noisy"`` (Definition 12) or
    ``"fabricated"`` (Definition 15); the private kinds need ``epsilon`` and the public
    ``value_range`` (features clipped to it; sensitivity ``hi - lo``); their noise is released on a
    public grid (``noise="continuous"``: the paper's float construction, reproduction only) and
    ``kind="fabricated"`` smooths for ``smoothing_steps`` (public, default 5; ``None`` = the
    paper's stopping rule, outside the guarantee; ignored by the other kinds). The model and the
    class-matching scores (Definition 8) of every item are written in one transaction and the
    model becomes the collection's current one (``keep_previous`` older models are kept, the
    rest deleted). Returns the model's row (:func:`list_kahm_models` shape) plus ``timings``.

    ``dtype``: precision of the stored model. float32 by default: a wide KAHM keeps an
    ``N_s x p`` matrix per branch and layer (about 160 MB per 10,000 items of 784 features in
    float32), and class scores agree with float64 to about 1e-5. A model above PostgreSQL's
    1 GB value limit is refused before anything is written (the message says what to lower).
    """
    report = progress or noop
    if kind not in KINDS:
        raise InvalidInputError(f"kind must be one of {KINDS}; got {kind!r}.")
    priv = _kind_privacy(kind, epsilon, delta, value_range, noise)
    n = positive_int("n_components", n_components)
    L = min(5, n) if n_layers is None else positive_int("n_layers", n_layers)  # default: 5 layers, at most n
    bs = positive_int("branch_size", branch_size)
    keep = positive_int("keep_previous", keep_previous, 0)
    smoothing_steps = checked_smoothing_steps(smoothing_steps) if kind == "fabricated" else None
    timings: dict[str, float] = {}
    t = time.perf_counter()
    report("load", 0, 1)
    coll, items = load_settled_items(collection)
    report("load", 1, 1)
    timings["load_s"] = time.perf_counter() - t
    if n > coll["feature_dim"]:
        raise InvalidInputError(f"n_components={n} exceeds the collection's {coll['feature_dim']} features (n <= p).")
    class_counts_check(coll, items["label"], n + 1, f"a KAHM with n_components={n}")
    X = items["features"] if priv is None else np.clip(items["features"], *priv["value_range"])
    t = time.perf_counter()
    report("fit", 0, 1)
    if dtype not in ("float32", "float64"):
        raise InvalidInputError(f"dtype must be 'float32' or 'float64'; got {dtype!r}.")
    model = make_model(kind, priv, n, L, bs, smoothing_steps, noise_seed, n_jobs, dtype)
    model.fit(X, items["label"])
    report("fit", 1, 1)
    timings["fit_s"] = time.perf_counter() - t
    t = time.perf_counter()
    report("score", 0, items["id"].shape[0])
    scores, pred = _scores_of(model, items["features"])
    report("score", items["id"].shape[0], items["id"].shape[0])
    timings["score_s"] = time.perf_counter() - t
    blob = model_bytes(model)
    if len(blob) >= MAX_MODEL_BYTES:
        raise InvalidInputError(
            f"the fitted model takes {len(blob) / 1e6:.0f} MB, above PostgreSQL's 1 GB limit for one value; lower "
            f"n_layers (now {L}) or use dtype='float32', or fit on a sample of the items. Nothing was written.")
    params = {"n_components": n, "n_layers": L, "branch_size": bs, "dtype": dtype}
    if kind == "fabricated":
        params["smoothing_steps"] = smoothing_steps
    priv = _privacy_record(priv, kind, int(coll["feature_dim"]), noise_seed, smoothing_steps)
    t = time.perf_counter()
    report("write", 0, 1)
    mid = _write_model(collection, coll, kind, params, priv, model, items, blob, timings, pred, scores, keep)
    report("write", 1, 1)
    timings["write_s"] = time.perf_counter() - t
    model.model_id_ = int(mid)  # as load_kahm_model() sets it: the cached model must carry its id too
    _cache_put(coll, mid, model)
    out = list_kahm_models(collection, model_id=mid)[0]
    out["timings"] = {k: round(v, 3) for k, v in timings.items()}
    if kind == "raw":  # an aggregate over the raw items: not returned for the private kinds
        out["training_accuracy"] = float(np.mean(pred == items["label"]))
    return out


_models: dict[tuple, Any] = {}
_models_lock = threading.Lock()


def _cache_key(coll, model_id):
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
        coll = collection_row(conn, collection)
        row = model_row(conn, coll, model_id)
        key = _cache_key(coll, row["id"])
        with _models_lock:
            hit = _models.get(key)
        if hit is not None:
            conn.rollback()
            return hit
        blob = conn.execute("SELECT model FROM pm_vector.kahm_models WHERE id = %s", [row["id"]]).fetchone()[0]
        conn.rollback()
    model = model_from_bytes(bytes(blob))
    model.model_id_ = int(row["id"])
    _cache_put(coll, row["id"], model)
    return model


def list_kahm_models(collection: str | None = None, *, model_id: int | None = None) -> list[dict[str, Any]]:
    """Stored models (newest first), from the ``pm_vector.pm_kahm_models`` view."""
    with connect() as conn:
        if collection is not None:
            collection_row(conn, collection)
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT * FROM pm_vector.pm_kahm_models WHERE (%s::text IS NULL OR collection = %s) "
                        "AND (%s::bigint IS NULL OR model_id = %s) ORDER BY model_id DESC",
                        [collection, collection, model_id, model_id])
            rows = cur.fetchall()
    return [{k: iso_datetime(v) for k, v in r.items()} for r in rows]


def score_new_items(collection: str, model_id: int | None = None) -> dict[str, Any]:
    """Score the items that have no scores under the current model (ingested after it was fitted).
    One transaction; returns ``{"model_id", "scored"}``."""
    model = load_kahm_model(collection, model_id)
    mid = int(model.model_id_)
    with connect() as conn:
        coll = collection_row(conn, collection)
        items = load_items(conn, coll, sql.SQL("{} AND NOT EXISTS (SELECT 1 FROM pm_vector.kahm_item_scores s "
                                               "WHERE s.model_id = {} AND s.item_id = i.id)").format(
                                                   sql.SQL(SETTLED_ITEMS_SQL), sql.Literal(mid)))
        conn.rollback()
    if items["id"].shape[0] == 0:
        return {"model_id": mid, "scored": 0}
    scores, pred = _scores_of(model, np.asarray(items["features"], dtype=np.float64))
    with job_transaction() as conn:
        # the model must still exist when the scores land (a concurrent fit may prune it)
        if conn.execute("SELECT 1 FROM pm_vector.kahm_models WHERE id = %s FOR SHARE", [int(mid)]).fetchone() is None:
            raise NoKAHMModelError(f"KAHM model {int(mid)} of collection {collection!r} was replaced and pruned "
                                   "meanwhile; run score_new_items again.")
        _write_scores(conn, int(mid), items["id"], pred, scores)
    return {"model_id": int(mid), "scored": int(items["id"].shape[0])}


def _query_rows(features, coll) -> np.ndarray:
    return np.asarray(checked_features(features, coll, "features"), dtype=np.float64)


def class_scores(collection: str, features, model_id: int | None = None) -> dict[str, Any]:
    """The collection's current model on feature rows: ``{"model_id", "classes", "scores" (Q, C),
    "distances" (Q, C), "predicted" (Q,)}`` (Definitions 6-8)."""
    with connect() as conn:
        coll = collection_row(conn, collection)
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
        coll = collection_row(conn, collection)
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
    if not model_outputs_allowed(coll, kind_of(model)):
        raise RawKAHMDistancesNotAllowedError(
            f"KAHM model {int(model.model_id_)} of collection {collection!r} is raw (fitted on the items as stored): "
            "its distances tell members from non-members. Fit a private model (`pm-vector kahm fit "
            f"{collection} --kind fabricated --epsilon ... --value-range ...`), or opt in with the collection "
            "setting settings['kahm']['raw_distances'] = true.")
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
    if isinstance(parties, (str, bytes)) or not isinstance(parties, Sequence) or len(parties) == 0:
        raise InvalidInputError("parties must be a non-empty list of collection names or callables.")
    Q = np.asarray(features, dtype=np.float64)
    if Q.ndim == 1:
        Q = Q[None, :]
    dims = {}
    for p in parties:  # dimensions first: a mismatch is refused before any party is asked
        if isinstance(p, str):
            with connect() as conn:
                dims[p] = int(collection_row(conn, p)["feature_dim"])
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

def run_membership_audit(collection: str, epsilon: float | None = None, **kwargs) -> dict[str, Any]:
    """See :func:`pm_vector.db.kahm.audit.run_membership_audit` (repeated splits and noise draws,
    TPR at FPR 1 % / 0.1 % with Clopper-Pearson intervals, the deployed configuration by default)."""
    return audit.run_membership_audit(collection, epsilon, **kwargs)


def list_audits(collection: str | None = None) -> list[dict[str, Any]]:
    """Stored audit reports (newest first), from the ``pm_vector.pm_kahm_audits`` view."""
    return audit.list_audits(collection)
