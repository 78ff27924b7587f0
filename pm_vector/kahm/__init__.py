"""Kernel Affine Hull Machines (KAHM) and their differentially private classifiers.

Models (torch; CPU, or CUDA when present)
    :class:`KAHM` (Definition 1), :class:`DeepKAHM` (Definition 3), :class:`WideKAHM`
    (Definition 5) with their distance functions; :class:`KAHMClassifier` (Definitions 7-8).
Differential privacy
    :class:`OptimalNoise` (Result 1, eq 76), :func:`privatize` (Algorithm 1), :func:`smooth`
    (Definition 13), :func:`fabricate` (Definition 14), :class:`NoisyKAHMClassifier`
    (Definition 12), :class:`FabricatedKAHMClassifier` (Definition 15). Released noise is on a
    public grid (:class:`GridOptimalNoise` per element, :class:`RowGaussianNoise` per item row;
    :mod:`pm_vector.kahm.grid`); the paper's float construction is ``noise="continuous"``.
Federated
    :func:`federated_predict` (eqs 101-104, Remark 5).
Membership inference
    :func:`membership_inference_score` (eq 69, LSDD), :func:`membership_audit`.
Persistence
    ``model.save(path)`` / ``Class.load(path)`` / :func:`load_model` (tensors + JSON params,
    loaded with ``torch.load(weights_only=True)``).

Points where the paper needs care (details in the module docstrings and tests)
    - The DP unit is one *element* of the data matrix (Definition 10): a whole row of ``p``
      features costs up to ``p * epsilon`` by composition.
    - Result 1's noise has an atom of mass ``delta`` at exactly 0: an element is released
      unperturbed (rounded to the grid) with probability ``delta``.
    - Eq 76 on 53-bit uniforms is the construction Mironov (2012) broke: the low bits of
      ``x + v`` rule neighbours out (3,05x of 4,000 outputs at (eps, d) = (1, 1) for 3/16 vs 7/16).
      The default releases ``grid * (round(x / grid) + Z)`` with ``Z`` from exact integer samplers.
    - ``lambda* = e_hat + 2 ||Y||_F^2 / (pN)`` depends on the raw magnitude (and offset) of the
      data while the kernel is scale-free: the model is not scale/translation invariant. With
      small-magnitude data ``lambda*`` is tiny and ``sum_i h^i(Py)`` can be negative, so the
      boundedness of Theorem 2 fails (its proof uses 'a product of PSD matrices is PSD', eq 140);
      such points get a NaN image / infinite distance here (test_kahm_theorems.py).
    - Definition 13's index: ``T_{n,M}`` is taken as ``M - 1`` smoothing steps (``T_{n,1}`` = id),
      the reading that makes eqs 85, 87 and 92 consistent.
    - Fabricated data are not a pure post-processing of the noisy data: the stopping threshold
      ``r`` (eq 88/96) is computed from the original rows, and eq 98 clusters the original rows.
      Here k-means runs on the noisy rows by default (``cluster_on="noisy"``) and the smoother runs
      a fixed public number of steps (:data:`DEFAULT_SMOOTHING_STEPS`, the same for the library and
      the database jobs); the paper's rule is the explicit opt-in ``smoothing_steps=None`` (not
      private); nothing that depends on ``r`` (its value, the steps it took, the errors, warning
      text) is saved.
    - The membership-inference score is an L2 distance between densities of distances, so it has
      units (1 / distance): audits compute it on distances in units of each model's median
      held-out distance, and report the attack AUC and TPR at low FPR beside it.
"""

from ..defaults import DEFAULT_SMOOTHING_STEPS
from ..errors import InvalidInputError
from .classifier import FabricatedKAHMClassifier, KAHMClassifier, NoisyKAHMClassifier, matching_scores
from .federated import federated_predict, global_class_distances, global_kahm_image, party_distances
from .grid import GridOptimalNoise, RowGaussianNoise
from .kernel import fit_encoder, kernel_matrix
from .lambda_ import lambda_star, residual, residual_dense
from .membership import lsdd, membership_audit, membership_auc, membership_inference_score
from .model import KAHM, DeepKAHM, KAHMCore, WideKAHM, fit_core, fit_deep
from .persistence import load_state
from .plugin import fabricate_anchor, fit_class_models
from .privacy import (FabricationWarning, OptimalNoise, fabricate, fabricate_subsets, make_noise, modelling_error,
                      privatize, smooth)



def load_model(path, device=None):
    """Load any KAHM model file written by ``model.save(path)``, dispatching on the stored kind.

    Here, in the package face, because it needs every model class, and the models themselves
    save and load through :mod:`pm_vector.kahm.persistence` (which then imports none of them).
    """

    kinds = {c._kind: c for c in (KAHM, DeepKAHM, WideKAHM, KAHMClassifier, NoisyKAHMClassifier,
                                   FabricatedKAHMClassifier)}
    kind = load_state(path)[0]
    if kind not in kinds:
        raise InvalidInputError(f"{path} holds an unknown model kind {kind!r}.")
    return kinds[kind].load(path, device=device)


__all__ = [
    "KAHM", "DeepKAHM", "WideKAHM", "KAHMCore", "fit_core", "fit_deep", "fit_encoder", "kernel_matrix",
    "lambda_star", "residual", "residual_dense",
    "KAHMClassifier", "NoisyKAHMClassifier", "FabricatedKAHMClassifier", "matching_scores",
    "federated_predict", "global_class_distances", "global_kahm_image", "party_distances",
    "OptimalNoise", "GridOptimalNoise", "RowGaussianNoise", "make_noise", "privatize", "smooth", "fabricate", "fabricate_subsets", "modelling_error", "FabricationWarning",
    "lsdd", "membership_inference_score", "membership_auc", "membership_audit",
    "fabricate_anchor", "fit_class_models", "load_model", "DEFAULT_SMOOTHING_STEPS",
]
