"""The one table of releases: every kind of private request pm_vector answers, with everything
the rest of the package needs to know about it.

A release is one row of :data:`RELEASES` (a :class:`Release`): its name, the ``"format"`` its
request document carries, its request and answer types, the client's check of a whole answer, its
privacy guarantee (what the ledger charges, stated by the release itself: the OpenDP habit), the
client's plan (a :class:`~pm_vector.client.releases.base.ReleaseQuery` under
:mod:`pm_vector.client.releases`) and the server's resolver (dotted ``"module:attr"`` names, loaded on use: this
module sits below both the client and the server and imports neither), how the service checks
its body, and the run tables it reads. The default release is picked by ONE rule,
:func:`default_release`.

Nothing else in :mod:`pm_vector` switches on a release's name, format or request class: it asks
this table (:func:`by_name`, :func:`by_format`, :func:`by_request`). ``tools/release_switches.py``
counts the places that still do. A new release is one :func:`register` call (a test registers
its own: ``tests/service/test_release_registry.py``).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from ..errors import InvalidInputError
from .cell_request import CellRequest
from .class_rows import ClassRowsRequest
from .formats import CELL_FORMAT, CLASS_ROWS_FORMAT, LOCATION_FORMAT, PRIVATEMAIL_FORMAT, RELEASE_FORMAT
from .answers import check_rows_answer
from .location import LocationRequest, check_location_answer
from .paper import PrivateMailRequest, ReleaseRequest
from ..privacy.cell_release import GAUSSIAN_ABOVE  # the default rule's one threshold (measured)


@dataclass(frozen=True)
class Guarantee:
    """What a release guarantees and what the ledger charges for one request of it.

    ``epsilon_rule``: how eps is read from the request (documentation); ``delta``: the release's
    fixed delta (0.0 for a pure-eps release), or None when the request carries its own delta
    (approximate DP: the Gaussian class rows, the paper's protocol)."""

    epsilon_rule: str
    delta: float | None = 0.0
    charge_rule: str | None = None  # dotted "module:attr" of a charge of its own (the paper's conversion)

    @property
    def pure(self) -> bool:
        return self.delta == 0.0

    def charge(self, request: Any) -> tuple[float, float]:
        """``(eps, delta)`` the ledger charges for ``request`` (a request object or its dict)."""
        if self.charge_rule is not None:
            d = request if isinstance(request, Mapping) else request.to_dict()
            return tuple(load(self.charge_rule)(d))  # type: ignore[return-value]
        get = request.get if isinstance(request, Mapping) else (lambda k, d=None: getattr(request, k, d))
        eps = float(get("epsilon"))
        delta = float(get("delta") or 0.0) if self.delta is None else float(self.delta)
        return eps, delta


@dataclass(frozen=True)
class Release:
    """One release (module doc). ``answer_type``: the answer's class, None where the answer is a
    document (every built-in release: ``check_answer`` checks it whole, before the client's secret
    picks anything). ``answers``: the answer kinds the service may return for it, the
    first its default (``"compact"``: ids and product codes; ``"full"``; ``"features"``: raw
    features); ``class_rows``: one request row per class (a class-rows option such as
    ``shortlist`` or ``n_cells`` picks among these); ``wire_model``: the pydantic model of its
    request document (:mod:`pm_vector.protocol.wire`; a class or a dotted name): the HTTP service's
    validator and schema of the request, a member of the resolve body's union
    (:mod:`pm_vector.service.resolve_body`); ``service_check``: for a release without a wire model,
    the service's own check of the request document (``check(request_dict, settings, name, *, k,
    code_bytes) -> request object``, raising the service's 4xx); a release with neither is not served
    over HTTP; ``check_request``: dotted name of the server's checks of a parsed request beyond
    its type's own (``check(request)``, raising :class:`~pm_vector.errors.RequestError`), None when
    the type checks everything when it is built; ``explain``: dotted name of the server's
    ``explain(collection, request, k, include_features)``, None when the release has no EXPLAIN.
    ``code_prefix``: how a compact class-rows answer picks its code prefix
    (:func:`pm_vector.manifold.codes.compact_answer_shape`): ``"first"`` (the shortest published
    stage, the most candidates) or ``"longest"`` (the longest that leaves enough candidates), None
    for a release without that rule. ``shape``: how an answer of this release is described in one
    line (a format string over the answer's fields, :func:`describe`). ``replica_reads``: the
    service may read its answer on a streaming replica (the resolver takes ``read_conn``; the log
    is written on the primary). ``derived_tables``: the kinds of run tables (``run_<id>_<kind>``)
    its answer needs, kinds of the registry of :mod:`pm_vector.db.runs.kinds` (``KINDS``: how an
    erased item leaves each, where a sharded run keeps it, whether the query role reads it); a run
    has the tables of the releases it serves. ``run_parts``: when a run serves it, by the run's
    ``class_rows`` document (:meth:`served_by`): None every run (the run's embeddings are enough),
    ``()`` a run with ready class rows, ``("cells",)`` ready class rows and a ready ``"cells"`` part.
    The resolver is called as ``resolver(collection, request, raw, *, k, include_features, conn,
    read_conn, max_query_rows, shortlist, code_bytes, compact, class_scores, ef_search, log,
    received, t0, timings)`` and returns the answer document."""

    name: str
    wire_format: str
    request_type: type
    answer_type: type | None
    check_answer: Callable | None
    guarantee: Guarantee
    client_plan: str | Callable | None
    resolver: str | Callable
    derived_tables: tuple[str, ...] = ()
    run_parts: tuple[str, ...] | None = ()
    default_for: Callable[[float], bool] | None = None
    answers: tuple[str, ...] = ("compact", "full", "features")
    class_rows: bool = False
    wire_model: str | type | None = None
    service_check: str | Callable | None = None
    check_request: str | Callable | None = None
    explain: str | Callable | None = None
    code_prefix: str | None = None
    shape: str = ""
    replica_reads: bool = False
    description: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def parse(self, d: Mapping[str, Any]):
        """The request object of a request document (its type's ``from_dict``)."""
        return self.request_type.from_dict(d)

    def served_by(self, doc: Mapping[str, Any] | None) -> bool:
        """Does a run with the ``class_rows`` document ``doc`` serve this release (``run_parts``)?"""
        if self.run_parts is None:
            return True
        doc = doc or {}
        return doc.get("status") == "ready" and all((doc.get(p) or {}).get("status") == "ready"
                                                    for p in self.run_parts)

    def resolve(self, *args, **kwargs):
        """The server's resolver, loaded on use."""
        return load(self.resolver)(*args, **kwargs)


def _below_gaussian(epsilon: float) -> bool:
    return float(epsilon) < GAUSSIAN_ABOVE


def _paper_charge(d: Mapping[str, Any]) -> tuple[float, float]:
    """The paper's protocol: its request's nominal (eps, delta) converted to what the client's data
    is guaranteed (:func:`pm_vector.client.privatemail.paper_charge`)."""
    try:
        eps, delta = float(d["epsilon"]), float(d["delta"])
    except (KeyError, TypeError, ValueError):
        raise InvalidInputError("the request names no valid epsilon/delta to charge; build it with "
                                "build_request().") from None
    return load("pm_vector.client.privatemail:paper_charge")(eps, delta, d.get("mechanism", "analytic"))


_R = "pm_vector.db.resolve.resolution:"
_W = "pm_vector.protocol.wire:"
_Q = "pm_vector.client.releases."

#: name -> release, in the default rule's order of preference (the table)
RELEASES: dict[str, Release] = {}
_BY_FORMAT: dict[str, Release] = {}
_BY_TYPE: dict[type, Release] = {}


def register(release: Release, *, replace: bool = False) -> Release:
    """Add ``release`` to the table (a test registers its own). Its name, format and request type
    must be new unless ``replace``. Returns it."""
    if not isinstance(release, Release):
        raise InvalidInputError(f"register takes a Release, got {type(release).__name__}.")
    if not replace:
        for key, index in ((release.name, RELEASES), (release.wire_format, _BY_FORMAT),
                           (release.request_type, _BY_TYPE)):
            if key in index:
                raise InvalidInputError(f"a release with {key!r} is already registered.")
    old = RELEASES.get(release.name)
    if old is not None:
        unregister(old.name)
    RELEASES[release.name] = release
    _BY_FORMAT[release.wire_format] = release
    _BY_TYPE[release.request_type] = release
    return release


def unregister(name: str) -> None:
    """Remove a release from the table (a test's own, when it is done)."""
    rel = RELEASES.pop(name, None)
    if rel is not None:
        _BY_FORMAT.pop(rel.wire_format, None)
        _BY_TYPE.pop(rel.request_type, None)


def by_name(name: str) -> Release:
    try:
        return RELEASES[name]
    except (KeyError, TypeError):
        raise InvalidInputError(f"release must be one of {list(RELEASES)}, not {name!r:.60}.") from None


def by_format(fmt: Any) -> Release | None:
    """The release whose requests carry ``"format": fmt``; None for an unknown format."""
    try:
        return _BY_FORMAT.get(fmt)
    except TypeError:  # an unhashable format value
        return None


def by_request(obj: Any) -> Release | None:
    """The release of a request object (by its exact type) or document (by its format); None."""
    if isinstance(obj, Mapping):
        return by_format(obj.get("format"))
    return _BY_TYPE.get(type(obj))


def request_types() -> dict[str, type]:
    """format -> request type, of every registered release."""
    return {fmt: rel.request_type for fmt, rel in _BY_FORMAT.items()}


_LOADED: dict[str, Any] = {}


def load(dotted):
    """The object a ``"module:attr"`` name names (imported once, cached); a callable is itself (a
    release registered by a test may name its hooks directly)."""
    if callable(dotted):
        return dotted
    hit = _LOADED.get(dotted)
    if hit is None:
        module, _, attr = dotted.partition(":")
        hit = getattr(importlib.import_module(module), attr)
        _LOADED[dotted] = hit
    return hit


def describe(doc: Mapping[str, Any], name: str | None = None) -> str:
    """One line naming the release of an answer (or a benchmark's row) and its public shape, e.g.
    ``"cells K=64"`` or ``"location M=256, 40x16 B"``: the release's ``shape`` formatted with the
    document's fields (the name alone when a field is missing)."""
    name = doc.get("release") if name is None else name
    rel = RELEASES.get(name) if isinstance(name, str) else None
    if rel is None or not rel.shape:
        return str(name or "")
    try:
        return f"{rel.name} {rel.shape.format(**doc)}"
    except (KeyError, ValueError, TypeError, IndexError):
        return rel.name


def default_release(epsilon: float, served: Iterable[str] | None = None, *, class_rows: bool = False) -> Release:
    """THE default rule: the first release of the table (in its order) that the collection serves
    (``served``: release names; None: every release), that is a class-rows release when the caller
    gave a class-rows option (``class_rows``), and whose ``default_for(epsilon)`` holds. Releases
    without ``default_for`` are never a default. A pure public function of eps and of what the
    collection publishes."""
    try:
        e = float(epsilon)
    except (TypeError, ValueError):
        raise InvalidInputError(f"epsilon must be a number > 0 (or inf); got {epsilon!r:.40}.") from None
    if math.isnan(e) or e <= 0:
        raise InvalidInputError(f"epsilon must be a number > 0 (or inf); got {epsilon!r:.40}.")
    names = None if served is None else set(served)
    for rel in RELEASES.values():
        if rel.default_for is None or (names is not None and rel.name not in names):
            continue
        if class_rows and not rel.class_rows:
            continue
        if rel.default_for(e):
            return rel
    return RELEASES["gaussian"]


# ----------------------------------------------------------------------------- the table

register(Release(
    name="location", wire_format=LOCATION_FORMAT, request_type=LocationRequest, answer_type=None,
    check_answer=check_location_answer,
    guarantee=Guarantee("the request's epsilon (M-ary randomized response over the whole anchor's cells)", 0.0),
    client_plan=_Q + "location:LocationQuery", resolver=_R + "resolve_location_request",
    derived_tables=("codes", "locations"), run_parts=("locations",), default_for=_below_gaussian, answers=("compact",),
    shape="M={level}, {candidates}x{code_bytes} B", replica_reads=True,
    wire_model=_W + "LocationRequestBody",
    description="one reported public cell of the whole collection; the answer its top-hub candidates' codes"))
register(Release(
    name="cells", wire_format=CELL_FORMAT, request_type=CellRequest, answer_type=None,
    check_answer=check_rows_answer,
    guarantee=Guarantee("the request's epsilon (K-ary randomized response per class)", 0.0),
    client_plan=_Q + "cells:CellsQuery", resolver=_R + "resolve_cell_request",
    derived_tables=("codes", "cells"), run_parts=("cells",), default_for=_below_gaussian, class_rows=True,
    code_prefix="first",
    shape="K={n_cells}", replica_reads=True,
    wire_model=_W + "CellRequestBody", explain=_R + "explain_cell_request",
    description="one reported public cell per class"))
register(Release(
    name="gaussian", wire_format=CLASS_ROWS_FORMAT, request_type=ClassRowsRequest, answer_type=None,
    check_answer=check_rows_answer,
    guarantee=Guarantee("the request's (epsilon, delta) (Gaussian noise on one row per class)", None),
    client_plan=_Q + "class_rows:GaussianQuery", resolver=_R + "resolve_class_rows_request",
    derived_tables=("codes", "prior", "neighbors", "hubs"), default_for=lambda e: True, class_rows=True,
    code_prefix="longest", replica_reads=True,
    wire_model=_W + "ClassRowsRequestBody",
    check_request="pm_vector.db.resolve.requests:check_class_rows", explain=_R + "explain_class_rows_request",
    description="one noised row per class (the class-rows request)"))
register(Release(
    name="privatemail", wire_format=PRIVATEMAIL_FORMAT, request_type=PrivateMailRequest, answer_type=None,
    check_answer=None,
    guarantee=Guarantee("the request's (epsilon, delta), the paper's conversion", None,
                        __name__ + ":_paper_charge"),
    client_plan=_Q + "paper:PaperQuery", resolver=_R + "resolve_paper_request",
    derived_tables=("anchors", "items"), run_parts=None, answers=("full", "features"),
    wire_model=_W + "PrivateMailRequestBody",
    check_request="pm_vector.db.resolve.requests:check_paper_rows", explain=_R + "explain_paper_request",
    description="the paper's protocol (PrivateMail), post-processed by the client"))
register(Release(
    name="privatemail-release", wire_format=RELEASE_FORMAT, request_type=ReleaseRequest, answer_type=None,
    check_answer=None,
    guarantee=Guarantee("the request's (epsilon, delta), the paper's conversion", None,
                        __name__ + ":_paper_charge"),
    client_plan=None, resolver=_R + "resolve_paper_request",
    derived_tables=("anchors", "items"), run_parts=None, answers=("full", "features"),
    check_request="pm_vector.db.resolve.requests:check_paper_rows", explain=_R + "explain_paper_request",
    description="the paper's private first iteration only; the server post-processes"))

__all__ = ["GAUSSIAN_ABOVE", "Guarantee", "RELEASES", "Release", "by_format", "by_name", "by_request",
           "default_release", "describe", "load", "register", "request_types", "unregister"]
