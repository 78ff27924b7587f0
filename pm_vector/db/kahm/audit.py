"""Membership-inference audit of a collection's KAHM models (:func:`run_membership_audit`).

The audit repeats over ``n_repeats`` stratified splits, each with a fresh noise draw, and
reports per model kind: the attack AUC (mean, min, max over repeats), the true-positive rate of
the threshold attack at false-positive rates 1 % and 0.1 % pooled over repeats with
Clopper-Pearson 95 % intervals, the membership-inference score of eq 69 on scale-free
distances (each model's distances in units of its median held-out distance, so scores of
different models can be compared), and the held-out accuracy.

By default it audits the configuration that is deployed: the collection's current model (its
kind, sizes, epsilon, value range, noise and smoothing steps), beside a raw model as the
baseline. Given ``epsilon`` and ``value_range`` it audits the three kinds at that configuration.

The report is itself computed from the raw items: it is for the data owner, not for publication
(its stored privacy record says so).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from ...errors import InvalidInputError
from ..core.collection import collection_row, iso_datetime
from ..store._validate import json_safe
from ..postgres import connect
from .store import (DEFAULT_SMOOTHING_STEPS, KINDS, ProgressFn, checked_smoothing_steps, job_transaction, kahm_privacy,
                    load_settled_items, make_model, model_row, noop, positive_int, smoothing_record)
from ...kahm.membership import clopper_pearson, membership_auc, membership_inference_score, scale_free, tpr_at_fpr

__all__ = ["run_membership_audit", "list_audits", "FPRS"]

#: false-positive rates at which the attack's true-positive rate is reported
FPRS = (0.01, 0.001)
_TAG = {"raw": "raw", "noisy": "noisy", "fabricated": "fab"}


def _deployed(collection: str) -> tuple[dict, dict | None, list[str]]:
    """The current model's configuration: (params, privacy of the private kind or None, kinds)."""
    with connect() as conn:
        coll = collection_row(conn, collection)
        row = model_row(conn, coll, None)
        conn.rollback()
    params, priv = dict(row["params"] or {}), row["privacy"] or {}
    kind = row["kind"]
    cfg = {"model_id": int(row["id"]), "kind": kind, "n_components": int(params.get("n_components", 20)),
           "n_layers": params.get("n_layers"), "branch_size": int(params.get("branch_size", 1000)),
           "smoothing_steps": params.get("smoothing_steps", DEFAULT_SMOOTHING_STEPS)}
    if kind == "raw":
        return cfg, None, ["raw"]
    dp = kahm_privacy(priv["epsilon"], priv["delta"], priv["value_range"], priv.get("noise", "grid"))
    return cfg, dp, ["raw", kind]


def _split(idx, labels, seed, **kw):
    from sklearn.model_selection import train_test_split

    try:
        return train_test_split(idx, stratify=labels, random_state=seed, **kw)
    except ValueError as exc:  # e.g. fewer sample rows than classes
        raise InvalidInputError(f"cannot split the audit sample by class ({exc}); raise max_items or "
                                "change holdout_fraction.") from None


def _audit_configuration(collection: str, epsilon, value_range, delta, noise, n_components, n_layers, branch_size,
                         smoothing_steps) -> tuple:
    """What is audited: the deployed model's configuration (``epsilon=None``), or the raw, noisy and
    fabricated models at ``epsilon`` with the sizes given. Returns (the privacy calibration or None,
    the kinds, n_components, layers, branch size, smoothing steps, the configuration record)."""
    if epsilon is None:
        if value_range is not None:
            raise InvalidInputError("value_range goes with epsilon; without epsilon the deployed model's is audited.")
        cfg, priv, kinds = _deployed(collection)
        n, bs, steps = cfg["n_components"], cfg["branch_size"], cfg["smoothing_steps"]
        L = min(5, n) if cfg["n_layers"] is None else int(cfg["n_layers"])
        configuration = {"source": "deployed", "model_id": cfg["model_id"], "kind": cfg["kind"]}
    else:
        priv = kahm_privacy(epsilon, delta, value_range, noise)
        kinds = list(KINDS)
        n = positive_int("n_components", n_components)
        L = min(5, n) if n_layers is None else positive_int("n_layers", n_layers)
        bs = positive_int("branch_size", branch_size)
        steps = checked_smoothing_steps(smoothing_steps)
        configuration = {"source": "given"}
    return priv, kinds, n, L, bs, steps, configuration


