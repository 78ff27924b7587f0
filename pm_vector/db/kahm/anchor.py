"""The DP fabricated anchor of a collection (:func:`fabricate_anchor_set`), re-exported by
:mod:`pm_vector.db.kahm.roles`."""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

from ...errors import InvalidInputError
from ..errors import DatabaseError
from .store import (DEFAULT_SMOOTHING_STEPS, ProgressFn, class_counts_check, load_settled_items, noop, positive_int,
                    kahm_privacy, smoothing_record, checked_smoothing_steps, checked_value_range)
from ...kahm import FabricationWarning, fabricate_anchor
from ...kahm.plugin import UNITS, anchor_noise
from ..store.anchors import register_anchor_sets

__all__ = ["fabricate_anchor_set"]


def _anchor_privacy(epsilon, delta, unit, clip_norm, value_range, grid, p: int) -> dict[str, Any]:
    """The privacy record of a fabricated anchor, per-item figures first."""
    if unit not in UNITS:
        raise InvalidInputError(f"unit must be one of {UNITS}; got {unit!r}.")
    if unit == "element":
        priv = kahm_privacy(epsilon, delta, value_range)
        mech = anchor_noise(epsilon, delta=delta, unit="element", sensitivity=priv["sensitivity"], grid=grid)
        rec = mech.record(p)
        return {"per_item_epsilon": rec["row_epsilon"], "per_item_delta": rec["row_delta"], **priv, **rec,
                "unit": "element", "value_range": priv["value_range"],
                "outside_guarantee": "labels, per-class counts and which items were sampled (public seed over item "
                                     "ids); per item only the composed row_epsilon holds"}
    vr = None if value_range is None else list(checked_value_range(value_range))
    mech = anchor_noise(epsilon, delta=delta, unit="row", clip_norm=clip_norm, grid=grid)
    rec = mech.record(p)
    return {"per_item_epsilon": rec["epsilon"], "per_item_delta": rec["delta"], **rec,
            "unit_note": "one item's whole feature row (replaced by any other row)", "value_range": vr,
            "outside_guarantee": "labels, per-class counts and which items were sampled (public seed over item ids)"}


def _source_size(source_per_class: int | None, per: int, n: int, p: int) -> int:
    """The source rows drawn per class (default: the anchor and dummy rows of a class), refused when
    too few for the rows asked or for ``n`` components, or ``n`` above the ``p`` features."""
    src = per if source_per_class is None else positive_int("source_per_class", source_per_class)
    if src < per:
        raise InvalidInputError(f"source_per_class={src} is below anchors_per_class + dummies_per_class = {per}.")
    if n >= src:
        raise InvalidInputError(f"n_components={n} needs at least n+1 = {n + 1} source rows per class; got {src}.")
    if n > p:
        raise InvalidInputError(f"n_components={n} exceeds the collection's {p} features.")
    return src


