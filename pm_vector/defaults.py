"""Public defaults shared by the library and the database jobs.

A module of its own (numpy- and torch-free) so that :mod:`pm_vector.db` can name the same
constant as :mod:`pm_vector.kahm` without loading the models.
"""

#: fixed, public number of smoothing steps of every fabricated-data release (Definitions 13-14):
#: :class:`~pm_vector.kahm.FabricatedKAHMClassifier`, :func:`~pm_vector.kahm.fabricate_anchor` and
#: the database jobs. The output is then a function of the noisy rows only (post-processing of
#: Algorithm 1). The paper's stopping rule (eq 92) takes its threshold ``r`` from the original rows,
#: so the number of steps it runs depends on them: it stays available only as the explicit
#: ``smoothing_steps=None``, which the differential-privacy guarantee does not cover.
DEFAULT_SMOOTHING_STEPS = 5
