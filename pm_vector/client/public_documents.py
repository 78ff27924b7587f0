"""What a service client keeps of a collection's public anchor document, per active run, and
what is checked of it: the verified anchor frame (:class:`VerifiedFrame`), the class frames,
dummy pool, published codes and cells (:class:`PublicDocument`). Loading a document has no side
effect: the private-query clients built on it (:class:`~pm_vector.client.query.PrivateKNN`, ...)
are built by the release a query uses (:mod:`pm_vector.client.releases`).

Everything here is public data, fetched once per active run and re-fetched when the run
changes; what is built from it (published codes and cells, checked against the digests the run
publishes; a label classifier) is cached with it (:attr:`PublicDocument.derived`).

A server may lie about its run. Inside one query the collection is asked once (its GETs are
kept: :meth:`~pm_vector.client.transport.Transport._query_scope`), an anchor document or an answer
of another run than that is refused (:class:`~pm_vector.errors.RunChangedError`), and a
collection's anchor document is downloaded at most :data:`ANCHOR_DOWNLOADS` times per
:data:`ANCHOR_WINDOW_S` seconds by one client. Its frame parameters and size are checked
(:func:`~pm_vector.protocol.anchor.check_frame_params`) before the frame is rebuilt.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import AlignmentError, InvalidInputError, MalformedAnswerError, RunChangedError
from ..manifold.class_frames import ClassFrames
from ..protocol.anchor import PublicAnchor, check_frame_params
from ..protocol.frame import frame_from_document
from .transport import malformed_answer, answer_cap
from ..manifold.partitions import PublicPartitions
from ..manifold.public_cells import PublicCells
from ..protocol.location import payload_wire_bytes
from ..protocol.published_codes import unpack

#: most downloads of one collection's anchor document by one client per :data:`ANCHOR_WINDOW_S`
#: (a run changes when an embedding job finishes: minutes apart, not per query)
ANCHOR_DOWNLOADS = 4
ANCHOR_WINDOW_S = 60.0


@dataclass(frozen=True)
class VerifiedFrame:
    """A collection's anchor frame rebuilt from its anchor document and verified
    (:func:`~pm_vector.protocol.frame.frame_from_document`), for the run ``run_id``."""

    run_id: int | None
    frame: Any  # the fitted AnchorFrame
    anchor: PublicAnchor
    info: dict  # the document's "frame" entry without the anchor embedding


@dataclass(frozen=True)
class PublicDocument:
    """The parts of a collection's public anchor document a private query uses, for the run
    ``run_id``: the class frames and the dummy pool (with a collection without labels, the
    anchor rows of partitions that have no public dummy), the anchor rows, and the published
    documents (``product_codes``, ``public_cells``, ``class_rows``: the run's class-rows
    parameters, the codes' and cells' digests, ``n_items`` and ``classes``; ``partitions`` of a
    collection without labels). ``derived``: what the client built from them, by name
    (``"codes"``, ``"public_cells"``, ``"location_cells"``, ``"kahm"``, ``"partitions"``), checked once."""

    run_id: int | None
    frames: ClassFrames
    dummy_features: np.ndarray
    dummy_labels: np.ndarray
    anchor_features: np.ndarray
    anchor_labels: np.ndarray
    product_codes: dict | None
    public_cells: dict | None
    class_rows: dict
    public_locations: dict | None
    partitions: dict | None
    derived: dict = field(default_factory=dict, compare=False)


class PublicDocuments:
    """The public-document half of :class:`~pm_vector.client.http.Client`, on its transport: it needs
    ``_call`` (:class:`~pm_vector.client.transport.Transport`), ``wire`` and ``_ids``, and keeps
    ``self._frames`` (:class:`VerifiedFrame` per collection) and ``self._public``
    (:class:`PublicDocument` per collection)."""

    def frame(self, name: str, *, refresh: bool = False):
        """``(AnchorFrame, PublicAnchor, frame_info)`` of the collection's active run, verified, cached per run."""
        run_id = self.collection(name).get("active_run_id")
        cached = self._frames.get(name)
        if cached is not None and not refresh and cached.run_id == run_id:
            return cached.frame, cached.anchor, cached.info
        doc = self._anchor_of_run(name, run_id)
        self._note_id(name, doc)
        fr = doc.get("frame")
        try:
            check_frame_params((fr or {}).get("params") if isinstance(fr, dict) else None,
                               len(doc.get("anchor_ids") or ()))
        except InvalidInputError as exc:
            raise MalformedAnswerError(f"collection {name!r}'s anchor document: {exc}") from None
        with malformed_answer(f"collection {name!r}'s anchor document"):
            frame, anchor = frame_from_document(doc)
            info = {k: v for k, v in (doc.get("frame") or {}).items() if k != "anchor_embedding"}
        self._frames[name] = VerifiedFrame(run_id, frame, anchor, info)
        return frame, anchor, info

    # ------------------------------------------------------------------ the documents, as published
    def collection(self, name: str) -> dict[str, Any]:
        """The collection's document (``GET /collections/{name}``; inside a query asked once)."""
        return self._call("GET", f"/collections/{name}")

    def anchor_document(self, name: str) -> dict[str, Any]:
        """The collection's public anchor document as the service sends it (nothing checked)."""
        return self._call("GET", f"/collections/{name}/anchor")

    def _note_id(self, name: str, doc: dict[str, Any]) -> None:
        uid = doc.get("collection_uuid")
        if uid is not None:
            self._ids[name] = str(uid)

    def document(self, name: str, *, refresh: bool = False) -> PublicDocument:
        """The :class:`PublicDocument` of the collection's active run (fetched once per run, or again
        with ``refresh``). Loading it builds nothing else: a release's client is built from it when
        a query needs one (:mod:`pm_vector.client.releases`)."""
        run_id = self.collection(name).get("active_run_id")
        cached = self._public.get(name)
        if cached is None or refresh or cached.run_id != run_id:
            doc = self._anchor_of_run(name, run_id)
            self._note_id(name, doc)
            with malformed_answer(f"collection {name!r}'s anchor document"):
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
                fr = doc.get("frame") or {}
                cached = PublicDocument(run_id=run_id, frames=frames, dummy_features=Xd, dummy_labels=yd,
                                        anchor_features=np.asarray(doc["features"], dtype=np.float64),
                                        anchor_labels=np.asarray(doc["labels"]), product_codes=fr.get("product_codes"),
                                        public_cells=fr.get("public_cells"), class_rows=fr.get("class_rows") or {},
                                        public_locations=fr.get("public_locations"),
                                        partitions=doc.get("partitions"))
            self._public[name] = cached
        return cached

    def _anchor_of_run(self, name: str, run_id) -> dict:
        """The collection's anchor document for the run ``run_id`` (the one the query started on):
        refused when it names another run, or when this client already downloaded the collection's
        anchor document :data:`ANCHOR_DOWNLOADS` times in the last :data:`ANCHOR_WINDOW_S` seconds."""
        log = self.__dict__.setdefault("_anchor_downloads", {}).setdefault(name, deque())
        now = time.monotonic()
        while log and now - log[0] > ANCHOR_WINDOW_S:
            log.popleft()
        if len(log) >= ANCHOR_DOWNLOADS:
            raise RunChangedError(f"collection {name!r} changed its active run {len(log)} times in "
                                  f"{ANCHOR_WINDOW_S:g} s (now run {run_id!r}); this client downloads its anchor "
                                  f"document at most {ANCHOR_DOWNLOADS} times per {ANCHOR_WINDOW_S:g} s. A run "
                                  "changes when an embedding job finishes: retry in a minute, and ask the service's "
                                  "operator if it keeps happening.")
        log.append(now)
        doc = self.anchor_document(name)
        self._check_run(name, doc, run_id)
        return doc

    def _check_run(self, name: str, doc, run_id=None) -> None:
        """Refuse an anchor document or an answer ``doc`` that names another run than ``run_id``
        (None: the active run the current query started on, as :meth:`collection` said once for
        the query, else the run of the public documents its request was built from) -- one
        :class:`~pm_vector.errors.RunChangedError`, nothing of it used. Asks the server nothing."""
        if run_id is None:
            coll = self._query_get(f"/collections/{name}")
            if coll is not None:
                run_id = coll.get("active_run_id")
            else:
                runs = {d.run_id for d in (self._public.get(name), self._frames.get(name)) if d is not None}
                run_id = runs.pop() if len(runs) == 1 else None
        got = None
        if isinstance(doc, dict):  # an answer says run_id; an anchor document in its frame
            got = doc.get("run_id")
            if got is None and isinstance(doc.get("frame"), dict):
                got = doc["frame"].get("run_id")
        if run_id is not None and got is not None and got != run_id:
            raise RunChangedError(f"collection {name!r} changed its active run in the middle of a query (run "
                                  f"{str(run_id)[:40]} when it started, {str(got)[:40]} now); nothing of the answer "
                                  "was used. Ask again.")

    def _resolve_cap(self, name: str, body: dict) -> int:
        """The byte cap of the answer to the resolve ``body``
        (:func:`~pm_vector.client.transport.answer_cap` of its rows, ``k'``, code prefix, the raw
        features' width when it asks for them, and what the collection's payloads may take when
        published: :meth:`_payload_plan`, the bound or the smaller high-water mark). An answer whose
        payloads are larger than the collection published is refused by the transport, whole."""
        features = body.get("answer") == "features" or bool(body.get("include_features"))
        d = None
        if features:
            pub, fr = self._public.get(name), self._frames.get(name)
            d = (pub.anchor_features.shape[1] if pub is not None else
                 fr.anchor.features.shape[1] if fr is not None else 4096)
        bound = self._payload_plan(name) if self._query_get(f"/collections/{name}") is not None else None
        return answer_cap(body["request"], int(body.get("k") or 1), code_bytes=body.get("code_bytes"),
                          n_features=d, payload_bytes=bound)

    def _label_classifier(self, name: str):
        """What picks the row of a query without a label, cached per run: for a collection without
        labels its published :class:`~pm_vector.manifold.partitions.PublicPartitions` (the query's
        nearest partition, the very rule that labelled the items), otherwise the
        :class:`~pm_vector.kahm.KAHMClassifier` fit on the public anchor. Either is a function of the
        query (and of public data only), so the release's guarantee is unchanged: it protects the
        query's features and its row, and the row is computed from the query."""
        pub = self._public[name]
        classifiers = pub.derived
        if pub.partitions:
            if "partitions" not in classifiers:
                classifiers["partitions"] = PublicPartitions.from_dict(pub.partitions)
            return classifiers["partitions"]
        if "kahm" not in classifiers:
            from ..kahm import KAHMClassifier  # lazy: start-up (pm_vector.kahm imports sklearn, ~3 s)

            classifiers["kahm"] = KAHMClassifier().fit(pub.anchor_features, pub.anchor_labels)  # public data only
        return classifiers["kahm"]

    def public_cells(self, name: str):
        """The collection's published :class:`~pm_vector.manifold.public_cells.PublicCells` (from the public
        anchor document, cached per run), verified against the digest the run publishes; None when the
        active run serves no cell release."""
        cached = self.document(name)
        doc, meta = cached.public_cells, cached.class_rows.get("cells") or {}
        if not doc or meta.get("status") != "ready":
            return None
        if "public_cells" not in cached.derived:
            cells = PublicCells.from_dict(doc)
            if cells.digest() != meta.get("digest"):
                raise AlignmentError(f"the public cells of collection {name!r} do not hash to the digest its run "
                                     "publishes; refusing to build cell requests on them.")
            cached.derived["public_cells"] = cells
        return cached.derived["public_cells"]

    def location_cells(self, name: str):
        """The collection's published location cells (a one-class
        :class:`~pm_vector.manifold.public_cells.PublicCells` of the whole anchor, from the public anchor
        document, cached per run), verified against the digest the run publishes; None when the active
        run serves no location release."""
        cached = self.document(name)
        doc, meta = cached.public_locations, cached.class_rows.get("locations") or {}
        if not doc or meta.get("status") != "ready":
            return None
        if "location_cells" not in cached.derived:
            cells = PublicCells.from_dict(doc)
            if cells.digest() != meta.get("digest") or cells.classes_.size != 1:
                raise AlignmentError(f"the location cells of collection {name!r} do not hash to the digest its run "
                                     "publishes; refusing to build location requests on them.")
            cached.derived["location_cells"] = cells
        return cached.derived["location_cells"]

    def _payload_bound(self, name: str) -> int | None:
        """The collection's payload bound as its document publishes it (``max_payload_bytes``: compact
        JSON bytes per item), None when it publishes none (an earlier server) or an invalid one."""
        bound = self.collection(name).get("max_payload_bytes")
        ok = isinstance(bound, int) and not isinstance(bound, bool) and 0 <= bound <= 65_536
        return bound if ok else None

    def _payload_plan(self, name: str) -> int | None:
        """What one item's payload may take (compact JSON bytes) as the collection's document says:
        ``min(max_payload_bytes, payload_bytes_max)`` -- the bound, or the high-water mark of the
        payloads the collection ever stored when it publishes a smaller one (absent or invalid: the
        bound, as from an earlier server). None when it publishes no valid bound.

        A server that publishes a mark below its payloads only makes its own answers larger than
        this client's byte cap (:meth:`_resolve_cap`), which the transport refuses whole: a safe
        failure. Payloads written after this query read the document may do the same; the next
        query reads the document again (every query does) and plans with the new mark."""
        bound = self._payload_bound(name)
        if bound is None:
            return None
        high = self.collection(name).get("payload_bytes_max")
        ok = isinstance(high, int) and not isinstance(high, bool) and 0 <= high <= 65_536
        return min(bound, high) if ok else bound

    def _payload_wire_bytes(self, name: str) -> int:
        """What one candidate's payload may cost on this client's wire
        (:func:`~pm_vector.protocol.location.payload_wire_bytes` of :meth:`_payload_plan`: the bound,
        or the smaller high-water mark the collection publishes): what the location plan counts per
        candidate, so that an answer with every payload at that size stays within the byte budget.
        0 when the collection publishes no bound."""
        size = self._payload_plan(name)
        return 0 if size is None else payload_wire_bytes(size, getattr(self, "wire", "msgpack"))

    def product_codes(self, name: str):
        """The :class:`~pm_vector.manifold.codes.ProductCodes` the collection's active run publishes (from
        the public anchor document, cached per run), checked against the digest the run publishes
        (:func:`pm_vector.protocol.published_codes.unpack`); None when the run publishes none."""
        cached = self.document(name)
        doc, meta = cached.product_codes, cached.class_rows.get("codes") or {}
        if not doc or meta.get("status") != "ready":
            return None
        if "codes" not in cached.derived:
            cached.derived["codes"] = unpack(doc, meta.get("digest"))
        return cached.derived["codes"]