def _fabricate_rows(X: np.ndarray, y: np.ndarray, prov: dict, *, n: int, noise_seed, unit: str, src: int,
                    max_smoothing_steps: int, steps, n_jobs: int) -> tuple:
    """The DP release and KAHM fabrication of the source rows (:func:`pm_vector.kahm.fabricate_anchor`
    with the calibration ``prov``); returns (the fabricated rows, their labels, the fabrication
    warnings caught)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FabricationWarning)
        Xf, yf = fabricate_anchor(X, y, prov["epsilon"], n=n, seed=noise_seed, delta=prov["delta"], unit=unit,
                                  clip_norm=prov.get("clip_norm", 1.0), sensitivity=prov.get("sensitivity", 1.0),
                                  grid=prov["grid"], branch_size=max(src, 1000),
                                  max_smoothing_steps=max_smoothing_steps, smoothing_steps=steps, n_jobs=n_jobs)
    return Xf, yf, caught


def _unit_rows(Xf: np.ndarray) -> np.ndarray:
    """The fabricated rows normalised to unit norm, refused when one is not finite or zero."""
    if not np.all(np.isfinite(Xf)):
        raise DatabaseError("the fabricated anchor has non-finite rows (the KAHM image is undefined for this "
                            "data); rescale the features or raise epsilon. Nothing was registered.")
    # the protocol's public anchor has unit-norm rows (PrivateMail's sensitivity bound assumes it):
    # normalising is post-processing of the DP release
    norms = np.linalg.norm(Xf, axis=1)
    if np.any(norms < 1e-12):
        raise DatabaseError("a fabricated anchor row is zero and cannot be normalised; raise epsilon or the "
                            "per-class sizes. Nothing was registered.")
    return Xf / norms[:, None]


def _anchor_and_dummy_rows(yf: np.ndarray, classes, rng, a: int, per: int) -> tuple[np.ndarray, np.ndarray]:
    """Per class, ``per`` of its fabricated rows in a random order (public seed): the first ``a`` for
    the anchor, the rest for the dummy pool. Returns (anchor positions, dummy positions)."""
    anchor_rows, dummy_rows = [], []
    for c in classes:
        idx = np.flatnonzero(yf == c)
        idx = idx[rng.permutation(idx.size)]
        anchor_rows.append(idx[:a])
        dummy_rows.append(idx[a:per])
    return np.concatenate(anchor_rows), np.concatenate(dummy_rows)


def _provenance(prov: dict, steps, *, n: int, a: int, dmy: int, src: int, n_source: int, classes, sample_seed: int,
                noise_seed) -> dict:
    """The fabricated set's provenance: the release's calibration ``prov``, then how the rows were
    fabricated and post-processed, the sizes and the seeds."""
    return {
        **prov,
        "fabrication": "KAHM fabricated data (Definitions 13-14, Remark 4) of the noisy rows",
        "post_processing": "k-means, smoothing and KAHM images of the noisy rows; rows normalised to unit norm "
                           "(the protocol's anchor rows must be unit-norm)",
        "smoothing": smoothing_record(steps),
        "n_components": n, "anchors_per_class": a, "dummies_per_class": dmy, "source_per_class": src,
        "source_items": n_source,
        "classes": classes.tolist(), "sample_seed": int(sample_seed),
        "noise_seed": "cryptographically seeded" if noise_seed is None else "fixed test seed (NOT private)",
    }


def fabricate_anchor_set(collection: str, epsilon: float, *, unit: str = "row", clip_norm: float = 1.0,
                         value_range=None, delta: float = 1e-5, grid: float | None = None,
                         anchors_per_class: int = 100, dummies_per_class: int = 20,
                         source_per_class: int | None = None, n_components: int = 20,
                         smoothing_steps: int | None = DEFAULT_SMOOTHING_STEPS, max_smoothing_steps: int = 200,
                         sample_seed: int = 0, noise_seed: int | None = None, description: str | None = None,
                         n_jobs: int = -1, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Fabricate a differentially private anchor set and dummy pool from the collection's items
    and register them (one transaction) as its current anchor and dummy sets.

    Per class, ``source_per_class`` items (default ``anchors_per_class + dummies_per_class``)
    are drawn with the public ``sample_seed`` (every class must have that many: the sizes are
    then public constants) and released once:

    - ``unit="row"`` (default): each item row is clipped to the public L2 norm ``clip_norm``
      (after clipping elements to ``value_range`` if one is given) and gets discrete Gaussian
      noise calibrated to the whole row: ``(epsilon, delta)`` **per item**.
    - ``unit="element"``: Result 1 per element of the rows clipped to the public ``value_range``
      (required; sensitivity ``hi - lo``): an item of ``p`` features costs ``p x epsilon``.

    Every noisy value lies on a public grid (floating-point safe, :mod:`pm_vector.kahm.grid`).
    The noisy rows are smoothed for ``smoothing_steps`` (public, default 5) and fabricated
    (Definitions 13-14): a function of the noisy rows only. ``smoothing_steps=None`` runs the
    paper's stopping rule, whose threshold comes from the original rows (outside the guarantee).
    Of each class's fabricated rows, ``anchors_per_class + dummies_per_class`` are drawn (public
    seed), normalised to unit norm and split into anchor and dummy rows -- post-processing.
    ``noise_seed=None`` draws the noise from a cryptographically seeded generator (an int is for
    tests only).

    The next embedding job (``pm-vector embed``) builds its frame on this anchor, and clients
    download it as the public anchor. Returns ``{"anchor": {...}, "dummy": {...}, "provenance": {...},
    "seconds": ...}``; the provenance leads with ``per_item_epsilon``.
    """
    report = progress or noop
    a = positive_int("anchors_per_class", anchors_per_class)
    dmy = positive_int("dummies_per_class", dummies_per_class, 0)
    n = positive_int("n_components", n_components)
    steps = checked_smoothing_steps(smoothing_steps)
    if description is not None and not isinstance(description, str):
        raise InvalidInputError("description must be a string.")
    t0 = time.perf_counter()
    report("load", 0, 1)
    coll, items = load_settled_items(collection)
    report("load", 1, 1)
    p = int(coll["feature_dim"])
    prov = _anchor_privacy(epsilon, delta, unit, clip_norm, value_range, grid, p)
    per = a + dmy
    src = _source_size(source_per_class, per, n, p)
    classes = class_counts_check(coll, items["label"], src, "fabricating the anchor")
    rng = np.random.default_rng(sample_seed)  # public bookkeeping, not a privacy mechanism
    pick = np.concatenate([rng.choice(np.flatnonzero(items["label"] == c), src, replace=False) for c in classes])
    X = items["features"][pick]
    if prov["value_range"] is not None:
        X = np.clip(X, *prov["value_range"])
    y = items["label"][pick]
    report("fabricate", 0, 1)
    Xf, yf, caught = _fabricate_rows(X, y, prov, n=n, noise_seed=noise_seed, unit=unit, src=src,
                                     max_smoothing_steps=max_smoothing_steps, steps=steps, n_jobs=n_jobs)
    report("fabricate", 1, 1)
    Xf = _unit_rows(Xf)
    ia, idm = _anchor_and_dummy_rows(yf, classes, rng, a, per)
    prov = _provenance(prov, steps, n=n, a=a, dmy=dmy, src=src, n_source=int(pick.size), classes=classes,
                       sample_seed=sample_seed, noise_seed=noise_seed)
    desc = description or (f"DP fabricated anchor (KAHM, epsilon={prov['per_item_epsilon']:g} per item, "
                           f"unit {unit})")

    report("register", 0, 1)
    sets = [("anchor", Xf[ia], yf[ia], desc, prov)]
    if dmy:
        sets.append(("dummy", Xf[idm], yf[idm], desc.replace("anchor", "dummy pool"), prov))
    out = register_anchor_sets(collection, sets)
    report("register", 1, 1)
    res = {"anchor": out[0], "dummy": out[1] if dmy else None, "provenance": prov,
           "seconds": round(time.perf_counter() - t0, 3)}
    if steps is None:  # only on the opted-in stopping rule; texts carry no number, nothing is stored
        res["warnings"] = [str(w.message) for w in caught][:10]
    return res


