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

#: when the bulk merge of a run's delta is due (:mod:`pm_vector.db.runs.merge`): this many delta
#: items (tombstones + new items, whatever their entries at the levels) or the oldest of them this many seconds old; a collection's
#: ``settings["merge"] = {"delta_items": N, "age_s": S}`` overrides either (0: never by that rule).
#: The service's sync worker merges what is due in the background.
MERGE_DELTA_ITEMS = 10_000
MERGE_AGE_S = 3_600
#: and not before the active run has served this many times as long as it took to build
#: (``settings["merge"]["pause"]``; 0: no pause): under a stream that fills the delta faster than a
#: merge takes, merges then take at most ``1 / (1 + pause)`` of the time (a sixth) instead of
#: running back to back. A stream of ``R`` changes a second whose writer gets ``w_m`` commits a
#: second while a merge builds and ``w_f`` between merges while it is behind is kept up with when
#: ``pause >= (R - w_m) / (w_f - R)``, whatever the merge costs (``docs/benchmarks.md``, "The merges'
#: share of the time"; ``bench writes`` reports the bound: ``pause_bound``). 5 since a 10-minute
#: stream at plain pgvector's saturated 1,274 a second gave ``w_m`` 871.4 and ``w_f`` at least
#: 1,369.0: a bound of 4.2, above the 3 before ("Whose CPU"). A collection sets its own:
#: ``pm-vector db merge-rule NAME --pause P``.
MERGE_PAUSE = 5.0
