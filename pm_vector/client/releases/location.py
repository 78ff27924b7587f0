"""The client plan of the location release: one report of the query's public cell over the whole
collection, the answer ``n = min(candidates, n_items)`` ids and code prefixes, re-ranked locally.

Before the answer, the query is used only to find its cell
(:meth:`~pm_vector.client.location.PrivateLocationKNN.locate`). The answer is checked in full
(:func:`~pm_vector.protocol.location.check_location_answer`: exactly ``n`` distinct ids, ``n_items``
the run's items as the answer says (fewer than the anchor document's after a delete), ``n x
code_bytes`` code bytes, the run, level, report and codes digest of the request) before the query
is used again; a malformed answer raises one :class:`~pm_vector.errors.MalformedAnswerError` whose
text depends on the answer alone. The answer's bytes are bounded by the plan's own count
(:meth:`~pm_vector.privacy.location.LocationPlan.answer_bytes`: payloads of the size the collection
publishes, ``payload_bytes_max``): a larger answer is refused whole by the transport (payloads
written after the query read the collection, or a server that publishes less than it stores), and
the next query plans by what the collection publishes then. The re-rank works on exactly ``n``
codes of the plan's width (public sizes), taken in a CSPRNG permutation
(:func:`~pm_vector.client.rerank.rank`), so its time depends on neither the query's position nor
the order the server chose.
"""

from __future__ import annotations

import numpy as np

from ..._validation import unit_query
from ...errors import InvalidInputError, MalformedAnswerError
from ...protocol.location import check_location_answer
from ..location import PrivateLocationKNN
from ..rerank import rank
from .base import Query, ReleaseQuery, seeded


def location_knn(docs, name: str, *, epsilon: float, max_bytes: int | None = None, account=None,
                 **plan) -> PrivateLocationKNN:
    """The :class:`~pm_vector.client.location.PrivateLocationKNN` of the collection's active run (pure
    eps, delta 0; the plan by the public rule for ``epsilon``, the collection's published size, code
    widths and what its payloads may take (:meth:`PublicDocuments._payload_wire_bytes`: the bound, or
    the smaller high-water mark, on the client's wire) and ``max_bytes``; ``plan``: ``level``,
    ``candidates`` or ``code_bytes`` to fix), charging ``account`` (eps, 0) per request."""
    cells = docs.location_cells(name)
    pc = docs.product_codes(name)
    if cells is None or pc is None:
        raise InvalidInputError(f"collection {name!r} serves no location release (its active run publishes no "
                                "location cells or codes); use release='cells', or run a new embedding job.")
    n_items = docs.document(name).class_rows.get("n_items")
    if isinstance(n_items, bool) or not isinstance(n_items, int) or not 1 <= n_items <= 1 << 40:
        raise InvalidInputError(f"collection {name!r} publishes no valid item count; run a new embedding job.")
    return PrivateLocationKNN(cells, epsilon, n_items=n_items, widths=tuple(pc.widths_), max_bytes=max_bytes,
                              payload_bytes=docs._payload_wire_bytes(name), collection=name, accountant=account,
                              wire=docs.wire)


class LocationQuery(ReleaseQuery):
    """One query of the location release (module doc)."""

    release = "location"

    @classmethod
    def served(cls, docs, name: str) -> bool:
        return docs.location_cells(name) is not None and docs.product_codes(name) is not None

    def __init__(self, docs, q: Query, account):
        super().__init__(docs, q, account)
        if q.n_cells is not None or q.shortlist is not None:
            raise InvalidInputError("n_cells and shortlist apply to the class-rows releases; the location release's "
                                    "plan follows the byte budget (max_bytes).")
        if q.answer == "features":
            raise InvalidInputError("the location release answers ids and product codes (answer='compact'); raw "
                                    "features come with the class-rows releases (release='cells' or 'gaussian').")
        self.knn = location_knn(docs, q.name, epsilon=q.epsilon, max_bytes=q.max_bytes, account=account)
        self.plan = self.knn.plan_

    def build(self, features, label=None, rng=None):
        """``(LocationRequest, LocationPlan)``: the request and its public plan (the query's cell is
        the secret, used once)."""
        req = seeded(self.knn, rng).request(np.asarray(features, dtype=np.float64))
        return req, self.plan

    def cap(self, body: dict) -> int:
        # at most what the plan counted (ids, codes and payloads of the size the collection published,
        # on this client's wire), never more than the request's shape allows
        return min(super().cap(body), self.plan.answer_bytes())

    def too_large(self, exc):
        return MalformedAnswerError(
            f"{exc.message} The plan counted payloads of at most {self.docs._payload_plan(self.q.name)} bytes each "
            "(what the collection published when this query read it): payloads written since, or a server that "
            "publishes less than it stores, make an answer larger than the byte budget. Nothing of it was used; ask "
            "again (the next query reads the collection again and plans by what it publishes then).",
            exc.status, exc.error)

    def check(self, res: dict, req):
        pub = self.docs.document(self.q.name)
        try:
            return check_location_answer(res, req, n_items=int(pub.class_rows["n_items"]),
                                         codes_digest=self.docs.product_codes(self.q.name).digest(),
                                         run_id=pub.run_id)
        except InvalidInputError as exc:
            raise MalformedAnswerError(f"the answer is malformed: {exc}") from None

    def finish(self, res: dict, checked, req, secret, q_raw) -> dict:
        ids, codes, payloads = checked
        q = unit_query(q_raw)  # checked before the first request (Client.query)
        if self.q.rerank:
            order, d = rank(q, codes=codes, product_codes=self.docs.product_codes(self.q.name))
        else:
            order, d = np.arange(ids.size), np.zeros(ids.size)
        top = order[: int(self.q.k)]
        p = self.plan
        return {"item_ids": [int(v) for v in ids[top]], "distances": d[top].tolist(),
                **({} if payloads is None else {"payloads": [payloads[i] for i in top.tolist()]}),
                "level": p.level, "candidates": p.candidates, "code_bytes": p.code_bytes, "max_bytes": p.max_bytes,
                "n_cells": p.level, "shortlist": p.candidates, "label_predicted": False,
                "reranked": "codes" if self.q.rerank else False, "answer": "compact"}
