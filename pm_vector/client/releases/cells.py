"""The client plan of the cell release: one reported public cell per class (pure eps, delta 0);
its answer is one list per class row, checked and re-ranked as the class rows' are
(:class:`~pm_vector.client.releases.class_rows.RowsQuery`)."""

from __future__ import annotations

import numpy as np

from ...errors import InvalidInputError
from ...privacy.cell_release import max_cells_for
from ...protocol.class_rows import DEFAULT_SHORTLIST
from ..cell_client import PrivateCellKNN
from .base import seeded
from .class_rows import RowsQuery


def cell_knn(docs, name: str, *, epsilon: float, n_cells: int | None = None, shortlist: int | None = None,
             account=None) -> PrivateCellKNN:
    """The :class:`~pm_vector.client.cell_client.PrivateCellKNN` of the collection's active run (pure
    eps, delta 0; ``n_cells`` None: K by the public rule for ``epsilon``, among the levels no finer
    than :func:`~pm_vector.privacy.cell_release.max_cells_for` the collection's public size, classes
    and k'), charging ``account`` (eps, 0) per request."""
    cells = docs.public_cells(name)
    if cells is None:
        raise InvalidInputError(f"collection {name!r} serves no cell release (its active run publishes no "
                                "cells); use release='gaussian', or run a new embedding job.")
    shortlist = shortlist or DEFAULT_SHORTLIST
    doc = docs.document(name).class_rows
    max_cells = (max_cells_for(int(doc["n_items"]), len(doc["classes"]), int(shortlist))
                 if doc.get("n_items") else None)
    # the real row: the query's nearest public cell over every class (PrivateCellKNN's default
    # row="nearest": no label, no classifier needed)
    return PrivateCellKNN(cells, epsilon, n_cells=n_cells, shortlist=shortlist, collection=name,
                          accountant=account, max_cells=max_cells)


class CellsQuery(RowsQuery):
    """One query of the cell release."""

    release = "cells"

    @classmethod
    def served(cls, docs, name: str) -> bool:
        return docs.public_cells(name) is not None

    def build(self, features, label=None, rng=None):
        q = self.q
        client = cell_knn(self.docs, q.name, epsilon=q.epsilon, n_cells=q.n_cells, shortlist=self.shortlist,
                          account=self.account)
        x = np.asarray(features, dtype=np.float64)
        self.n_features = x.size
        return seeded(client, rng).request(x, None if label is None else int(label))
