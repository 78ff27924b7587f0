"""The client of the location release: report the query's public cell, re-rank the answer locally.

::

    client = PrivateLocationKNN(cells, epsilon=4.0, n_items=10_000, max_bytes=50_000,
                                widths=codes.widths_)               # the plan: level, candidates, code width
    request = client.request(x)                                     # one report, pure eps, charged (eps, 0)
    answer = server_resolve(request)                                # S ids and S codes: one list
    ids, codes, payloads = client.check(answer, ...)                # the WHOLE answer, before x is used
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
width and the distances, not on the order the server chose).

Budget: every unseeded request is charged ``(epsilon, 0)`` before anything is drawn, to
``accountant`` or the default ledger under the single key ``"local"``
(:data:`~pm_vector.client.budget.LOCAL_KEY`): neither the published cells nor the collection's name
select it, so no server can open a fresh budget.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .._validation import as_matrix, normalize_rows, unit_query
from ..errors import InvalidInputError, MalformedAnswerError
from ..manifold.public_cells import PublicCells
from ..privacy.location import LocationRandomizedResponse, plan as location_plan
from ..privacy.rng import secure_generator
from ..protocol.location import LocationRequest, check_location_answer
from .charging import ChargedRelease
from .rerank import rank


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


def query_location(self, name, features, label=None, *, epsilon, k, rerank, max_bytes, rng) -> dict[str, Any]:
    """:meth:`Client.query <pm_vector.client.http.Client.query>` of the location release (``self``: the client): build (charged), send, check the WHOLE answer, re-rank.

    Before the answer, the query is used only to find its cell (:meth:`PrivateLocationKNN.locate`).
    The answer is checked in full (:func:`~pm_vector.protocol.location.check_location_answer`:
    exactly ``n = min(candidates, n_items)`` distinct ids, ``n_items`` the run's items as the answer
    says (fewer than the anchor document's after a delete), ``n x code_bytes`` code bytes, the run,
    level, report and codes digest of the request) before the query is used again; a malformed
    answer raises one :class:`~pm_vector.errors.InvalidInputError` whose text depends on the answer
    alone. The answer's bytes are bounded by the plan's own count
    (:meth:`~pm_vector.privacy.location.LocationPlan.answer_bytes`: payloads of the size the
    collection publishes, ``payload_bytes_max``): a larger answer is refused whole by the transport
    (payloads written after the query read the collection, or a server that publishes less than it
    stores), and the next query plans by what the collection publishes then. The re-rank then works on exactly ``n`` codes of the plan's width (public sizes), taken
    in a CSPRNG permutation (:func:`~pm_vector.client.rerank.rank`), so its time depends on neither
    the query's position nor the order the server chose."""
    t0 = time.perf_counter()
    req, plan = self._build_request(name, features, label, epsilon=epsilon, release="location",
                                    max_bytes=max_bytes, rng=rng)
    pub = self._public[name]
    pc = self.product_codes(name)
    t1 = time.perf_counter()
    status = self.budget.status(self.budget_key())  # charged by _build_request
    body = {"request": req.to_dict(), "k": int(k)}
    # the answer's bytes: at most what the plan counted (ids, codes and payloads of the size the collection
    # published, on this client's wire), never more than the request's shape allows
    cap = min(self._resolve_cap(name, body), plan.answer_bytes())
    try:
        res, sent, received = self._exchange("POST", f"/collections/{name}/resolve", body, max_bytes=cap)
    except MalformedAnswerError as exc:
        if exc.error != "too_large":
            raise
        raise MalformedAnswerError(
            f"{exc.message} The plan counted payloads of at most {self._payload_plan(name)} bytes each (what the "
            "collection published when this query read it): payloads written since, or a server that publishes "
            "less than it stores, make an answer larger than the byte budget. Nothing of it was used; ask again "
            "(the next query reads the collection again and plans by what it publishes then).",
            exc.status, exc.error) from None
    self._check_run(name, res)
    t2 = time.perf_counter()
    # nothing below talks to the server: the answer is all the client uses, checked whole first
    try:
        ids, codes, payloads = check_location_answer(res, req, n_items=int(pub.class_rows["n_items"]),
                                                     codes_digest=pc.digest(), run_id=pub.run_id)
    except InvalidInputError as exc:
        raise MalformedAnswerError(f"the answer is malformed: {exc}") from None
    q = unit_query(features)  # checked before the first request (Client.query)
    order, d = rank(q, codes=codes, product_codes=pc) if rerank else (np.arange(ids.size), np.zeros(ids.size))
    top = order[: int(k)]
    return {"item_ids": [int(v) for v in ids[top]], "distances": d[top].tolist(),
            **({} if payloads is None else {"payloads": [payloads[i] for i in top.tolist()]}),
            "collection": name, "protocol": "pm_vector", "release": "location", "epsilon": float(epsilon),
            "delta": 0.0, "level": plan.level, "candidates": plan.candidates, "code_bytes": plan.code_bytes,
            "max_bytes": plan.max_bytes, "n_cells": plan.level, "k": int(k), "shortlist": plan.candidates,
            "label_predicted": False, "run_id": res.get("run_id"), "reranked": "codes" if rerank else False,
            "answer": "compact", "budget": status, "bytes_sent": sent, "bytes_received": received,
            "bytes_per_request": sent + received, "wire": self.wire,
            "timing": {"build_ms": (t1 - t0) * 1000, "resolve_ms": (t2 - t1) * 1000,
                       "total_ms": (time.perf_counter() - t0) * 1000}}
