"""The client of the location release: report the query's public cell, re-rank the answer locally.

::

    client = PrivateLocationKNN(cells, epsilon=4.0, n_items=10_000, max_bytes=50_000,
                                widths=codes.widths_)               # the plan: level, candidates, code width
    request = client.request(x)                                     # one report, pure eps, charged (eps, 0)
    answer = server_resolve(request)                                # S ids and S codes: one list
    ids, codes, payloads = check_location_answer(answer, request, ...)  # the WHOLE answer, before x is used
    top8 = ids[rank(x, codes=codes, product_codes=codes)[0][:8]]

The guarantee (pure epsilon, delta 0, whole request, replacing features and label) and the exact
fixed-work sampler are in :mod:`pm_vector.privacy.location`; the plan (level M, candidates S, code
width) is the public rule :func:`pm_vector.privacy.location.plan` of eps, the collection's public
size, the byte budget and the published levels and code widths, so the request's shape says nothing
about the query; its candidates are what the byte budget holds with each candidate's id, code and
payload (at the collection's bound) as they travel on the wire, so a published count, true or not,
never sizes a request beyond the budget. The query's only use before the answer is its nearest
centroid at level M (:meth:`locate`); after the answer, the re-rank of exactly ``n = min(S,
n_items)`` coded candidates (fixed-size arrays, in a CSPRNG permutation: its time depends on n, the
width and the distances, not on the order the server chose). A query of the location release
through a :class:`~pm_vector.client.http.Client` is :mod:`pm_vector.client.releases.location`.

Budget: every unseeded request is charged ``(epsilon, 0)`` before anything is drawn, to
``accountant`` or the default ledger under the single key ``"local"``
(:data:`~pm_vector.client.budget.LOCAL_KEY`): neither the published cells nor the collection's name
select it, so no server can open a fresh budget.
"""

from __future__ import annotations

import numpy as np

from .._validation import as_matrix, normalize_rows
from ..errors import InvalidInputError
from ..manifold.public_cells import PublicCells
from ..privacy.location import LocationRandomizedResponse, plan as location_plan
from ..privacy.rng import secure_generator
from ..protocol.location import LocationRequest
from .charging import ChargedRelease


class PrivateLocationKNN(ChargedRelease):
    """Builds location requests against published location cells (a one-class
    :class:`~pm_vector.manifold.public_cells.PublicCells`).

    ``level``, ``candidates``, ``code_bytes``: the plan; any of them ``None`` takes the public rule
    :func:`~pm_vector.privacy.location.plan` of ``epsilon``, ``n_items`` (the collection's public
    size), ``max_bytes`` (what one request may cost on the wire, both ways), ``widths`` (the
    published code widths), ``payload_bytes`` (what one candidate's payload may cost on the wire,
    :func:`~pm_vector.protocol.location.payload_wire_bytes` of the collection's published bound; 0
    when it stores none) and ``wire`` (how the answer travels: ``"msgpack"`` or ``"json"``). ``accountant``: what every unseeded request is charged to; None charges
    the default ledger.
    """

    def __init__(self, cells: PublicCells, epsilon: float = 4.0, *, n_items: int, widths=(16, 32),
                 max_bytes: int | None = None, level: int | None = None, candidates: int | None = None,
                 code_bytes: int | None = None, payload_bytes: int = 0, collection: str | None = None,
                 accountant=None, wire: str = "msgpack"):
        if cells.classes_.size != 1:
            raise InvalidInputError("location cells are fit on the whole anchor as one class.")
        self.cells = cells
        self.plan_ = location_plan(epsilon, n_items=n_items, levels=cells.levels_, widths=widths,
                                   max_bytes=max_bytes, payload_bytes=payload_bytes, level=level,
                                   candidates=candidates, code_bytes=code_bytes, wire=wire)
        self.mechanism = LocationRandomizedResponse(epsilon, self.plan_.level)
        self.collection = collection
        self.n_items = int(n_items)
        self.digest = cells.digest()
        self._set_accountant(accountant)  # None: the default ledger's key "local", whatever the cells or name

    def locate(self, x) -> int:
        """The true cell of a query at the plan's level (kept secret)."""
        return int(self.cells.assign(x, 0, self.plan_.level)[0])

    def request(self, x) -> LocationRequest:
        """The :class:`~pm_vector.protocol.location.LocationRequest` of one query ``x`` (raw features;
        scaled to unit norm). Charged before the report is drawn."""
        x = as_matrix(np.asarray(x, dtype=np.float64).reshape(1, -1), "query")
        if x.shape[1] != self.cells.n_features_in_:
            raise InvalidInputError(f"query has {x.shape[1]} features; the cells have {self.cells.n_features_in_}.")
        a = self.locate(normalize_rows(x))
        self._charge()
        rng = self._rng if self._rng is not None else secure_generator()
        p = self.plan_
        return LocationRequest(report=self.mechanism.release(a, rng), level=p.level, epsilon=self.mechanism.epsilon,
                               locations_digest=self.digest, candidates=p.candidates, code_bytes=p.code_bytes,
                               collection=self.collection, seeded=self._rng is not None)