def _score(st: dict[str, list], model, X: np.ndarray, y: np.ndarray, tr: np.ndarray, ho: np.ndarray) -> None:
    """One fitted model's membership scores on its training and held-out items, appended to ``st``:
    AUC, MIS (scale-free; None when a distance is not finite), accuracy, and TPR at each FPR."""
    d_tr = np.asarray(model.min_distance(X[tr]), dtype=np.float64)  # float32 models: 1e300 must fit
    d_ho = np.asarray(model.min_distance(X[ho]), dtype=np.float64)
    st["auc"].append(membership_auc(np.nan_to_num(d_tr, nan=np.inf, posinf=1e300),
                                    np.nan_to_num(d_ho, nan=np.inf, posinf=1e300)))
    fin = np.isfinite(d_tr).all() and np.isfinite(d_ho).all()
    st["mis"].append(membership_inference_score(*scale_free(d_tr, d_ho)) if fin else None)
    st["acc"].append(float(np.mean(model.predict(X[ho]) == y[ho])))
    d_tr, d_ho = np.nan_to_num(d_tr, nan=np.inf), np.nan_to_num(d_ho, nan=np.inf)
    st["tp"].append([tpr_at_fpr(d_tr, d_ho, f)[:2] for f in FPRS])
    st["fp"].append([tpr_at_fpr(d_tr, d_ho, f)[2:] for f in FPRS])


def _summarise_kinds(out: dict[str, Any], per: dict, kinds: list) -> None:
    """Per kind, over the repeats: mean AUC (and range), MIS, accuracy, TPR at each FPR with its
    Clopper-Pearson interval; and how much fabrication reduces MIS."""
    for kind, st in per.items():
        tag = _TAG[kind]
        mis = [m for m in st["mis"] if m is not None]
        out[f"auc_{tag}"] = float(np.mean(st["auc"]))
        out[f"auc_{tag}_range"] = [float(np.min(st["auc"])), float(np.max(st["auc"]))]
        out[f"mis_{tag}"] = float(np.mean(mis)) if mis else None
        out[f"accuracy_{tag}"] = float(np.mean(st["acc"]))
        for i, f in enumerate(FPRS):
            k = sum(t[i][0] for t in st["tp"])
            m = sum(t[i][1] for t in st["tp"])
            fp = sum(t[i][0] for t in st["fp"])
            nh = sum(t[i][1] for t in st["fp"])
            lo, hi = clopper_pearson(k, m)
            out[f"tpr_at_fpr_{f:g}_{tag}"] = {"tpr": k / m, "ci95": [lo, hi], "true_positives": k, "members": m,
                                              "false_positives": fp, "non_members": nh}
    if "fab" in (_TAG[k] for k in kinds) and out.get("mis_raw") and out.get("mis_fab") is not None:
        out["mis_reduction"] = 1.0 - out["mis_fab"] / out["mis_raw"]  # both scale-free: same unit
        if out.get("mis_noisy"):
            out["mis_reduction_vs_noisy"] = 1.0 - out["mis_fab"] / out["mis_noisy"]


