"""What every release's client plan shares: the query as asked (:class:`Query`) and the steps of
one query (:class:`ReleaseQuery`), which :meth:`Client.query <pm_vector.client.http.Client.query>`
runs in order: build (charged) -> the resolve body and its byte cap -> the transport's exchange ->
check (the WHOLE answer, before the secret is used) -> finish (the re-rank).

A plan is given what it needs when it is made: the client's public documents and transport
(``docs``: :class:`~pm_vector.client.public_documents.PublicDocuments`), the query, and the ledger
entry to charge (``account``). It never calls back into :mod:`pm_vector.client.http`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import InvalidInputError
from ...privacy.rng import secure_generator
from ...protocol.releases import by_request


@dataclass(frozen=True)
class Query:
    """One query as the caller asked it. ``max_bytes``: the byte budget of the request on the wire,
    both ways (the caller's, else the client's ``max_answer_bytes``; checked once, by the location
    plan: :func:`~pm_vector.privacy.location.check_max_bytes`); ``bytes_given``: the caller named one.
    ``answer``: None when the request is only built (:meth:`Client.build_request`)."""

    name: str
    epsilon: float
    delta: float = 1e-5
    protocol: str = "pm_vector"
    release: str = "auto"
    k: int = 8
    shortlist: int | None = None
    n_cells: int | None = None
    max_bytes: int | None = None
    bytes_given: bool = False
    answer: str | None = "compact"
    rerank: bool = True
    options: dict = field(default_factory=dict)

    @property
    def class_rows(self) -> bool:
        """The caller gave a class-rows option (``shortlist``, ``n_cells``, raw features): the
        default rule picks among the class-rows releases."""
        return self.shortlist is not None or self.n_cells is not None or self.answer == "features"


def seeded(builder, rng):
    """``builder`` (a :class:`~pm_vector.client.charging.ChargedRelease`) driven by ``rng`` (an int or
    a Generator: tests only): not a private release, not charged; None: as it is."""
    if rng is not None:
        builder.accountant = None
        builder._inject_generator(rng if isinstance(rng, np.random.Generator) else secure_generator(int(rng)))
    return builder


class ReleaseQuery(abc.ABC):
    """One query of one release (module doc). ``release``: the table's name of it. A plan implements
    :meth:`build`, :meth:`check` and :meth:`finish` (abstract: a plan missing one cannot be made)."""

    release: str = ""
    #: the protocol that asks it (``Client.query(protocol=...)``)
    protocol: str = "pm_vector"
    #: the protocol options (:data:`~pm_vector.client.http.PAPER_OPTIONS`) this release takes
    takes_options: bool = False

    def __init__(self, docs, q: Query, account):
        if q.options and not self.takes_options:
            raise InvalidInputError(f"{sorted(q.options)} are options of protocol='privatemail_paper', not of the "
                                    "pm_vector protocol.")
        self.docs, self.q, self.account = docs, q, account

    @classmethod
    def served(cls, docs, name: str) -> bool:
        """The collection's active run serves this release (what the default rule may pick)."""
        return False

    def delta(self, req) -> float:
        """The delta of ``req``'s guarantee, as the table's release states it
        (:class:`~pm_vector.protocol.releases.Guarantee`: its fixed delta, else the request's own)."""
        g = by_request(req).guarantee
        return float(req.delta) if g.delta is None else float(g.delta)

    @abc.abstractmethod
    def build(self, features, label=None, rng=None) -> tuple[Any, Any]:
        """``(request, secret)``, charged to ``account`` before anything is drawn (``rng``: seeded,
        tests only, not charged)."""

    def body(self, req) -> dict:
        """The resolve body of ``req``."""
        return {"request": req.to_dict(), "k": int(self.q.k)}

    def cap(self, body: dict) -> int:
        """The most bytes its answer may have (:meth:`PublicDocuments._resolve_cap`)."""
        return self.docs._resolve_cap(self.q.name, body)

    def too_large(self, exc):
        """The error to raise for an answer the transport refused as too large."""
        return exc

    @abc.abstractmethod
    def check(self, res: dict, req) -> Any:
        """The WHOLE answer checked (before the secret picks anything); what :meth:`finish` uses."""

    @abc.abstractmethod
    def finish(self, res: dict, checked, req, secret, q_raw: np.ndarray) -> dict:
        """The real row's result, re-ranked: the release's fields of :meth:`Client.query`'s result."""
