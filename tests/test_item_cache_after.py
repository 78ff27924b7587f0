"""pm_vector.db.runs.item_cache.after: the run's items without the erased and with the added ones,
ids ascending, each id's label and features kept with it -- whether the added ids follow the old
ones (the usual case: a sequence) or fall between them."""

from __future__ import annotations

import numpy as np
import pytest


def _items(ids):
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "label": ids % 3, "features": np.stack([ids, -ids]).T.astype(np.float32)}


@pytest.mark.parametrize("erased", [[3, 10], []])
@pytest.mark.parametrize("added", [[12, 15], [2, 15, 7], [5, 12]])
def test_after_keeps_each_item_with_its_own_row_in_id_order(added, erased):
    from pm_vector.db.runs.item_cache import after

    items = _items([1, 3, 5, 8, 10])
    out = after(items, erased=erased, added=_items(added))
    want = sorted(set([1, 3, 5, 8, 10]) - set(erased) | set(added))
    assert out["id"].tolist() == want
    assert out["label"].tolist() == [i % 3 for i in want]
    assert out["features"].tolist() == [[i, -i] for i in want]
