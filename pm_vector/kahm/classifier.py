"""KAHM based classifiers.

- :class:`KAHMClassifier` -- Definition 7 (label of the class whose wide conditionally deep
  KAHM has the smallest distance function value) and the class-matching score of Definition 8.
- :class:`NoisyKAHMClassifier` -- Definition 12: the same, fitted on the output of Algorithm 1
  (every element of the training matrix perturbed by the optimal noise of Result 1).
- :class:`FabricatedKAHMClassifier` -- Definition 15: fitted on differentially private
  fabricated data (Definition 14 per class, k-means subsets as in Remark 4).

One wide KAHM per class; all (class, branch) fits are independent and run on ``n_jobs``
threads. Labels are any integers; ``classes_`` holds them sorted.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import ClassifierMixin

from .._validation import as_labels, as_matrix
from ..defaults import DEFAULT_SMOOTHING_STEPS
from ..errors import InvalidInputError
from .model import (DEFAULT_CHUNK, KAHMCore, KAHMEstimatorBase, check_int, fit_deep, kmeans_partition, n_branches_for,
                    run_jobs, wide_forward)
from ..privacy import secure_generator
from .privacy import fabrication_jobs, make_noise, reissue_warnings

__all__ = ["KAHMClassifier", "NoisyKAHMClassifier", "FabricatedKAHMClassifier", "matching_scores"]


def matching_scores(distances: np.ndarray) -> np.ndarray:
    """Class-matching scores of Definition 8 from a ``(Q, C)`` matrix of distance values:
    ``exp(-Gamma_c^2 / sum_c' Gamma_c'^2)``. Infinite distances (missing classes) score 0."""
    D = np.asarray(distances, dtype=np.float64)
    finite = np.isfinite(D)
    D2 = np.where(finite, D, 0.0) ** 2
    tot = D2.sum(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.exp(-np.where(tot > 0, D2 / tot, 0.0))
    return np.where(finite, s, 0.0)


class KAHMClassifier(ClassifierMixin, KAHMEstimatorBase):
    """KAHM based classifier (Definition 7) with class-matching scores (Definition 8).

    Parameters
    ----------
    n_components : int, default 20
        Subspace dimension ``n``; every class (every k-means branch) needs at least ``n+1``
        points spanning ``n`` directions.
    n_layers : int, default 5
        Layers ``L`` of each conditionally deep KAHM (``L <= n``).
    branch_size : int, default 1000
        ``S_c = ceil(N_c / branch_size)`` k-means branches per class (eq 59).
    random_state : int or None
        Seed of k-means (public bookkeeping, not a privacy mechanism).
    n_jobs : int, default -1
        Independent (class, branch) fits -- and per-class distance evaluations -- run at once on a
        thread pool, each single-threaded; ``-1`` = all cores, ``1`` = one after the other with
        torch's own multi-threading inside each.
    device, dtype, chunk_size : see :class:`~pm_vector.kahm.KAHM`.

    Learned attributes: ``classes_``, ``n_features_in_``, ``class_counts_``, ``branch_sizes_``
    (per class), ``models_`` (per class: list of branches, each a list of layer cores).
    """

    _kind = "kahm_classifier"

    def __init__(self, n_components: int = 20, n_layers: int = 5, branch_size: int = 1000, *,
                 random_state: int | None = 0, n_jobs: int = -1, device="auto", dtype="float64",
                 chunk_size: int = DEFAULT_CHUNK):
        self.n_components = n_components
        self.n_layers = n_layers
        self.branch_size = branch_size
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.device = device
        self.dtype = dtype
        self.chunk_size = chunk_size

    # ---- fitting -------------------------------------------------------------------
    def _validate(self, X, y):
        self._setup()
        self._n = check_int("n_components", self.n_components)
        self._L = check_int("n_layers", self.n_layers)
        self._bs = check_int("branch_size", self.branch_size)
        if self._L > self._n:
            raise InvalidInputError(f"n_layers={self._L} must not exceed n_components={self._n} (Definition 3).")
        X = as_matrix(X, "X")
        y = as_labels(y, X.shape[0], "y")
        if self._n > X.shape[1]:
            raise InvalidInputError(f"n_components={self._n} exceeds the {X.shape[1]} features of X (n <= p).")
        classes, counts = np.unique(y, return_counts=True)
        need = self._n + 1
        small = np.flatnonzero(counts < need)
        if small.size:
            c = int(classes[small[0]])
            raise InvalidInputError(
                f"class {c} has {int(counts[small[0]])} sample(s); each class is modelled by its own KAHM with "
                f"subspace dimension n={self._n}, which needs at least n+1 = {need} samples. Lower n_components "
                f"to at most {int(counts.min()) - 1}, or drop/merge that class.")
        return X, y, classes, counts

    def fit(self, X, y):
        X, y, classes, counts = self._validate(X, y)
        self._fit_classes([X[y == c] for c in classes], classes)
        return self

    def _fit_classes(self, blocks: list[np.ndarray], classes: np.ndarray):
        """Fit one wide conditionally deep KAHM per class on the given row blocks."""
        n, L = self._n, self._L
        jobs, owners, sizes = [], [], []
        for ci, (Xc, c) in enumerate(zip(blocks, classes)):
            S = n_branches_for(Xc.shape[0], self._bs)
            parts = kmeans_partition(Xc, S, min_size=n + 1, random_state=self.random_state)
            sizes.append([int(len(p)) for p in parts])
            for si, idx in enumerate(parts):
                what = f"class {int(c)}" + (f", branch {si} ({len(idx)} samples)" if len(parts) > 1 else "")
                Yt = torch.as_tensor(Xc[idx], dtype=self.dtype_, device=self.device_)
                jobs.append(lambda Yt=Yt, what=what: fit_deep(Yt, n, L, what=what))
                owners.append(ci)
        fitted = run_jobs(jobs, self.n_jobs)
        models: list[list[list[KAHMCore]]] = [[] for _ in classes]
        for ci, layers in zip(owners, fitted):
            models[ci].append(layers)
        self.models_ = models
        self.classes_ = np.asarray(classes, dtype=np.int64)
        self.class_counts_ = {int(c): int(b.shape[0]) for c, b in zip(classes, blocks)}
        self.branch_sizes_ = {int(c): s for c, s in zip(classes, sizes)}
        self.n_features_in_ = int(blocks[0].shape[1])

    # ---- inference -----------------------------------------------------------------
    def class_distances(self, X) -> np.ndarray:
        """``(Q, C)`` matrix of ``Gamma_{W_{Y_c}}(x)`` (Definition 6), columns in ``classes_`` order."""
        self._check_fitted()
        Xt = self._tensor(X, "X")
        cols = run_jobs([lambda b=branches: wide_forward(b, Xt, self._chunk, need_image=False)[1]
                         for branches in self.models_], self.n_jobs)
        return torch.stack(cols, 1).cpu().numpy()

    def predict(self, X) -> np.ndarray:
        """eq 62: the class with the smallest distance function value."""
        D = self.class_distances(X)
        return self.classes_[np.argmin(D, axis=1)]

    def class_scores(self, X) -> np.ndarray:
        """Class-matching scores of Definition 8, ``(Q, C)`` in ``classes_`` order."""
        return matching_scores(self.class_distances(X))

    def decision_function(self, X) -> np.ndarray:
        """Matching scores (Definition 8); larger = more likely that class."""
        return self.class_scores(X)

    def min_distance(self, X) -> np.ndarray:
        """``min_c Gamma_{W_{Y_c}}(x)``: the statistic of the membership-inference score (eqs 67-68)."""
        return self.class_distances(X).min(1)

    # ---- persistence ---------------------------------------------------------------
    def _state(self):
        tensors, meta_models = {}, []
        for ci, branches in enumerate(self.models_):
            mb = []
            for si, layers in enumerate(branches):
                ml = []
                for li, core in enumerate(layers):
                    t, s = core.state(f"c{ci}.s{si}.l{li}")
                    tensors.update(t)
                    ml.append(s)
                mb.append(ml)
            meta_models.append(mb)
        meta = {"models": meta_models, "classes": self.classes_.tolist(), "n_features_in": self.n_features_in_,
                "class_counts": self.class_counts_, "branch_sizes": self.branch_sizes_}
        meta.update(self._extra_meta())
        return tensors, meta

    def _extra_meta(self) -> dict:
        return {}

    def _restore(self, tensors, meta):
        self.models_ = [[[KAHMCore.from_state(f"c{ci}.s{si}.l{li}", tensors, s, self.device_, self.dtype_)
                          for li, s in enumerate(ml)] for si, ml in enumerate(mb)]
                        for ci, mb in enumerate(meta["models"])]
        self.classes_ = np.asarray(meta["classes"], dtype=np.int64)
        self.n_features_in_ = int(meta["n_features_in"])
        self.class_counts_ = {int(k): int(v) for k, v in meta["class_counts"].items()}
        self.branch_sizes_ = {int(k): list(v) for k, v in meta["branch_sizes"].items()}
        for k, v in meta.items():
            if k.endswith("_") and not k.startswith("_"):
                setattr(self, k, v)


class _PrivateMixin:
    def _check_privacy_params(self):
        return make_noise(self.epsilon, self.delta, self.sensitivity, self.noise, self.grid)

    def _release(self, X, mech):
        out = mech.release(X, secure_generator(self.noise_seed))   # Algorithm 1, drawn once
        self.privacy_ = {**mech.record(), "outside_guarantee": _OUTSIDE,
                         "randomness": "OS CSPRNG (os.urandom)" if self.noise_seed is None else
                         "seeded PCG64 (tests only: NOT a private release)"}
        return out

    def _extra_meta(self) -> dict:
        return {"privacy_": getattr(self, "privacy_", None)}


#: what the element-level models do not protect (stored with every private model)
_OUTSIDE = ("labels and per-class counts (the paper protects the feature matrix only); a whole row of p features "
            "costs up to p x epsilon by composition")


class NoisyKAHMClassifier(_PrivateMixin, KAHMClassifier):
    """Differentially private KAHM classifier of Definition 12.

    ``fit`` perturbs every element of ``X`` once with the optimal ``(epsilon, delta)`` noise of
    Result 1 (Algorithm 1, sensitivity ``d`` = bound on the change of one element, Definition
    10) and fits :class:`KAHMClassifier` on the noisy rows. Labels are not perturbed (the paper
    protects the data matrix). ``noise_seed=None`` draws the noise from the OS CSPRNG
    (:func:`~pm_vector.privacy.secure_generator`); an int is for tests only (not private; the
    record's ``randomness`` says so). ``noise="grid"`` (default) releases every noisy
    element on the public ``grid`` (:mod:`pm_vector.kahm.grid`, floating-point safe);
    ``"continuous"`` is the paper's float construction (reproduction only, Mironov 2012).
    Learned: ``privacy_`` (the privacy record: mechanism, unit, grid, what lies outside).
    """

    _kind = "noisy_kahm_classifier"

    def __init__(self, epsilon: float = 1.0, delta: float = 1e-5, sensitivity: float = 1.0,
                 n_components: int = 20, n_layers: int = 5, branch_size: int = 1000, *,
                 noise_seed: int | None = None, noise: str = "grid", grid: float | None = None,
                 random_state: int | None = 0, n_jobs: int = -1, device="auto",
                 dtype="float64", chunk_size: int = DEFAULT_CHUNK):
        self.epsilon = epsilon
        self.delta = delta
        self.sensitivity = sensitivity
        self.noise_seed = noise_seed
        self.noise = noise
        self.grid = grid
        super().__init__(n_components, n_layers, branch_size, random_state=random_state, n_jobs=n_jobs,
                         device=device, dtype=dtype, chunk_size=chunk_size)

    def fit(self, X, y):
        noise = self._check_privacy_params()
        X, y, classes, counts = self._validate(X, y)
        Xp = self._release(X, noise)
        self._fit_classes([Xp[y == c] for c in classes], classes)
        return self


class FabricatedKAHMClassifier(_PrivateMixin, KAHMClassifier):
    """Differentially private KAHM classifier of Definition 15 (fabricated data).

    Per class: Remark 4 (k-means subsets of about ``branch_size`` rows; Algorithm 1 noise; the
    smoother of Definition 13 for a fixed, public number of steps; fabricated rows of Definition
    14), then :class:`KAHMClassifier` on the fabricated rows.

    ``smoothing_steps`` (default :data:`~pm_vector.defaults.DEFAULT_SMOOTHING_STEPS`, public): the
    smoother's steps. With it (and ``cluster_on="noisy"``) the model is a function of the noisy
    rows only, a post-processing of Algorithm 1: the (epsilon, delta) guarantee covers it.
    ``smoothing_steps=None`` is an explicit opt-in to the paper's stopping rule (eq 92): it is
    **not private** unless ``r`` is a public value -- with ``r=None`` (the paper) the threshold is
    the KAHM modelling error of each original subset (eq 96), so the number of steps, and the
    model, depend on the raw rows outside the guarantee. ``r`` (the rule's threshold) is refused
    with a fixed ``smoothing_steps``; ``max_smoothing_steps`` caps the rule (Theorem 6 only gives a
    limit).

    ``cluster_on``: ``"noisy"`` (default) runs k-means on the noisy rows, a pure post-processing;
    ``"original"`` clusters the original rows as eq 98 writes it (the partition then depends on
    the private data, outside the DP guarantee; only with ``smoothing_steps=None``).

    Learned (besides those of :class:`KAHMClassifier`): ``fabrication_`` -- per class, per subset:
    ``M_tilde``, ``r``, the final modelling error and whether the rule was met (``r`` is not
    written by :meth:`save`: it is a statistic of the original rows).
    """

    _kind = "fabricated_kahm_classifier"

    def __init__(self, epsilon: float = 1.0, delta: float = 1e-5, sensitivity: float = 1.0,
                 n_components: int = 20, n_layers: int = 5, branch_size: int = 1000, *,
                 noise_seed: int | None = None, cluster_on: str = "noisy", r: float | None = None,
                 max_smoothing_steps: int = 200, smoothing_steps: int | None = DEFAULT_SMOOTHING_STEPS,
                 noise: str = "grid",
                 grid: float | None = None, random_state: int | None = 0,
                 n_jobs: int = -1, device="auto", dtype="float64", chunk_size: int = DEFAULT_CHUNK):
        self.epsilon = epsilon
        self.delta = delta
        self.sensitivity = sensitivity
        self.noise_seed = noise_seed
        self.noise = noise
        self.grid = grid
        self.cluster_on = cluster_on
        self.r = r
        self.max_smoothing_steps = max_smoothing_steps
        self.smoothing_steps = smoothing_steps
        super().__init__(n_components, n_layers, branch_size, random_state=random_state, n_jobs=n_jobs,
                         device=device, dtype=dtype, chunk_size=chunk_size)

    def fit(self, X, y):
        noise = self._check_privacy_params()
        X, y, classes, counts = self._validate(X, y)
        steps = check_int("max_smoothing_steps", self.max_smoothing_steps)
        if self.smoothing_steps is not None and self.r is not None:
            raise InvalidInputError("r is the threshold of the stopping rule: pass smoothing_steps=None to opt in to "
                                    "the rule, or drop r (the default runs a fixed public number of steps).")
        Xp = self._release(X, noise)
        jobs, owners = [], []
        for ci, c in enumerate(classes):
            m = y == c
            js = fabrication_jobs(X[m], Xp[m], self._n, branch_size=self._bs, cluster_on=self.cluster_on, r=self.r,
                                  max_steps=steps, random_state=self.random_state, device=self.device_,
                                  dtype=self.dtype_, what=f"class {int(c)}", steps=self.smoothing_steps)
            jobs += js
            owners += [ci] * len(js)
        results = run_jobs(jobs, self.n_jobs)
        reissue_warnings([b for _, b in results])
        blocks = [np.concatenate([a for (a, _), o in zip(results, owners) if o == ci]) for ci in range(len(classes))]
        self.fabrication_ = {int(c): [b for (_, b), o in zip(results, owners) if o == ci]
                             for ci, c in enumerate(classes)}
        self._fit_classes(blocks, classes)
        if self.smoothing_steps is None and self.r is None or self.cluster_on != "noisy":
            self.privacy_["outside_guarantee"] += (
                "; the stopping rule's threshold r (eq 96) and/or the k-means partition come from the original rows"
                " (use a fixed public smoothing_steps and cluster_on='noisy' to remove this)")
        return self

    def _extra_meta(self) -> dict:
        # only what is public or a function of the noisy rows is written: r (eq 96), the steps the
        # rule took, the errors it compared and its warning text all depend on the original rows
        keep = ("size",) if self.smoothing_steps is None else ("size", "M_tilde")
        return {**super()._extra_meta(), "fabrication_": {str(k): [{a: sub[a] for a in keep if a in sub} for sub in v]
                                 for k, v in getattr(self, "fabrication_", {}).items()}}

    def _restore(self, tensors, meta):
        super()._restore(tensors, meta)
        self.fabrication_ = {int(k): v for k, v in meta.get("fabrication_", {}).items()}
