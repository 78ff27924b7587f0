"""Kept for one release: moved to :mod:`pm_vector.db.kahm.store`; import from there."""

from .kahm.store import (  # noqa: F401
    _SETTLED, DEFAULT_SMOOTHING_STEPS, KINDS, OUTSIDE_ELEMENT, PRIVATE_KINDS, NoKAHMModelError, ProgressFn,
    RawKAHMDistancesNotAllowedError, _class_counts_check, _load, _noop, _positive_int, _privacy, _smoothing_record,
    _steps, _transaction, _value_range, kind_of, model_outputs_allowed, raw_distances_allowed,
)