def run_membership_audit(collection: str, epsilon: float | None = None, *, value_range=None, delta: float = 1e-5,
                         n_repeats: int = 3, holdout_fraction: float = 0.3, max_items: int | None = 5000,
                         n_components: int = 20, n_layers: int | None = None, branch_size: int = 1000,
                         smoothing_steps: int | None = DEFAULT_SMOOTHING_STEPS, noise: str = "grid",
                         split_seed: int = 0, noise_seed: int | None = None, n_jobs: int = -1,
                         progress: ProgressFn | None = None) -> dict[str, Any]:
    """Membership-inference audit (see the module docstring); stored in ``pm_vector.kahm_audits``.

    ``epsilon=None``: the deployed configuration (the collection's current model; the size
    arguments are then taken from it). Otherwise raw, noisy and fabricated models at ``epsilon``
    (per element, public ``value_range``). ``n_repeats`` splits (public seeds ``split_seed + i``)
    each with its own noise draw. Returns the report with ``audit_id``.
    """
    report = progress or noop
    reps = positive_int("n_repeats", n_repeats)
    if isinstance(holdout_fraction, bool) or not isinstance(holdout_fraction, (int, float)) \
            or not 0.05 <= float(holdout_fraction) <= 0.95:
        raise InvalidInputError(f"holdout_fraction must be in [0.05, 0.95]; got {holdout_fraction!r}.")
    if max_items is not None:
        positive_int("max_items", max_items, 2)
    priv, kinds, n, L, bs, steps, configuration = _audit_configuration(
        collection, epsilon, value_range, delta, noise, n_components, n_layers, branch_size, smoothing_steps)
    report("load", 0, 1)
    coll, items = load_settled_items(collection)
    report("load", 1, 1)
    X, y = items["features"], items["label"]
    if max_items is not None and X.shape[0] > max_items:
        keep, _ = _split(np.arange(X.shape[0]), y, split_seed, train_size=int(max_items))
        X, y = X[keep], y[keep]
    classes, counts = np.unique(y, return_counts=True)
    need = int(np.ceil((n + 1) / (1.0 - float(holdout_fraction)))) + 2
    if counts.min() < need:
        c = int(classes[np.argmin(counts)])
        raise InvalidInputError(f"class {c} has {int(counts.min())} item(s) in the audit sample; with n_components={n} "
                                f"and holdout_fraction={holdout_fraction} each class needs at least {need}. Lower "
                                "n_components or raise max_items.")
    Xc = X if priv is None else np.clip(X, *priv["value_range"])
    per: dict[str, dict[str, list]] = {k: {"auc": [], "mis": [], "acc": [], "tp": [], "fp": []} for k in kinds}
    t0 = time.perf_counter()
    total = reps * len(kinds)
    for r in range(reps):
        tr, ho = _split(np.arange(X.shape[0]), y, split_seed + r, test_size=float(holdout_fraction))
        for j, kind in enumerate(kinds):
            report("fit", r * len(kinds) + j, total)
            seed = None if noise_seed is None else int(noise_seed) + r  # a fresh noise draw per repeat
            model = make_model(kind, priv, n, L, bs, steps if kind == "fabricated" else None, seed, n_jobs)
            model.fit((X if kind == "raw" else Xc)[tr], y[tr])
            _score(per[kind], model, X, y, tr, ho)
    report("fit", total, total)
    out: dict[str, Any] = {"n_train": int(tr.size), "n_holdout": int(ho.size), "n_repeats": reps,
                           "kinds": kinds, "configuration": configuration}
    _summarise_kinds(out, per, kinds)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    params = {"holdout_fraction": float(holdout_fraction), "max_items": max_items, "n_components": n,
              "n_layers": L, "branch_size": bs, "smoothing_steps": steps, "split_seed": int(split_seed),
              "n_repeats": reps, "configuration": configuration,
              "noise_seed": "cryptographically seeded" if noise_seed is None else "fixed test seed (NOT private)"}
    if priv is not None:
        params.update(priv)
        params["smoothing"] = smoothing_record(steps)
    params["report_privacy"] = {
        "unit": "none", "outside_guarantee": "the report (AUC, TPR, MIS, accuracy) is computed from the raw items: "
                                             "it is for the data owner, not for publication"}
    json_safe(out, "audit report")

    with job_transaction() as conn:
        c2 = collection_row(conn, collection)
        aid = conn.execute("INSERT INTO pm_vector.kahm_audits (collection_id, params, report) VALUES (%s, %s, %s) "
                           "RETURNING id", [c2["id"], Jsonb(params), Jsonb(out)]).fetchone()[0]
    return {"audit_id": int(aid), "collection": collection, "params": params, **out}


def list_audits(collection: str | None = None) -> list[dict[str, Any]]:
    """Stored audit reports (newest first), from the ``pm_vector.pm_kahm_audits`` view."""
    with connect() as conn:
        if collection is not None:
            collection_row(conn, collection)
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT * FROM pm_vector.pm_kahm_audits WHERE (%s::text IS NULL OR collection = %s) "
                        "ORDER BY audit_id DESC", [collection, collection])
            rows = cur.fetchall()
    return [{k: iso_datetime(v) for k, v in r.items()} for r in rows]
