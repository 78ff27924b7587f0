"""Federated KAHM classification (Section 5.3, eqs 101-104, Remark 5).

Each party ``q`` fits its own KAHM based classifier on its local (typically fabricated) data and
answers a query ``y`` with its distance values ``Gamma_{W_{Y^q_c}}(y)`` -- one per class it
holds. The global classifier (eq 104) needs nothing else:

    GC(y) = argmin_c ( min_q Gamma_{W_{Y^q_c}}(y) ),

with ``Gamma = inf`` for a class that party ``q`` does not hold (Remark 5). The global KAHM of
eqs 101-102 outputs the image of the party whose KAHM is closest to ``y``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .._validation import as_matrix
from ..errors import InvalidInputError

__all__ = ["party_distances", "global_class_distances", "federated_predict", "global_kahm_image"]


def party_distances(model, Q) -> dict[int, np.ndarray]:
    """What one party sends for queries ``Q``: ``{class label: distance per query row}``."""
    D = model.class_distances(Q)
    return {int(c): D[:, i] for i, c in enumerate(model.classes_)}


def _n_features(model):
    return getattr(model, "n_features_in_", None)


def global_class_distances(parties, Q=None, *, classes=None) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, D)`` with ``D[:, c] = min_q Gamma_{W_{Y^q_c}}`` (eq 104 inner minimum).

    ``parties``: a list whose items are fitted KAHM classifiers (queried with ``Q``) or mappings
    ``{class: distances}`` already computed by the parties. ``classes``: the global label set
    (default: union over parties); a class no party holds gets ``inf`` everywhere (Remark 5).
    """
    parties = list(parties)
    if not parties:
        raise InvalidInputError("federated prediction needs at least one party.")
    Qm = None
    if Q is not None:
        Qm = as_matrix(Q, "Q")
    dims = {}
    for qi, party in enumerate(parties):
        if not isinstance(party, Mapping):
            nf = _n_features(party)
            if nf is None or not hasattr(party, "class_distances"):
                raise InvalidInputError(f"party {qi} is neither a fitted KAHM classifier nor a mapping "
                                        f"{{class: distances}}.")
            dims[qi] = int(nf)
    if len(set(dims.values())) > 1:
        items = sorted(dims.items())
        q0, d0 = items[0]
        q1, d1 = next((k, v) for k, v in items if v != d0)
        raise InvalidInputError(f"parties disagree on the data dimension: party {q0} was fitted on {d0} features, "
                                f"party {q1} on {d1}. Every party must model the same feature space.")
    if dims:
        if Qm is None:
            raise InvalidInputError("queries Q are needed to ask the party models for their distances.")
        d = next(iter(dims.values()))
        if Qm.shape[1] != d:
            raise InvalidInputError(f"queries have {Qm.shape[1]} features but the parties were fitted on {d}.")
    per_party = []
    n_rows = None if Qm is None else Qm.shape[0]
    for qi, party in enumerate(parties):
        dist = dict(party) if isinstance(party, Mapping) else party_distances(party, Qm)
        for c, v in dist.items():
            v = np.asarray(v, dtype=np.float64).ravel()
            if n_rows is None:
                n_rows = v.shape[0]
            if v.shape[0] != n_rows:
                raise InvalidInputError(f"party {qi} sent {v.shape[0]} distances for class {c}; expected {n_rows} "
                                        f"(one per query row).")
            if np.any(np.isnan(v)) or np.any(v < 0):
                raise InvalidInputError(f"party {qi} sent invalid distances for class {c} (NaN or negative).")
            dist[c] = v
        per_party.append({int(c): v for c, v in dist.items()})
    cls = np.unique(np.concatenate([np.fromiter(d.keys(), dtype=np.int64, count=len(d)) for d in per_party]))
    if classes is not None:
        cls = np.unique(np.asarray(classes, dtype=np.int64))
    D = np.full((n_rows, cls.shape[0]), np.inf)
    index = {int(c): i for i, c in enumerate(cls)}
    for d in per_party:
        for c, v in d.items():
            if c in index:
                D[:, index[c]] = np.minimum(D[:, index[c]], v)
    return cls, D


def federated_predict(party_models, Q=None, *, classes=None, return_distances: bool = False):
    """Global classifier of eq 104: ``argmin_c min_q Gamma_{W_{Y^q_c}}(y)``.

    Needs only the parties' distances (Fig. 11): items of ``party_models`` may be fitted
    classifiers or precomputed ``{class: distances}`` mappings. Raises
    :class:`~pm_vector.errors.InvalidInputError` when the parties were fitted on different
    feature dimensions, when ``Q`` does not match them, or when no party holds any class.
    """
    cls, D = global_class_distances(party_models, Q, classes=classes)
    if cls.size == 0:
        raise InvalidInputError("no party holds any class.")
    finite_any = np.isfinite(D).any(1)
    pred = cls[np.argmin(D, axis=1)]
    if not finite_any.all():
        raise InvalidInputError(f"{int((~finite_any).sum())} query row(s) have no finite distance from any party.")
    return (pred, cls, D) if return_distances else pred


def global_kahm_image(models, Y) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Global KAHM of eqs 101-102 over fitted :class:`~pm_vector.kahm.WideKAHM` (or KAHM /
    DeepKAHM) models of the same feature space: ``(image, distance, q_hat)`` per row of ``Y``."""
    models = list(models)
    if not models:
        raise InvalidInputError("global_kahm_image needs at least one model.")
    dims = {int(m.n_features_in_) for m in models}
    if len(dims) > 1:
        raise InvalidInputError(f"the KAHMs model different dimensions {sorted(dims)}; they cannot be combined.")
    Y = as_matrix(Y, "Y")
    imgs = np.stack([m.predict(Y) for m in models])              # (Q, rows, p)
    d = np.linalg.norm(Y[None] - imgs, axis=2)
    d = np.where(np.isfinite(d), d, np.inf)
    q = np.argmin(d, axis=0)
    rows = np.arange(Y.shape[0])
    return imgs[q, rows], d[q, rows], q
