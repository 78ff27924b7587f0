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

What happens in :meth:`Client.query`:

1. the collection's public anchor is fetched once per active run (ids, features, labels, the
   dummy pool, the frame's AnchorFrame parameters, seed and anchor embedding); the client
   rebuilds the AnchorFrame locally from the same parameters and seed and refuses to go on
   unless it reproduces the published anchor embedding;
2. the PrivateMail request is built locally (:class:`pm_vector.client.PrivateMail`); nothing
   has left the machine yet;
3. the budget is charged (:class:`pm_vector.client.budget.PrivacyBudget`) before the noise is
   drawn; a query that would exceed it raises :class:`~pm_vector.errors.BudgetExceededError` and
   nothing is released or sent;
4. the request is sent to ``POST /collections/{name}/resolve``; the answer has one entry per
   query row and the client keeps its real row's (the server cannot tell which it is);
5. the answer is compact by default: every row's candidate ids and the prefix of their product
   codes (:class:`~pm_vector.manifold.codes.ProductCodes`, fit on the public anchor set and
   published with it; the client checks the published codes against the digest the run
   publishes, and the answer's digest against both), so it costs about ``C k' (b + 4)`` bytes;
   ``k'`` and the prefix ``b`` come from the public rule
   :func:`~pm_vector.manifold.codes.compact_answer_shape` unless ``shortlist`` is given. The
   client re-orders its real row's candidates by their asymmetric distances to its own raw query
   (:meth:`~pm_vector.manifold.codes.ProductCodes.distances`) and keeps ``k``; with
   ``answer="features"`` (collections that allow raw features) the server returns every row's
   raw features instead (so asking reveals nothing about the real row) and the client re-orders by
   them (``reranked`` says ``"codes"``, ``"features"`` or false). Nothing is requested after
   the answer: the payloads, when the collection stores them, come with it.

:meth:`Client.kahm_distances` makes a collection behind a service a party of federated KAHM
classification (:func:`pm_vector.db.kahm.roles.federated_classify`)::

    federated_classify(["local_coll", lambda Q: c.kahm_distances("remote_coll", Q)], Q)
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import AlignmentError, InvalidInputError, PMVectorError
from ..protocol.codec import JSON, MSGPACK, decode, encode
from .budget import LedgerAccount, PrivacyBudget, origin_key, server_origin
from ..manifold.class_frames import ClassFrames
from .privatemail import PrivateMail, PublicAnchor
from ..privacy.rng import secure_generator
from .query import DEFAULT_SHORTLIST, PrivateKNN

FRAME_TOLERANCE = 1e-4
#: the ``release`` option of :meth:`Client.query`
RELEASES = ("auto", "cells", "gaussian")


class ServiceError(PMVectorError):
    """The service refused a request (4xx) or failed (5xx)."""

    def __init__(self, status: int, error: str, message: str):
        super().__init__(f"{status} {error}: {message}")
        self.status, self.error, self.message = status, error, message


def wire_bytes(r) -> tuple[int, int]:
    """``(sent, received)``: the bytes of an HTTP/1.1 exchange (an :class:`httpx.Response`, read)
    as they travel on the connection. Sent: the request line (``METHOD target HTTP/1.1``), every
    header line as sent (``Host``, ``Content-Length``, ``Authorization``, ``Accept`` ... each
    ``name: value`` + CRLF), the blank line and the body. Received: the status line, every header
    line as received, the blank line and the body's bytes as they arrived (before any
    content decoding). Not counted: TCP/IP and TLS framing, and chunk-size lines of a chunked
    answer (the service's answers carry a ``Content-Length``)."""
    req = r.request
    head = len(req.method) + 1 + len(req.url.raw_path) + len(" HTTP/1.1\r\n")
    head += sum(len(k) + 2 + len(v) + 2 for k, v in req.headers.raw) + 2
    sent = head + len(req.content)
    status = len(r.http_version) + 1 + len(str(r.status_code)) + 1 + len(r.reason_phrase.encode("latin-1")) + 2
    received = status + sum(len(k) + 2 + len(v) + 2 for k, v in r.headers.raw) + 2 + r.num_bytes_downloaded
    return sent, received


def rebuild_frame(doc: dict[str, Any]):
    """``(AnchorFrame, PublicAnchor)`` from an anchor document; checks the published anchor embedding."""
    from ..manifold import AnchorFrame

    fr = doc.get("frame") or {}
    params = {k: v for k, v in dict(fr.get("params") or {}).items() if k not in ("seed", "device")}
    if "seed" not in fr or fr.get("anchor_embedding") is None:
        raise InvalidInputError("the server's anchor document has no frame seed or anchor embedding; it cannot be "
                                "verified (is the collection embedded?).")
    anchor = PublicAnchor(doc["anchor_ids"], np.asarray(doc["features"], dtype=np.float64), doc["labels"],
                          np.asarray(doc["dummy_features"], dtype=np.float64), doc["dummy_labels"])
    frame = AnchorFrame(**params, seed=int(fr["seed"])).fit(anchor.features, anchor.labels)
    ref = np.asarray(fr["anchor_embedding"], dtype=np.float64)
    scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    if frame.anchor_embedding_.shape != ref.shape or \
            float(np.abs(frame.anchor_embedding_ - ref).max()) > FRAME_TOLERANCE * scale:
        raise AlignmentError("the anchor frame rebuilt from the published anchor set, parameters and seed does not "
                             "reproduce the published anchor embedding; refusing to query this collection (the "
                             "server's frame is not the public one, or versions differ).")
    return frame, anchor


def _fingerprint(request) -> str:
    import hashlib
    import json

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


#: the ``wire`` option of :class:`Client`: the media type bodies are sent in and answers asked for
WIRES = {"msgpack": MSGPACK, "json": JSON}


class Client:
    """A pm_vector service client. ``budget``: a :class:`PrivacyBudget` (or
    :class:`~pm_vector.client.budget.MemoryBudget`), a ledger path, or None: the default ledger
    (``$PM_VECTOR_HOME/client/budget.json``) with the default budget. Never unlimited. Every
    release goes to the ledger entry of ``base_url``'s origin (:meth:`budget_key`).

    ``wire``: ``"msgpack"`` (default: bodies sent as ``application/msgpack``, answers asked for in
    it, numpy arrays travelling as arrays; :mod:`pm_vector.protocol.codec`) or ``"json"``. An
    answer is read by its ``Content-Type`` whichever was asked (a service that answers JSON only
    still works). Documents from msgpack answers hold numpy arrays where the server sent arrays."""

    def __init__(self, base_url: str, api_key: str | None, *, budget: PrivacyBudget | str | None = None,
                 timeout: float = 60.0, transport=None, wire: str = "msgpack"):
        import httpx

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
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)
        if budget is None or isinstance(budget, str) or hasattr(budget, "__fspath__"):
            budget = PrivacyBudget(budget)
        if not isinstance(budget, PrivacyBudget):
            raise InvalidInputError(f"budget must be a PrivacyBudget, a ledger path or None (the default ledger); "
                                    f"got {type(budget).__name__}.")
        self.budget = budget
        self._ids: dict[str, str | None] = {}  # collection ids as published: information, never a budget key
        self._folded = False
        self._built: set[str] = set()  # fingerprints of requests built (and charged) by this client
        self._frames: dict[str, tuple[int | None, Any, PublicAnchor, dict]] = {}
        self._public: dict[str, tuple] = {}

    # ------------------------------------------------------------------ plumbing
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, doc: Any = None) -> Any:
        """The answer of one request (``doc``: its body, a document sent in :attr:`wire`)."""
        return self._exchange(method, path, doc)[0]

    def _exchange(self, method: str, path: str, doc: Any = None) -> tuple[Any, int, int]:
        """``(answer, bytes_sent, bytes_received)`` of one request: see :func:`wire_bytes`."""
        kw: dict[str, Any] = {}
        if doc is not None:
            kw = {"content": encode(doc, self._media), "headers": {"Content-Type": self._media}}
        r = self._http.request(method, path, **kw)
        sent, received = wire_bytes(r)
        self.last_exchange = {"path": path, "bytes_sent": sent, "bytes_received": received}
        return self._answer(r), sent, received

    @staticmethod
    def _answer(r) -> Any:
        media = (r.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        try:
            body = decode(r.content, MSGPACK if media == MSGPACK else JSON) if r.content else None
        except InvalidInputError as exc:
            if r.status_code >= 400:
                raise ServiceError(r.status_code, "error", r.text[:500]) from None
            raise InvalidInputError(f"the service's answer ({media or 'no Content-Type'}) cannot be read: "
                                    f"{exc}") from None
        if r.status_code >= 400:
            if not isinstance(body, dict):
                raise ServiceError(r.status_code, "error", r.text[:500])
            raise ServiceError(r.status_code, str(body.get("error", "error")), str(body.get("message", r.text[:500])))
        return body

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

    def _note_id(self, name: str, doc: dict[str, Any]) -> None:
        uid = doc.get("collection_uuid")
        if uid is not None:
            self._ids[name] = str(uid)

    # ------------------------------------------------------------------ endpoints
    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def collections(self) -> list[dict[str, Any]]:
        return self._call("GET", "/collections")["collections"]

    def collection(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/collections/{name}")

    def anchor_document(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/collections/{name}/anchor")

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
            try:
                eps, dlt = float(d["epsilon"]), float(d["delta"])
            except (KeyError, TypeError, ValueError):
                raise InvalidInputError("the request names no valid epsilon/delta to charge; build it with "
                                        "build_request().") from None
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

    # ------------------------------------------------------------------ the private query
    def frame(self, name: str, *, refresh: bool = False):
        """``(AnchorFrame, PublicAnchor, frame_info)`` of the collection's active run, verified, cached per run."""
        run_id = self.collection(name).get("active_run_id")
        cached = self._frames.get(name)
        if cached is not None and not refresh and cached[0] == run_id:
            return cached[1], cached[2], cached[3]
        doc = self.anchor_document(name)
        self._note_id(name, doc)
        frame, anchor = rebuild_frame(doc)
        info = {k: v for k, v in (doc.get("frame") or {}).items() if k != "anchor_embedding"}
        self._frames[name] = (run_id, frame, anchor, info)
        return frame, anchor, info

    def private_knn(self, name: str, *, epsilon: float, delta: float = 1e-5, shortlist: int | None = None,
                    label_free: bool = False, refresh: bool = False) -> PrivateKNN:
        """The :class:`~pm_vector.client.query.PrivateKNN` of the collection's active run: class frames and
        dummy pool from the public anchor document (cached per run); with ``label_free`` the row of a
        query without a label is its nearest public partition (a collection without labels) or a
        :class:`~pm_vector.kahm.KAHMClassifier` fit on the public anchor (see :meth:`_label_classifier`)."""
        run_id = self.collection(name).get("active_run_id")
        cached = self._public.get(name)
        if cached is None or refresh or cached[0] != run_id:
            doc = self.anchor_document(name)
            self._note_id(name, doc)
            frames_doc = doc.get("class_frames") or (doc.get("frame") or {}).get("class_frames")
            if not frames_doc:
                raise InvalidInputError(f"collection {name!r} publishes no class frames (its active run predates "
                                        "them); run an embedding job, or use protocol='privatemail_paper'.")
            frames = ClassFrames.from_dict(frames_doc)
            Xd, yd = np.asarray(doc["dummy_features"], dtype=np.float64), np.asarray(doc["dummy_labels"])
            if doc.get("partitions"):
                # a collection without labels: a partition without a public dummy takes its public anchor
                # rows as dummies (public data either way; every partition has anchor rows)
                ya = np.asarray(doc["labels"])
                take = np.isin(ya, np.setdiff1d(frames.classes_, yd))
                if take.any():
                    Xd = np.vstack([Xd.reshape(-1, frames.n_features_in_),
                                    np.asarray(doc["features"], dtype=np.float64)[take]])
                    yd = np.concatenate([yd.astype(np.int64), ya[take].astype(np.int64)])
            cached = (run_id, frames, Xd, yd, np.asarray(doc["features"], dtype=np.float64),
                      np.asarray(doc["labels"]), {},
                      (doc.get("frame") or {}).get("product_codes"),
                      # the cell release: the published PublicCells, and class_rows (its "cells": digest,
                      # levels; n_items and classes: the public rule's finest useful level)
                      (doc.get("frame") or {}).get("public_cells"), (doc.get("frame") or {}).get("class_rows") or {},
                      doc.get("partitions"))
            self._public[name] = cached
        clf = self._label_classifier(name) if label_free else None
        frames, Xd, yd = cached[1], cached[2], cached[3]
        return PrivateKNN(frames, Xd, yd, epsilon, delta, shortlist=shortlist or DEFAULT_SHORTLIST, classifier=clf,
                          collection=name, accountant=self._account(name))

    def _label_classifier(self, name: str):
        """What picks the row of a query without a label, cached per run: for a collection without
        labels its published :class:`~pm_vector.manifold.partitions.PublicPartitions` (the query's
        nearest partition, the very rule that labelled the items), otherwise the
        :class:`~pm_vector.kahm.KAHMClassifier` fit on the public anchor. Either is a function of the
        query (and of public data only), so the release's guarantee is unchanged: it protects the
        query's features and its row, and the row is computed from the query."""
        _, _, _, _, Xa, ya, classifiers = self._public[name][:7]
        parts_doc = self._public[name][10]
        if parts_doc:
            if "partitions" not in classifiers:
                from ..manifold.partitions import PublicPartitions

                classifiers["partitions"] = PublicPartitions.from_dict(parts_doc)
            return classifiers["partitions"]
        if "kahm" not in classifiers:
            from ..kahm import KAHMClassifier

            classifiers["kahm"] = KAHMClassifier().fit(Xa, ya)  # public data only
        return classifiers["kahm"]

    def public_cells(self, name: str):
        """The collection's published :class:`~pm_vector.manifold.cells.PublicCells` (from the public
        anchor document, cached per run), verified against the digest the run publishes; None when the
        active run serves no cell release."""
        from ..manifold.cells import PublicCells

        run_id = self.collection(name).get("active_run_id")
        cached = self._public.get(name)
        if cached is None or cached[0] != run_id:
            self.private_knn(name, epsilon=1.0, refresh=True)
            cached = self._public[name]
        doc, meta = cached[8], cached[9].get("cells") or {}
        if not doc or meta.get("status") != "ready":
            return None
        if "cells" not in cached[6]:
            cells = PublicCells.from_dict(doc)
            if cells.digest() != meta.get("digest"):
                raise AlignmentError(f"the public cells of collection {name!r} do not hash to the digest its run "
                                     "publishes; refusing to build cell requests on them.")
            cached[6]["cells"] = cells
        return cached[6]["cells"]

    def private_cells(self, name: str, *, epsilon: float, n_cells: int | None = None, shortlist: int | None = None):
        """The :class:`~pm_vector.client.cells.PrivateCellKNN` of the collection's active run (the cell
        release: pure eps, delta 0; ``n_cells`` None: K by the public rule for ``epsilon``, among the
        levels no finer than :func:`~pm_vector.privacy.cells.max_cells_for` the collection's public
        size, classes and k'), charging this client's ledger (eps, 0) per request."""
        from ..privacy.cells import max_cells_for
        from .cells import PrivateCellKNN

        cells = self.public_cells(name)
        if cells is None:
            raise InvalidInputError(f"collection {name!r} serves no cell release (its active run publishes no "
                                    "cells); use release='gaussian', or run a new embedding job.")
        kp = shortlist or DEFAULT_SHORTLIST
        doc = self._public[name][9]
        max_cells = max_cells_for(int(doc["n_items"]), len(doc["classes"]), int(kp)) if doc.get("n_items") else None
        # the real row: the query's nearest public cell over every class (PrivateCellKNN's default
        # row="nearest": no label, no classifier needed)
        return PrivateCellKNN(cells, epsilon, n_cells=n_cells, shortlist=kp, collection=name,
                              accountant=self._account(name), max_cells=max_cells)

    def choose_release(self, name: str, epsilon: float, release: str = "auto") -> str:
        """``"cells"`` or ``"gaussian"``: ``release`` itself, or for ``"auto"`` the public default rule
        (:func:`pm_vector.privacy.cells.release_for_epsilon`), the Gaussian when the collection serves
        no cells."""
        from ..privacy.cells import release_for_epsilon

        if release not in RELEASES:
            raise InvalidInputError(f"release must be one of {list(RELEASES)}, not {release!r}.")
        if release != "auto":
            return release
        rel = release_for_epsilon(epsilon)
        return "cells" if rel == "cells" and self.public_cells(name) is not None else "gaussian"

    def product_codes(self, name: str):
        """The :class:`~pm_vector.manifold.codes.ProductCodes` the collection's active run publishes (from
        the public anchor document, cached per run), checked against the digest the run publishes
        (:func:`pm_vector.client.published_codes.unpack`); None when the run publishes none."""
        from .published_codes import unpack

        run_id = self.collection(name).get("active_run_id")
        cached = self._public.get(name)
        if cached is None or cached[0] != run_id:
            self.private_knn(name, epsilon=1.0, refresh=True)
            cached = self._public[name]
        doc, meta = cached[7], cached[9].get("codes") or {}
        if not doc or meta.get("status") != "ready":
            return None
        if "codes" not in cached[6]:
            cached[6]["codes"] = unpack(doc, meta.get("digest"))
        return cached[6]["codes"]

    def build_request(self, name: str, features, label: int | None = None, *, epsilon: float, delta: float = 1e-5,
                      protocol: str = "pm_vector", shortlist: int | None = None, release: str = "gaussian",
                      n_cells: int | None = None, **paper_options):
        """``(request, secret)`` built locally and charged to the budget (before its noise is drawn;
        :class:`~pm_vector.errors.BudgetExceededError` releases nothing); nothing is sent.
        ``protocol="pm_vector"`` (default): ``release="gaussian"`` a
        :class:`~pm_vector.client.query.QueryRequest` (``label=None``: the label-free client), charged
        (eps, delta); ``release="cells"`` a :class:`~pm_vector.client.request.CellRequest` (level
        ``n_cells``, None: the public rule), charged (eps, 0); ``"auto"``: :meth:`choose_release`.
        ``"privatemail_paper"``: the paper's request (:class:`~pm_vector.client.PrivateMail`;
        ``paper_options``: any of :data:`PAPER_OPTIONS`). Private (underscore) or unknown keywords
        raise :class:`TypeError`: no seed reaches this method."""
        _check_options(paper_options)
        return self._build_request(name, features, label, epsilon=epsilon, delta=delta, protocol=protocol,
                                   shortlist=shortlist, release=release, n_cells=n_cells, options=paper_options)

    def _build_request(self, name, features, label=None, *, epsilon, delta=1e-5, protocol="pm_vector",
                       shortlist=None, release="gaussian", n_cells=None, options=None, rng=None):
        """:meth:`build_request`; ``rng`` (an int or a Generator: tests only, never reached from a public
        method) drives dummies and noise, the request says ``seeded`` and is not charged (not a
        private release; a service refuses it unless its settings allow seeded requests)."""
        options = dict(options or {})
        if protocol == "privatemail_paper":
            if release not in ("auto", "gaussian") or n_cells is not None:
                raise InvalidInputError("release and n_cells apply to the pm_vector protocol (the paper's protocol "
                                        "is its own release).")
            if label is None:
                raise InvalidInputError("the paper's protocol needs the query's label.")
            frame, anchor, _ = self.frame(name)
            pm = PrivateMail(frame, epsilon=epsilon, delta=delta,
                             accountant=None if rng is not None else self._account(name), _rng=rng, **options)
            req, secret = pm.request(np.asarray(features, dtype=np.float64), int(label), anchor, collection=name)
            self._built.add(_fingerprint(req))
            return req, secret
        if protocol != "pm_vector":
            raise InvalidInputError(f"protocol must be 'pm_vector' or 'privatemail_paper', not {protocol!r}.")
        if options:
            raise InvalidInputError(f"{sorted(options)} are options of protocol='privatemail_paper', not of the "
                                    "pm_vector protocol.")
        if self.choose_release(name, epsilon, release) == "cells":
            cclient = self.private_cells(name, epsilon=epsilon, n_cells=n_cells, shortlist=shortlist)
            if rng is not None:
                cclient.accountant = None  # seeded: not a private release, not charged
                cclient._inject_generator(rng if isinstance(rng, np.random.Generator) else secure_generator(int(rng)))
            req, secret = cclient.request(np.asarray(features, dtype=np.float64), None if label is None else int(label))
            self._built.add(_fingerprint(req))
            return req, secret
        if n_cells is not None:
            raise InvalidInputError("n_cells applies to the cell release (release='cells' or 'auto').")
        client = self.private_knn(name, epsilon=epsilon, delta=delta, shortlist=shortlist, label_free=label is None)
        if rng is not None:
            client.accountant = None  # seeded: not a private release, not charged
            client._inject_generator(rng if isinstance(rng, np.random.Generator) else secure_generator(int(rng)))
        req, secret = client.request(np.asarray(features, dtype=np.float64), None if label is None else int(label))
        self._built.add(_fingerprint(req))
        return req, secret

    def query(self, name: str, features, label: int | None = None, *, epsilon: float, delta: float = 1e-5,
              k: int = 8, shortlist: int | None = None, protocol: str = "pm_vector", rerank: bool = True,
              answer: str = "compact", release: str = "auto", n_cells: int | None = None,
              **paper_options) -> dict[str, Any]:
        """One private k-NN query; returns the real row's answer (``item_ids``, ``distances``, and
        ``payloads`` when the collection stores any; a raw-feature answer also ``labels`` and
        ``external_ids``) with ``epsilon``, ``delta``, ``budget`` (the server's entry after the
        charge), ``timing``, ``wire`` and the resolve's bytes on the wire (:func:`wire_bytes`):
        ``bytes_sent``, ``bytes_received`` and ``bytes_per_request``, their sum.

        pm_vector protocol, ``answer="compact"`` (default): the server answers every class row with
        ``k'`` candidates, their ids and the prefix of ``b`` bytes of their product codes (for
        every row alike); ``(k', b)`` are :func:`~pm_vector.manifold.codes.compact_answer_shape` of
        the rows, the release, epsilon and the published stage widths (``shortlist``: k' given,
        ``b`` still from the rule). The client checks the answer's codes digest against the
        published codes, re-ranks its real row by
        :meth:`~pm_vector.manifold.codes.ProductCodes.distances` (asymmetric: its exact query against
        the coded candidates) and keeps ``k``. ``answer="features"`` (collections that allow raw
        features): every row's candidates with their raw features (``shortlist`` or the default
        k'), the real row re-ranked by them. No request follows the answer. ``reranked`` in the
        result: ``"codes"``, ``"features"`` or false (``rerank=False``: server score order kept).
        The paper's protocol ignores ``answer``: raw features when the collection allows them.

        ``release`` (pm_vector protocol): ``"auto"`` (default: the public rule of
        :func:`pm_vector.privacy.cells.release_for_epsilon`, the cell release below eps 512 when the
        collection serves it), ``"cells"`` (one reported public cell per class, pure eps: delta 0;
        ``n_cells`` the level K, None: the public rule for eps) or ``"gaussian"`` (the noised class
        rows, (eps, delta)). The result's ``release`` says which was used (``"privatemail_paper"`` for
        the paper's protocol), ``delta`` what was charged.
        ``paper_options``: any of :data:`PAPER_OPTIONS` (``protocol="privatemail_paper"``); private
        (underscore) or unknown keywords raise :class:`TypeError`."""
        _check_options(paper_options)
        return self._query(name, features, label, epsilon=epsilon, delta=delta, k=k, shortlist=shortlist,
                           protocol=protocol, rerank=rerank, answer=answer, release=release,
                           n_cells=n_cells, options=paper_options)

    def _compact_shape(self, name: str, epsilon: float, release: str, shortlist: int | None):
        """``(release, k', b, ProductCodes)`` of a compact answer: the release the public rule picks,
        ``k'`` and the code prefix from :func:`~pm_vector.manifold.codes.compact_answer_shape`."""
        from ..manifold.codes import compact_answer_shape

        pc = self.product_codes(name)
        if pc is None:
            raise InvalidInputError(f"collection {name!r} publishes no product codes (its active run predates them, "
                                    "or its anchor set is too small to fit them); ask for answer='features' where the "
                                    "collection allows raw features, or run a new embedding job.")
        used = self.choose_release(name, epsilon, release)
        n_rows = len(self._public[name][9].get("classes") or self._public[name][1].classes_)
        kp, b = compact_answer_shape(n_rows, used, float(epsilon), tuple(pc.stage_bytes_))
        return used, int(shortlist) if shortlist is not None else int(kp), int(b), pc

    def _query(self, name, features, label=None, *, epsilon, delta=1e-5, k=8, shortlist=None, protocol="pm_vector",
               rerank=True, answer="compact", release="auto", n_cells=None, options=None,
               rng=None) -> dict[str, Any]:
        """:meth:`query`; ``rng``: see :meth:`_build_request` (tests only)."""
        from .published_codes import row_codes

        if answer not in ("compact", "features"):
            raise InvalidInputError(f"answer must be 'compact' or 'features', not {answer!r}.")
        if protocol != "pm_vector" and (release not in ("auto", "gaussian") or n_cells is not None):
            raise InvalidInputError("release and n_cells apply to the pm_vector protocol (the paper's protocol is "
                                    "its own release).")
        allow_raw = bool(self.collection(name).get("allow_raw_features"))
        pc = b = None
        if protocol == "pm_vector" and answer == "features" and not allow_raw:
            raise InvalidInputError(f"collection {name!r} does not hand out raw features; use answer='compact' "
                                    "(the default).")
        if protocol == "pm_vector" and answer == "compact":
            self.private_knn(name, epsilon=1.0)  # the public document (cached per run)
            release, shortlist, b, pc = self._compact_shape(name, epsilon, release, shortlist)
            body_answer = {"answer": "compact", "code_bytes": b}
        elif protocol == "pm_vector":
            body_answer = {"answer": "features"}
        else:
            body_answer = {"include_features": bool(rerank and allow_raw)}
        mode = None if not rerank else ("codes" if pc is not None else
                                         ("features" if body_answer.get("answer") == "features"
                                          or body_answer.get("include_features") else None))
        t0 = time.perf_counter()
        req, secret = self._build_request(name, features, label, epsilon=epsilon, delta=delta, protocol=protocol,
                                          shortlist=shortlist, release=release, n_cells=n_cells, options=options,
                                          rng=rng)
        used = getattr(req, "release", "privatemail_paper")
        t1 = time.perf_counter()
        status = self.budget.status(self.budget_key())  # charged by _build_request
        body = {"request": req.to_dict(), "k": int(k), **body_answer}
        res, sent, received = self._exchange("POST", f"/collections/{name}/resolve", body)
        t2 = time.perf_counter()
        # nothing below talks to the server: the answer is all the client uses
        row = dict(secret.pick(res["rows"]))
        row["item_ids"] = [int(v) for v in np.asarray(row.get("item_ids", []), dtype=np.int64).ravel()]
        n = len(row["item_ids"])
        if pc is not None:
            meta = res.get("codes") or {}
            if meta.get("digest") != pc.digest() or meta.get("bytes") != b:
                raise AlignmentError(f"the answer's codes ({meta.get('bytes')!r} bytes, digest "
                                     f"{str(meta.get('digest'))[:16]!r}...) are not the {b}-byte prefix of the codes "
                                     f"collection {name!r} publishes; refusing to re-rank by them.")
            row["codes"] = row_codes(row.get("codes"), n, b)
        reranked: str | bool = False
        q = np.asarray(features, dtype=np.float64).ravel()
        q = q / max(float(np.linalg.norm(q)), 1e-12)
        d = None
        if mode == "features" and row.get("features") is not None and len(row["features"]):
            d = np.linalg.norm(np.asarray(row["features"], dtype=np.float64) - q, axis=1)
        elif mode == "codes" and n:
            d = pc.distances(q, row["codes"])
        if d is not None:
            order = np.argsort(d, kind="stable")
            for key2 in ("item_ids", "external_ids", "labels", "features", "scores", "payloads",
                         "predicted", "class_scores"):
                if row.get(key2) is not None:
                    row[key2] = [row[key2][i] for i in order]
            row["distances"] = d[order].tolist()
            reranked = mode
        row.pop("features", None)
        row.pop("codes", None)
        if protocol == "pm_vector":
            for key2 in ("item_ids", "external_ids", "labels", "scores", "payloads", "distances", "predicted",
                         "class_scores"):
                if row.get(key2) is not None:
                    row[key2] = list(row[key2])[: int(k)]
        return {**row, "collection": name, "protocol": protocol, "release": used, "epsilon": float(epsilon),
                "delta": 0.0 if used == "cells" else float(delta), "n_cells": getattr(req, "n_cells", None),
                "k": int(k), "shortlist": getattr(req, "shortlist", None), "label_predicted":
                bool(getattr(secret, "predicted", False)), "run_id": res.get("run_id"), "reranked": reranked,
                "answer": res.get("answer", "full"), "code_bytes": b,
                "budget": status, "bytes_sent": sent, "bytes_received": received,
                "bytes_per_request": sent + received, "wire": self.wire,
                "timing": {"build_ms": (t1 - t0) * 1000, "resolve_ms": (t2 - t1) * 1000,
                           "total_ms": (time.perf_counter() - t0) * 1000}}
