"""The client's side of each release, one module per release: what :meth:`Client.query
<pm_vector.client.http.Client.query>` does between picking the release and returning its result.

::

    Client.query -> pick (:func:`pick`: the table's one rule,
                          :func:`pm_vector.protocol.releases.default_release`)
                 -> plan (the release's :class:`~.base.ReleaseQuery`) -> plan.build (charged)
                 -> the transport's exchange (plan.body, plan.cap)
                 -> plan.check (the WHOLE answer, before the secret is used) -> plan.finish (re-rank)

Modules: :mod:`.base` (the query as asked and the steps every plan has), :mod:`.location` (one
report over the whole collection), :mod:`.class_rows` (the Gaussian class rows, and the answer of
one list per class row that the cell release shares), :mod:`.cells` (one reported cell per class),
:mod:`.paper` (the paper's protocol). A plan gets the public documents, the query and the ledger
entry when it is made and never calls back into :mod:`pm_vector.client.http`.

Which plan a release has is the table's (:mod:`pm_vector.protocol.releases`): its ``client_plan``
names a :class:`~.base.ReleaseQuery` (a dotted name, or the class itself: a test registers a
release of its own that way); a release without one is not asked by the client.
"""

from __future__ import annotations

from ...errors import InvalidInputError
from ...protocol import releases as table
from .base import Query, ReleaseQuery

#: the table's release of ``protocol="privatemail_paper"``
PAPER = "privatemail"

__all__ = ["PAPER", "Query", "ReleaseQuery", "choose", "options", "pick", "query_class"]


def query_class(rel: table.Release) -> type[ReleaseQuery] | None:
    """The client plan of the release ``rel`` (None: the client cannot ask it)."""
    plan = table.load(rel.client_plan) if isinstance(rel.client_plan, str) else rel.client_plan
    return plan if isinstance(plan, type) and issubclass(plan, ReleaseQuery) else None


def _askable(rel: table.Release) -> bool:
    cls = query_class(rel)
    return cls is not None and cls.protocol == "pm_vector"


def options() -> list[str]:
    """The ``release`` option's values: ``"auto"`` and every release of the table the pm_vector
    protocol asks."""
    return ["auto", *(r.name for r in table.RELEASES.values() if _askable(r))]


def choose(docs, name: str, epsilon: float, release: str = "auto", *, class_rows: bool = False) -> str:
    """``release`` itself, or for ``"auto"`` the table's one default rule
    (:func:`~pm_vector.protocol.releases.default_release`) over the releases the collection's
    active run serves (each plan's :meth:`~.base.ReleaseQuery.served`); ``class_rows``: the caller
    gave a class-rows option, so the rule picks among the class-rows releases."""
    rel = table.RELEASES.get(release) if isinstance(release, str) else None
    if release != "auto" and (rel is None or not _askable(rel)):
        raise InvalidInputError(f"release must be one of {options()}, not {release!r:.60}.")
    if release != "auto":
        return release
    served = [r.name for r in table.RELEASES.values()
              if r.default_for is not None and _askable(r) and query_class(r).served(docs, name)]
    return table.default_release(epsilon, served, class_rows=class_rows).name


def pick(docs, q: Query) -> table.Release:
    """The release of the query ``q``: the paper's for ``protocol="privatemail_paper"``, else
    :func:`choose`."""
    if q.protocol == "privatemail_paper":
        if q.release not in ("auto", "gaussian") or q.n_cells is not None:
            raise InvalidInputError("release and n_cells apply to the pm_vector protocol (the paper's protocol "
                                    "is its own release).")
        return table.by_name(PAPER)
    if q.protocol != "pm_vector":
        raise InvalidInputError(f"protocol must be 'pm_vector' or 'privatemail_paper', not {q.protocol!r}.")
    return table.by_name(choose(docs, q.name, q.epsilon, q.release, class_rows=q.class_rows))
