"""The sorted-array steps of :mod:`pm_vector.db.runs.delta_sets` (a held set moved by a write's ids
without sorting it again) against numpy's set operations, on any ascending unique arrays."""

import numpy as np
from hypothesis import given, strategies as st

from pm_vector.db.runs import delta_sets

ids = st.lists(st.integers(0, 300), max_size=60).map(lambda v: np.unique(np.asarray(v, np.int64)))


@given(ids, ids)
def test_with_and_without_are_union_and_difference(held, new):
    got = delta_sets._with(held, new)
    assert got.dtype == np.int64 and got.tolist() == np.union1d(held, new).tolist()
    assert delta_sets._without(held, new).tolist() == np.setdiff1d(held, new).tolist()
