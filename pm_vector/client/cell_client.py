"""The client of a cell release: report the query's cell by randomized response, re-rank locally.

::

    client = PrivateCellKNN(cells, epsilon=4.0)          # K by the public rule for eps 4
    request, secret = client.request(x, label=3)          # or label=None with a classifier
    answer = server_resolve(request)                       # one list of k' ids per class row
    real = secret.pick(answer["rows"])
    top8 = PrivateKNN.rerank_codes(x, real["item_ids"], real["codes"], codes, k=8)  # a compact answer
    top8 = PrivateKNN.rerank(x, ids, features, k=8)        # or by raw features

The guarantee (pure epsilon, delta 0, whole request, replacing features and label) and the exact
sampler are in :mod:`pm_vector.privacy.cell_release`. Which row is real (``row``):

* ``"nearest"`` (default): the query's nearest public centroid over **every** class at the
  request's level gives both the row (that centroid's class) and the cell. It needs no label and
  measured better than the label's class (the figures and their command: docs/benchmarks.md,
  "Figures behind design choices in the code").
* ``"label"``: the given label's class (or ``classifier``'s), the cell nearest in that class.

Either is a function of the query (features and label), so the guarantee is the same.

Budget: every unseeded request is charged ``(epsilon, 0)`` before anything is drawn, to
``accountant`` or the default ledger under the single key ``"local"``
(:data:`~pm_vector.client.budget.LOCAL_KEY`): neither the published cells nor the collection's name
select it, so no server can open a fresh budget.
"""

from __future__ import annotations

import numpy as np

from .._validation import as_matrix, normalize_rows
from ..errors import InvalidInputError
from ..manifold.public_cells import PublicCells, nearest_centroid
from ..privacy.cell_release import CellRandomizedResponse, cell_level_for_epsilon
from ..privacy.rng import secure_generator
from .charging import ChargedRelease
from .query import DEFAULT_SHORTLIST
from .request import CellRequest, ClientSecret


class PrivateCellKNN(ChargedRelease):
    """Builds cell requests against published :class:`~pm_vector.manifold.public_cells.PublicCells`.

    ``n_cells``: the level K (one of ``cells.levels_``); ``None`` takes the public rule
    :func:`~pm_vector.privacy.cell_release.cell_level_for_epsilon` (with ``max_cells``, e.g. from
    :func:`~pm_vector.privacy.cell_release.max_cells_for` and the collection's public size).
    ``classifier``: any fitted object with
    ``predict`` used when a query comes without a label. ``accountant``: what every unseeded request
    is charged to; None charges the default ledger.
    """

    def __init__(self, cells: PublicCells, epsilon: float = 4.0, *, n_cells: int | None = None,
                 shortlist: int = DEFAULT_SHORTLIST, classifier=None, collection: str | None = None,
                 accountant=None, max_cells: int | None = None, row: str = "nearest"):
        if row not in ("nearest", "label"):
            raise InvalidInputError(f"row must be 'nearest' or 'label'; got {row!r}.")
        self.row = row
        self.cells = cells
        K = cell_level_for_epsilon(epsilon, cells.levels_, max_cells) if n_cells is None else n_cells
        if K not in cells.levels_:
            raise InvalidInputError(f"n_cells must be one of the published levels {list(cells.levels_)}; got {K!r}.")
        self.mechanism = CellRandomizedResponse(epsilon, K)
        self.shortlist = int(shortlist)
        self.classifier = classifier
        self.collection = collection
        self.digest = cells.digest()
        self._set_accountant(accountant)  # None: the default ledger's key "local", whatever the cells or name

    @property
    def n_cells(self) -> int:
        return self.mechanism.n_cells

    def true_cell(self, x, label: int) -> tuple[int, int]:
        """``(class position, cell)`` of a unit-norm query ``x`` of class ``label`` (kept secret)."""
        row = int(self.cells.class_index([int(label)])[0])
        return row, int(self.cells.assign(x, row, self.n_cells)[0])

    def nearest_cell(self, x) -> tuple[int, int]:
        """``(class position, cell)`` of the public centroid nearest to ``x`` over every class."""
        cen = self.cells.centroids_[self.n_cells]
        C, K, D = cen.shape
        flat = int(nearest_centroid(np.asarray(x, dtype=np.float64).reshape(1, -1), cen.reshape(C * K, D))[0])
        return flat // K, flat % K

    def locate(self, x, label: int | None = None) -> tuple[int, int, int, bool]:
        """``(class position, cell, label, predicted)`` of a unit-norm query: what the request
        reports (kept secret)."""
        if self.row == "nearest":
            row, cell = self.nearest_cell(x)
            return row, cell, int(self.cells.classes_[row]), True
        predicted = label is None
        if predicted:
            if self.classifier is None:
                raise InvalidInputError("no label given and no classifier: pass label=, or build the client "
                                        "with classifier= (or row='nearest').")
            label = int(np.asarray(self.classifier.predict(x)).reshape(-1)[0])
        row, cell = self.true_cell(x, int(label))
        return row, cell, int(label), predicted

    def request(self, x, label: int | None = None) -> tuple[CellRequest, ClientSecret]:
        """``(CellRequest, ClientSecret)`` for one query ``x`` (raw features; scaled to unit norm).
        ``row="nearest"``: the nearest public cell of any class (``label`` is not used);
        ``row="label"``: the cell of class ``label`` (``None`` asks the client's classifier)."""
        x = as_matrix(np.asarray(x, dtype=np.float64).reshape(1, -1), "query")
        if x.shape[1] != self.cells.n_features_in_:
            raise InvalidInputError(f"query has {x.shape[1]} features; the cells have {self.cells.n_features_in_}.")
        x = normalize_rows(x)
        row, cell, label, predicted = self.locate(x, label)
        self._charge()
        rng = self._rng if self._rng is not None else secure_generator()
        reports = self.mechanism.release(row, cell, int(self.cells.classes_.size), rng)
        req = CellRequest(reports=reports.tolist(), n_cells=self.n_cells, epsilon=self.mechanism.epsilon,
                          cells_digest=self.digest, shortlist=self.shortlist, collection=self.collection,
                          seeded=self._rng is not None)
        return req, ClientSecret(real_row=row, label=int(label), predicted=predicted)
