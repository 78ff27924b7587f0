"""One small numpy-in / numpy-out function per plugin role (the database wiring calls these).

- :func:`fabricate_anchor` -- a differentially private anchor set: fabricated rows (Def. 14,
  Remark 4) per class, labels unchanged.
- :func:`fit_class_models` -- one KAHM per class (Definition 7); ``model.class_scores(Q)`` gives
  the class-matching scores of Definition 8.
- :func:`federated_predict` -- the global rule of eq 104 (needs only the parties' distances).
- :func:`membership_audit` -- membership-inference scores (eq 69) of two classifiers.
"""

from __future__ import annotations

import numpy as np

from .._validation import as_labels, as_matrix
from ..defaults import DEFAULT_SMOOTHING_STEPS
from ..errors import InvalidInputError
from .classifier import KAHMClassifier
from .federated import federated_predict
from .membership import membership_audit
from .model import run_jobs
from .privacy import reissue_warnings, fabrication_jobs, make_noise
from ..manifold.laplacian import resolve_device
from ..privacy import secure_generator
from .grid import RowGaussianNoise

__all__ = ["anchor_noise", "fabricate_anchor", "fit_class_models", "federated_predict", "membership_audit"]


UNITS = ("row", "element")


def anchor_noise(epsilon: float, *, delta: float = 1e-5, unit: str = "row", clip_norm: float = 1.0,
                 sensitivity: float = 1.0, noise: str = "grid", grid: float | None = None):
    """The release mechanism of :func:`fabricate_anchor`: ``unit="row"`` (default) clips each row
    to the public L2 norm ``clip_norm`` and adds discrete Gaussian noise calibrated to the whole row
    (:class:`~pm_vector.kahm.grid.RowGaussianNoise`, ``(epsilon, delta)`` per item);
    ``unit="element"`` is Result 1 per element (``sensitivity`` = bound on one element's change),
    on the grid (``noise="grid"``) or the paper's floats (``noise="continuous"``)."""
    if unit == "row":
        if noise != "grid":
            raise InvalidInputError("unit='row' releases on a grid only; drop noise= or use unit='element'.")
        return RowGaussianNoise(epsilon, delta, clip_norm, grid)
    if unit == "element":
        return make_noise(epsilon, delta, sensitivity, noise, grid)
    raise InvalidInputError(f"unit must be one of {UNITS}; got {unit!r}.")


def fabricate_anchor(X, y, epsilon: float, n: int = 20, seed: int | None = None, *, delta: float = 1e-5,
                     unit: str = "row", clip_norm: float = 1.0, sensitivity: float = 1.0, noise: str = "grid",
                     grid: float | None = None, branch_size: int = 1000, max_smoothing_steps: int = 200,
                     r: float | None = None, smoothing_steps: int | None = DEFAULT_SMOOTHING_STEPS, n_jobs: int = -1,
                     device="auto") -> tuple[np.ndarray, np.ndarray]:
    """Differentially private fabricated anchor rows ``(X_fab, y_fab)``.

    The rows are released once by :func:`anchor_noise` (row level by default: each item row
    clipped to L2 norm ``clip_norm`` and perturbed as a whole, ``(epsilon, delta)`` per item; every
    value on a public grid), then per class (Remark 4) cut into k-means subsets of about
    ``branch_size`` noisy rows, each smoothed for ``smoothing_steps`` (public, default 5) and
    fabricated (Definitions 13-14): a function of the noisy rows only. Output rows are grouped
    by class (ascending). ``seed=None`` draws the noise from the operating system's
    CSPRNG; an int (a seeded PCG64) is for tests only and is not a private release.

    ``smoothing_steps=None`` (explicit opt-in) runs the paper's stopping rule (eq 92) with ``r``
    from the *original* rows of each subset (eq 96) unless a public ``r`` is given: that output is
    NOT differentially private (the number of steps depends on the raw rows).
    """
    import torch
    X = as_matrix(X, "X")
    y = as_labels(y, X.shape[0], "y")
    mech = anchor_noise(epsilon, delta=delta, unit=unit, clip_norm=clip_norm, sensitivity=sensitivity, noise=noise,
                        grid=grid)
    classes, counts = np.unique(y, return_counts=True)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidInputError(f"n must be a positive integer; got {n!r}.")
    if counts.min() < n + 1:
        c = int(classes[np.argmin(counts)])
        raise InvalidInputError(f"class {c} has {int(counts.min())} row(s); fabricating with subspace dimension n={n} "
                                f"needs at least n+1 = {n + 1} rows per class.")
    Xp = mech.release(X, secure_generator(seed))
    dev = resolve_device(device)
    jobs, owners = [], []
    for c in classes:
        m = y == c
        js = fabrication_jobs(X[m], Xp[m], int(n), branch_size=branch_size, r=r, max_steps=max_smoothing_steps,
                              device=dev, dtype=torch.float64, what=f"class {int(c)}", steps=smoothing_steps)
        jobs += js
        owners += [int(c)] * len(js)
    results = run_jobs(jobs, n_jobs)
    reissue_warnings([b for _, b in results])
    X_fab = np.concatenate([a for a, _ in results])
    y_fab = np.concatenate([np.full(a.shape[0], o, dtype=np.int64) for (a, _), o in zip(results, owners)])
    return X_fab, y_fab


def fit_class_models(X, y, *, n_components: int = 20, n_layers: int = 5, branch_size: int = 1000,
                     **kwargs) -> KAHMClassifier:
    """A fitted :class:`~pm_vector.kahm.KAHMClassifier` (one wide KAHM per class).

    ``model.class_scores(Q)`` -> ``(len(Q), C)`` matching scores (Definition 8, columns in
    ``model.classes_`` order); ``model.class_distances(Q)`` the raw distances;
    ``model.predict(Q)`` the labels; ``model.save(path)`` / ``KAHMClassifier.load(path)``."""
    return KAHMClassifier(n_components, n_layers, branch_size, **kwargs).fit(X, y)
