"""HTTP client of the pm_vector service: private nearest-neighbour queries with a privacy budget.

    from pm_vector.client.http import Client
    from pm_vector.client.budget import PrivacyBudget

    with Client("http://127.0.0.1:8000", "pmv_...") as c:   # ledger: $PM_VECTOR_HOME/client/budget.json
        c.budget.set_budget(c.budget_key(), epsilon=20.0)   # this server; default: eps 10, delta 1e-4 in total
        hit = c.query("digits", x, label=3, epsilon=1.0)
        hit["item_ids"], hit["labels"], hit["distances"], hit["budget"]

Budget: the ledger (:class:`~pm_vector.client.budget.PrivacyBudget`; ``budget=None`` is the
default ledger with the default budget -- never unlimited) is keyed by the server's origin as
given to this client (:meth:`Client.budget_key`: ``"origin:scheme://host:port"`` of
``base_url``, normalised): one budget per server, for all its collections, chosen by the client
alone. Nothing the server publishes or answers (collection ids, run ids, a dropped and re-created
collection) selects an entry, so a server cannot open a fresh budget; a new :class:`Client` for
the same URL shares the entry. Every path that releases noise charges it once, before the noise
is drawn: :meth:`query`, :meth:`build_request` (both protocols; the paper's release included),
:class:`~pm_vector.client.query.PrivateKNN` objects from :meth:`private_knn` (per request), and
:meth:`resolve` of a request this client did not build. No public method takes a seed: they
refuse private (underscore) and unknown keywords with a :class:`TypeError`.

What happens in :meth:`Client.query`, one way down (no step calls back into this module):

1. **pick**: the release, by the table's one rule (:func:`pm_vector.client.releases.pick`, which asks
   :func:`pm_vector.protocol.releases.default_release` among the releases the collection's active
   run serves);
2. **build**: the release's client plan (:mod:`pm_vector.client.releases`: ``location``, ``cells``,
   ``class_rows``, ``paper``) reads the collection's public anchor document (fetched once per active
   run and verified: :mod:`pm_vector.client.public_documents`; loading it builds nothing else),
   builds the request locally and charges the budget before any noise is drawn (a query that would
   exceed it raises :class:`~pm_vector.errors.BudgetExceededError`: nothing is released or sent);
3. **exchange**: ``POST /collections/{name}/resolve`` through the transport
   (:mod:`pm_vector.client.transport`), its answer bounded by the plan's byte cap;
4. **check**: the WHOLE answer, before the secret is used (an error must not depend on which row
   is real);
5. **re-rank**: the real row's candidates by their product codes (compact answers: ids and the
   prefix of the published :class:`~pm_vector.manifold.codes.ProductCodes`, checked against the
   digest the run publishes) or raw features (``answer="features"``), locally
   (:mod:`pm_vector.client.rerank`). Nothing is requested after the answer: the payloads, when the
   collection stores them, come with it. The result's ``delta`` is the release's guarantee as the
   table states it (:class:`~pm_vector.protocol.releases.Guarantee`).

:meth:`Client.kahm_distances` makes a collection behind a service a party of federated KAHM
classification (:func:`pm_vector.db.kahm.roles.federated_classify`)::

    federated_classify(["local_coll", lambda Q: c.kahm_distances("remote_coll", Q)], Q)
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import numpy as np

from .._validation import unit_query
from ..errors import InvalidInputError, MalformedAnswerError
from ..privacy.location import check_max_bytes
from ..protocol.codec import JSON, MSGPACK
from ..protocol.frame import FRAME_TOLERANCE  # noqa: F401  (its old home)
from . import releases
from .budget import LedgerAccount, PrivacyBudget, origin_key, server_origin
from .privatemail import request_charge
from .public_documents import PublicDocument, PublicDocuments, VerifiedFrame
from .releases.base import Query
from .releases.cells import cell_knn
from .releases.class_rows import knn
from .releases.location import location_knn
from .transport import WIRES, ServiceError, Transport, wire_bytes  # noqa: F401  (wire_bytes: its old home)
from ..deprecation import renamed

#: the ``release`` option of :meth:`Client.query` (:func:`pm_vector.client.releases.options`: the table's)
RELEASES = tuple(releases.options())


def __getattr__(name):  # old names (pm_vector.deprecation.RENAMED), until its REMOVED_IN

    return renamed(__name__, name)


def _fingerprint(request) -> str:
    d = request.to_dict() if hasattr(request, "to_dict") else request
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


#: the paper protocol's options (:class:`~pm_vector.client.PrivateMail`) that :meth:`Client.build_request`
#: and :meth:`Client.query` pass on; nothing else is forwarded
PAPER_OPTIONS = ("dp_sigma", "dp_alpha", "mechanism", "n_post_iter", "post_alpha")


def _check_options(options: dict[str, Any]) -> None:
    """A public method's extra keywords: the paper's options only (TypeError otherwise, before
    anything is fetched, charged or sent)."""
    private = sorted(k for k in options if k.startswith("_"))
    if private:
        raise TypeError(f"private keyword(s) {private} are not accepted here: no seed reaches a client-facing "
                        "method (a seeded request is not a private release).")
    unknown = sorted(set(options) - set(PAPER_OPTIONS))
    if unknown:
        raise TypeError(f"unexpected keyword(s) {unknown}; protocol='privatemail_paper' takes "
                        f"{list(PAPER_OPTIONS)}.")


class Client(Transport, PublicDocuments):
    """A pm_vector service client. ``budget``: a :class:`PrivacyBudget` (or
    :class:`~pm_vector.client.budget.MemoryBudget`), a ledger path, or None: the default ledger
    (``$PM_VECTOR_HOME/client/budget.json``) with the default budget. Never unlimited. Every
    release goes to the ledger entry of ``base_url``'s origin (:meth:`budget_key`).

    ``wire``: ``"msgpack"`` (default: bodies sent as ``application/msgpack``, answers asked for in
    it, numpy arrays travelling as arrays; :mod:`pm_vector.protocol.codec`) or ``"json"``. An
    answer is read by its ``Content-Type`` whichever was asked (a service that answers JSON only
    still works). Documents from msgpack answers hold numpy arrays where the server sent arrays.

    ``timeout``: every exchange's one deadline in seconds, from connecting to the answer's last
    byte, and that of all the exchanges of one :meth:`query` together; answers are bounded in
    bytes and objects (:mod:`pm_vector.client.transport`)."""

    def __init__(self, base_url: str, api_key: str | None, *, budget: PrivacyBudget | str | None = None,
                 timeout: float = 60.0, transport=None, wire: str = "msgpack", max_answer_bytes: int | None = None):
        #: what one private query may cost on the wire, both ways (the location release's plan, whose
        #: check it is: :func:`~pm_vector.privacy.location.check_max_bytes`); a query's ``max_bytes`` overrides it
        self.max_answer_bytes = check_max_bytes(max_answer_bytes)
        if wire not in WIRES:
            raise InvalidInputError(f"wire must be one of {sorted(WIRES)}, not {wire!r}.")
        self.wire = wire
        self._media = WIRES[wire]
        #: the path and bytes (:func:`wire_bytes`) of this client's latest request
        self.last_exchange: dict[str, Any] | None = None
        self.origin = server_origin(base_url)  # validates; the budget's key, fixed for this client
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        headers["Accept"] = f"{MSGPACK}, {JSON};q=0.5" if wire == "msgpack" else JSON
        self._http = self._http_client(self.base_url, headers, timeout, transport)  # one deadline per exchange
        if budget is None or isinstance(budget, str) or hasattr(budget, "__fspath__"):
            budget = PrivacyBudget(budget)
        if not isinstance(budget, PrivacyBudget):
            raise InvalidInputError(f"budget must be a PrivacyBudget, a ledger path or None (the default ledger); "
                                    f"got {type(budget).__name__}.")
        self.budget = budget
        self._ids: dict[str, str | None] = {}  # collection ids as published: information, never a budget key
        self._folded = False
        self._built: set[str] = set()  # fingerprints of requests built (and charged) by this client
        self._frames: dict[str, VerifiedFrame] = {}  # per collection, for its active run
        self._public: dict[str, PublicDocument] = {}

    def collection_id(self, name: str) -> str | None:
        """The collection's id as the service publishes it (None from a service that does not).
        Information only (e.g. to notice a re-created collection): it never selects a budget."""
        if name not in self._ids:
            c = self.collection(name)
            uid = c.get("uuid") or c.get("collection_uuid")
            if uid is None:
                uid = self.anchor_document(name).get("collection_uuid")
            self._ids[name] = None if uid is None else str(uid)
        return self._ids[name]

    def budget_key(self) -> str:
        """This client's ledger key: ``"origin:" + self.origin``, the origin of ``base_url`` as given
        (:func:`~pm_vector.client.budget.server_origin`), the same for every collection of the server
        and for every :class:`Client` of that URL. Entries an earlier client kept per collection id
        of this server are folded into it on first use (:meth:`PrivacyBudget.fold`)."""
        key = origin_key(self.origin)
        if not self._folded:
            self.budget.fold(key, self.origin, label=self.origin)
            self._folded = True
        return key

    def account(self) -> LedgerAccount:
        """The ledger entry of this client's server as an accountant: pass it as ``accountant=`` to a
        :class:`~pm_vector.client.query.PrivateKNN` or :class:`~pm_vector.client.PrivateMail` built
        by hand to charge this server's budget."""
        return self.budget.account(self.budget_key())

    def _account(self, name: str) -> LedgerAccount:
        return self.budget.account(self.budget_key(), label=name)

    # ------------------------------------------------------------------ endpoints
    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def collections(self) -> list[dict[str, Any]]:
        return self._call("GET", "/collections")["collections"]

    def items(self, name: str, ids, include_features: bool = False) -> dict[str, Any]:
        return self._call("POST", f"/collections/{name}/items",
                          {"ids": [int(i) for i in ids], "include_features": include_features})

    def start_job(self, name: str, params: dict[str, Any] | None = None, seed: int = 0) -> dict[str, Any]:
        return self._call("POST", f"/collections/{name}/jobs", {"params": params or {"n_components": 8},
                                                                 "seed": int(seed)})

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/jobs/{job_id}")

    def wait_job(self, job_id: str, timeout: float = 600.0, poll: float = 0.2, progress=None) -> dict[str, Any]:
        t0 = time.monotonic()
        while True:
            j = self.job(job_id)
            if progress is not None:
                progress(j)
            if j["status"] in ("succeeded", "failed"):
                if j["status"] == "failed":
                    raise ServiceError(500, "job_failed", j.get("error") or "the job failed.")
                return j
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"job {job_id} still {j['status']} after {timeout:.0f} s.")
            time.sleep(poll)

    def resolve(self, name: str, request, *, k: int = 8, include_features: bool = False, answer: str | None = None,
                code_bytes: int | None = None) -> dict[str, Any]:
        """Send a request. One this client built was charged when it was built; any other (built
        elsewhere, or edited) is charged its ``epsilon``/``delta`` here before it is sent.
        ``answer``: ``"compact"`` (the service's default for pm_vector requests: ids and product
        codes, ``code_bytes`` of each), ``"features"`` or ``"full"`` (see the resolve endpoint)."""
        d = request.to_dict() if hasattr(request, "to_dict") else request
        if not isinstance(d, dict):
            raise InvalidInputError("request must be a request object or its dict (to_dict()).")
        if _fingerprint(d) not in self._built:
            eps, dlt = request_charge(d)  # the paper's protocol: what it costs between real queries
            self._account(name).spend(eps, dlt, label=name)
        body = {"request": d, "k": int(k), "include_features": bool(include_features)}
        if answer is not None:
            body["answer"] = answer
        if code_bytes is not None:
            body["code_bytes"] = int(code_bytes)
        return self._call("POST", f"/collections/{name}/resolve", body)

    # ------------------------------------------------------------------ KAHM
    def kahm_models(self, name: str) -> list[dict[str, Any]]:
        """The collection's stored KAHM models, newest first."""
        return self._call("GET", f"/collections/{name}/kahm/models")["models"]

    def kahm_distances(self, name: str, features, model_id: int | None = None) -> dict[str, Any]:
        """The remote collection as a party of federated classification.

        Returns :func:`pm_vector.db.kahm.roles.party_distances`' shape -- ``{"party", "model_id", "n_features",
        "classes", "distances": {class (int): float64 array, one value per row}}`` (JSON's null back to
        ``inf``) -- so a remote party plugs into :func:`pm_vector.db.kahm.roles.federated_classify`::

            federated_classify(["local", lambda Q: client.kahm_distances("remote", Q)], Q)

        Only the feature rows are sent (they are not privatised: send them to parties you trust with them)."""
        X = np.asarray(features, dtype=np.float64)
        if X.ndim == 1:
            X = X[None, :]
        if X.ndim != 2 or X.shape[0] == 0:
            raise InvalidInputError(f"features must be a (rows, features) array; got shape {X.shape}.")
        if not np.all(np.isfinite(X)):
            raise InvalidInputError("features contain NaN or infinite values; clean or drop those rows.")
        body: dict[str, Any] = {"features": X}
        if model_id is not None:
            body["model_id"] = int(model_id)
        res = self._call("POST", f"/collections/{name}/kahm/distances", body)
        res["distances"] = {int(c): np.array([np.inf if v is None else v for v in vals], dtype=np.float64)
                            for c, vals in res["distances"].items()}
        res["classes"] = [int(c) for c in res.get("classes", [])]
        return res

    def build_request(self, name: str, features, label: int | None = None, *, epsilon: float, delta: float = 1e-5,
                      protocol: str = "pm_vector", shortlist: int | None = None, release: str = "auto",
                      n_cells: int | None = None, max_bytes: int | None = None, **paper_options):
        """``(request, secret)`` built locally and charged to the budget (before its noise is drawn;
        :class:`~pm_vector.errors.BudgetExceededError` releases nothing); nothing is sent.
        ``protocol="pm_vector"`` (default): ``release="auto"`` (the default, as :meth:`query`) the release
        :meth:`choose_release` picks; ``"location"`` a :class:`~pm_vector.protocol.location.LocationRequest`
        (one report over the whole collection, its plan by the public rule under ``max_bytes``, default
        the client's ``max_answer_bytes``), charged (eps, 0); ``release="gaussian"`` a
        :class:`~pm_vector.client.query.ClassRowsRequest` (``label=None``: the label-free client), charged
        (eps, delta); ``release="cells"`` a :class:`~pm_vector.client.request.CellRequest` (level
        ``n_cells``, None: the public rule), charged (eps, 0); ``"auto"``: :meth:`choose_release`.
        ``"privatemail_paper"``: the paper's request (:class:`~pm_vector.client.PrivateMail`;
        ``paper_options``: any of :data:`PAPER_OPTIONS`). Private (underscore) or unknown keywords
        raise :class:`TypeError`: no seed reaches this method."""
        _check_options(paper_options)
        unit_query(features)  # a zero or underflowing query is refused before anything is asked or charged
        with self._query_scope(discard=False):  # the request is handed out: its charge stays
            return self._build_request(name, features, label, epsilon=epsilon, delta=delta, protocol=protocol,
                                       shortlist=shortlist, release=release, n_cells=n_cells, max_bytes=max_bytes,
                                       options=paper_options)

    # ------------------------------------------------------------------ one path: pick -> build -> exchange -> check
    def _plan(self, name, *, epsilon, delta=1e-5, protocol="pm_vector", release="auto", k=8, shortlist=None,
              n_cells=None, max_bytes=None, answer=None, rerank=True, options=None):
        """The query's plan: the release picked by the table's one rule (:func:`releases.pick`) and its
        client plan (:mod:`pm_vector.client.releases`), given the public documents and this server's
        ledger entry."""
        q = Query(name=name, epsilon=epsilon, delta=delta, protocol=protocol, release=release, k=k,
                  shortlist=shortlist, n_cells=n_cells, answer=answer, rerank=rerank, options=dict(options or {}),
                  max_bytes=self.max_answer_bytes if max_bytes is None else max_bytes,
                  bytes_given=max_bytes is not None)
        rel = releases.pick(self, q)
        return releases.query_class(rel)(self, q, self._account(name))

    def _build_request(self, name, features, label=None, *, rng=None, **query):
        """:meth:`build_request`; ``rng`` (an int or a Generator: tests only, never reached from a public
        method) drives dummies and noise, the request says ``seeded`` and is not charged (not a
        private release; a service refuses it unless its settings allow seeded requests)."""
        req, secret = self._plan(name, **query).build(features, label, rng)
        self._built.add(_fingerprint(req))
        return req, secret

    def query(self, name: str, features, label: int | None = None, *, epsilon: float, delta: float = 1e-5,
              k: int = 8, shortlist: int | None = None, protocol: str = "pm_vector", rerank: bool = True,
              answer: str = "compact", release: str = "auto", n_cells: int | None = None,
              max_bytes: int | None = None, **paper_options) -> dict[str, Any]:
        """One private k-NN query; returns the real row's answer (``item_ids``, ``distances``, and
        ``payloads`` when the collection stores any; a raw-feature answer also ``labels`` and
        ``external_ids``) with ``epsilon``, ``delta``, ``budget`` (the server's entry after the
        charge), ``timing``, ``wire`` and the resolve's bytes on the wire (:func:`wire_bytes`):
        ``bytes_sent``, ``bytes_received`` and ``bytes_per_request``, their sum.

        pm_vector protocol, ``answer="compact"`` (default): the server answers every class row with
        ``k'`` candidates, their ids and the prefix of ``b`` bytes of their product codes (for
        every row alike); ``(k', b)`` are :func:`~pm_vector.manifold.codes.compact_answer_shape` of
        the rows, the release, epsilon and the published code widths (``shortlist``: k' given,
        ``b`` still from the rule). The client checks the answer's codes digest against the
        published codes, re-ranks its real row by
        :meth:`~pm_vector.manifold.codes.ProductCodes.distances` (asymmetric: its exact query against
        the coded candidates) and keeps ``k``. ``answer="features"`` (collections that allow raw
        features): every row's candidates with their raw features (``shortlist`` or the default
        k'), the real row re-ranked by them. No request follows the answer. ``reranked`` in the
        result: ``"codes"``, ``"features"`` or false (``rerank=False``: server score order kept).
        The paper's protocol ignores ``answer``: raw features when the collection allows them.

        ``release`` (pm_vector protocol): ``"auto"`` (default: the table's one rule,
        :meth:`choose_release`: below eps 512 the location release when the collection serves it, else
        the cell release), ``"location"`` (ONE report of the query's
        public cell over the whole collection, pure eps; the answer is ``candidates`` ids and code
        prefixes of the width the public plan chooses under ``max_bytes``, default the client's
        ``max_answer_bytes``; the result says ``level``, ``candidates``, ``code_bytes``), ``"cells"`` (one reported public cell per class, pure eps: delta 0;
        ``n_cells`` the level K, None: the public rule for eps) or ``"gaussian"`` (the noised class
        rows, (eps, delta)). The result's ``release`` says which was used (``"privatemail_paper"`` for
        the paper's protocol), ``delta`` what was charged.
        ``paper_options``: any of :data:`PAPER_OPTIONS` (``protocol="privatemail_paper"``); private
        (underscore) or unknown keywords raise :class:`TypeError`. A query that is not finite, is
        zero, or whose norm underflows or is subnormal raises :class:`InvalidInputError` before the
        first request (:func:`pm_vector._validation.unit_query`)."""
        _check_options(paper_options)
        unit_query(features)  # a zero or underflowing query is refused before the first request
        with self._query_scope():  # one run, bounded answers, one error type (pm_vector.client.transport)
            return self._query(name, features, label, epsilon=epsilon, delta=delta, k=k, shortlist=shortlist,
                               protocol=protocol, rerank=rerank, answer=answer, release=release,
                               n_cells=n_cells, max_bytes=max_bytes, options=paper_options)

    def _query(self, name, features, label=None, *, k=8, answer="compact", rng=None, **query) -> dict[str, Any]:
        """:meth:`query`: pick -> build (charged) -> exchange -> check (the WHOLE answer, before the
        secret is used) -> re-rank, each step the release's (:mod:`pm_vector.client.releases`);
        ``rng``: see :meth:`_build_request` (tests only)."""
        if answer not in ("compact", "features"):
            raise InvalidInputError(f"answer must be 'compact' or 'features', not {answer!r}.")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 1000:
            raise InvalidInputError(f"k must be an integer in 1..1000; got {k!r:.40}.")
        plan = self._plan(name, k=k, answer=answer, **query)
        q_raw = np.asarray(features, dtype=np.float64).ravel()
        t0 = time.perf_counter()
        req, secret = plan.build(features, label, rng)
        self._built.add(_fingerprint(req))
        t1 = time.perf_counter()
        status = self.budget.status(self.budget_key())  # charged by the build
        body = plan.body(req)
        try:
            res, sent, received = self._exchange("POST", f"/collections/{name}/resolve", body,
                                                 max_bytes=plan.cap(body))
        except MalformedAnswerError as exc:
            if exc.error != "too_large":
                raise
            raise plan.too_large(exc) from None
        self._check_run(name, res)
        t2 = time.perf_counter()
        # nothing below talks to the server: the answer is all the client uses, checked whole first
        out = plan.finish(res, plan.check(res, req), req, secret, q_raw)
        return {**out, "collection": name, "protocol": plan.q.protocol, "release": plan.release,
                "epsilon": float(plan.q.epsilon), "delta": plan.delta(req), "k": int(k), "run_id": res.get("run_id"),
                "budget": status, "bytes_sent": sent, "bytes_received": received,
                "bytes_per_request": sent + received, "wire": self.wire,
                "timing": {"build_ms": (t1 - t0) * 1000, "resolve_ms": (t2 - t1) * 1000,
                           "total_ms": (time.perf_counter() - t0) * 1000}}

    # ------------------------------------------------------------------ the releases' clients, by hand
    def choose_release(self, name: str, epsilon: float, release: str = "auto", *, class_rows: bool = False) -> str:
        """The release a query at ``epsilon`` uses: ``release`` itself, or for ``"auto"`` the table's one
        default rule (:func:`pm_vector.protocol.releases.default_release`: the location release below eps
        512 when the collection serves it, else the cell release, the Gaussian from eps 512 or when
        neither is served). ``class_rows``: the caller gave a class-rows option (``shortlist``,
        ``n_cells``): ``"auto"`` then chooses among the class-rows releases only."""
        return releases.choose(self, name, epsilon, release, class_rows=class_rows)

    def private_knn(self, name: str, *, epsilon: float, delta: float = 1e-5, shortlist: int | None = None,
                    label_free: bool = False, refresh: bool = False):
        """The :class:`~pm_vector.client.query.PrivateKNN` of the collection's active run
        (:func:`pm_vector.client.releases.class_rows.knn`), charging this client's ledger per request."""
        if refresh:
            self.document(name, refresh=True)
        return knn(self, name, epsilon=epsilon, delta=delta, shortlist=shortlist, label_free=label_free,
                   account=self._account(name))

    def private_cells(self, name: str, *, epsilon: float, n_cells: int | None = None, shortlist: int | None = None):
        """The :class:`~pm_vector.client.cell_client.PrivateCellKNN` of the collection's active run
        (:func:`pm_vector.client.releases.cells.cell_knn`), charging this client's ledger (eps, 0) per request."""
        return cell_knn(self, name, epsilon=epsilon, n_cells=n_cells, shortlist=shortlist, account=self._account(name))

    def private_location(self, name: str, *, epsilon: float, max_bytes: int | None = None, **plan):
        """The :class:`~pm_vector.client.location.PrivateLocationKNN` of the collection's active run
        (:func:`pm_vector.client.releases.location.location_knn`; ``max_bytes`` None: this client's
        ``max_answer_bytes``), charging this client's ledger (eps, 0) per request."""
        return location_knn(self, name, epsilon=epsilon, account=self._account(name),
                            max_bytes=self.max_answer_bytes if max_bytes is None else max_bytes, **plan)
