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
from ..errors import InvalidInputError
from .classifier import KAHMClassifier
from .federated import federated_predict
from .membership import membership_audit
from .model import run_jobs
from .privacy import OptimalNoise, _reissue_warnings, fabrication_jobs

__all__ = ["fabricate_anchor", "fit_class_models", "federated_predict", "membership_audit"]


def fabricate_anchor(X, y, epsilon: float, n: int = 20, seed: int | None = None, *, delta: float = 1e-5,
                     sensitivity: float = 1.0, branch_size: int = 1000, max_smoothing_steps: int = 200,
                     r: float | None = None, smoothing_steps: int | None = None, n_jobs: int = -1,
                     device="auto") -> tuple[np.ndarray, np.ndarray]:
    """Differentially private fabricated anchor rows ``(X_fab, y_fab)``.

    Per class (rows with the same label), Remark 4: every element of ``X`` gets Result 1's
    ``(epsilon, delta)`` noise for element sensitivity ``sensitivity`` (Definition 10 -- the bound
    on how much one element can change, e.g. 1 for pixels in [0, 1], 2 for unit-norm rows), the
    noisy rows are cut into k-means subsets of about ``branch_size`` and each subset is smoothed
    and fabricated (Definitions 13-14, stopping rule eq 92). Output rows are grouped by class
    (classes in ascending order). ``seed=None`` draws the noise from a cryptographically seeded
    generator; an int is for tests only. ``r``: see :class:`~pm_vector.kahm.FabricatedKAHMClassifier`.

    ``smoothing_steps``: a fixed, public number of smoothing steps. The paper's stopping rule
    (the default, ``None``) compares against ``r``, which eq 96 computes from the *original*
    rows of each subset -- one scalar per subset outside the DP guarantee. With a fixed number of
    steps (or a public ``r``) the output is a function of the noisy rows only, so the whole
    anchor is ``(epsilon, delta)``-DP per element with no such caveat.
    """
    from ..manifold.laplacian import resolve_device
    from ..privacy import secure_generator
    import torch
    X = as_matrix(X, "X")
    y = as_labels(y, X.shape[0], "y")
    noise = OptimalNoise(epsilon, delta, sensitivity)
    classes, counts = np.unique(y, return_counts=True)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidInputError(f"n must be a positive integer; got {n!r}.")
    if counts.min() < n + 1:
        c = int(classes[np.argmin(counts)])
        raise InvalidInputError(f"class {c} has {int(counts.min())} row(s); fabricating with subspace dimension n={n} "
                                f"needs at least n+1 = {n + 1} rows per class.")
    Xp = X + noise.sample(X.shape, secure_generator(seed))
    dev = resolve_device(device)
    jobs, owners = [], []
    for c in classes:
        m = y == c
        js = fabrication_jobs(X[m], Xp[m], int(n), branch_size=branch_size, r=r, max_steps=max_smoothing_steps,
                              device=dev, dtype=torch.float64, what=f"class {int(c)}", steps=smoothing_steps)
        jobs += js
        owners += [int(c)] * len(js)
    results = run_jobs(jobs, n_jobs)
    _reissue_warnings([b for _, b in results])
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
