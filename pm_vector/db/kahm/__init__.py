"""KAHM roles of a collection, stored in the database (the KAHM paper's tools as server jobs).

The DP fabricated anchor, one wide KAHM per class with every item's class-matching scores,
scores of new items, federation (distances only) and the membership-inference audit.

Modules:

* :mod:`~pm_vector.db.kahm.roles` -- the jobs and queries (fit, score, classify, federate);
* :mod:`~pm_vector.db.kahm.anchor` -- ``fabricate_anchor_set``: the DP anchor and dummy pool;
* :mod:`~pm_vector.db.kahm.audit` -- ``run_membership_audit``, ``list_audits``;
* :mod:`~pm_vector.db.kahm.store` -- what all of them share, below them: validation, the
  privacy record, the one-transaction write, the stored models.
"""

from ..errors import NoKAHMModelError, RawKAHMDistancesNotAllowedError
from .roles import (
    DEFAULT_SMOOTHING_STEPS,
    KINDS,
    class_scores,
    fabricate_anchor_set,
    federated_classify,
    fit_kahm_models,
    list_audits,
    list_kahm_models,
    load_kahm_model,
    party_distances,
    raw_distances_allowed,
    run_membership_audit,
    score_new_items,
)

__all__ = [
    "fabricate_anchor_set", "fit_kahm_models", "score_new_items", "list_kahm_models", "load_kahm_model",
    "class_scores", "party_distances", "federated_classify", "run_membership_audit", "list_audits",
    "NoKAHMModelError", "RawKAHMDistancesNotAllowedError", "raw_distances_allowed", "KINDS",
    "DEFAULT_SMOOTHING_STEPS",
]
