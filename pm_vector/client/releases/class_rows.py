"""The client plan of the Gaussian class rows (one noised row per class), and what every release
answered with one list per class row shares (:class:`RowsQuery`: the cell release and the paper's
protocol too): the answer's shape (compact: ids and the ``b``-byte prefix of the published product
codes, ``k'`` and ``b`` by the public rule :func:`~pm_vector.manifold.codes.compact_answer_shape`;
or raw features), its check and the re-rank of the real row.

The WHOLE answer is checked before the secret picks its row (an error must not depend on which row
is real): its codes are the published codes' ``b``-byte prefix, and every row is well formed
(:func:`~pm_vector.protocol.answers.check_rows_answer`).
"""

from __future__ import annotations

import numpy as np

from ...errors import AlignmentError, InvalidInputError, MalformedAnswerError
from ...manifold.codes import compact_answer_shape
from ...protocol.answers import check_rows_answer
from ...protocol.class_rows import DEFAULT_SHORTLIST
from ..query import PrivateKNN
from ..rerank import rerank_row
from .base import Query, ReleaseQuery, seeded

#: the per-candidate lists of a row cut to ``k`` after the re-rank
_LISTS = ("item_ids", "external_ids", "labels", "scores", "payloads", "distances", "predicted", "class_scores")


def knn(docs, name: str, *, epsilon: float, delta: float = 1e-5, shortlist: int | None = None,
        label_free: bool = False, account=None) -> PrivateKNN:
    """The :class:`~pm_vector.client.query.PrivateKNN` of the collection's active run: class frames and
    dummy pool from its public document; with ``label_free`` the row of a query without a label is
    its nearest public partition (a collection without labels) or a
    :class:`~pm_vector.kahm.KAHMClassifier` fit on the public anchor
    (:meth:`PublicDocuments._label_classifier`). Charges ``account`` (eps, delta) per request."""
    pub = docs.document(name)
    clf = docs._label_classifier(name) if label_free else None
    return PrivateKNN(pub.frames, pub.dummy_features, pub.dummy_labels, epsilon, delta,
                      shortlist=shortlist or DEFAULT_SHORTLIST, classifier=clf, collection=name, accountant=account)


class RowsQuery(ReleaseQuery):
    """A query answered with one list per request row (module doc)."""

    #: the answer's lists are cut to ``k`` (the pm_vector protocol)
    truncate = True

    def __init__(self, docs, q: Query, account):
        super().__init__(docs, q, account)
        if q.bytes_given:
            raise InvalidInputError("max_bytes applies to the location release (release='location' or 'auto').")
        self.pc = self.b = None
        self.shortlist = q.shortlist
        self.n_features = 0
        self.body_answer = self._answer_shape()
        features = self.body_answer.get("answer") == "features" or self.body_answer.get("include_features")
        self.mode = None if not q.rerank else ("codes" if self.pc is not None else ("features" if features else None))

    def _answer_shape(self) -> dict:
        """The resolve body's answer options: compact (``k'`` and ``b`` by the public rule; sets
        ``pc``, ``b`` and ``shortlist``) or raw features (collections that allow them)."""
        q, name = self.q, self.q.name
        if q.answer == "compact":
            pc = self.docs.product_codes(name)
            if pc is None:
                raise InvalidInputError(f"collection {name!r} publishes no product codes (its active run predates "
                                        "them, or its anchor set is too small to fit them); ask for answer='features' "
                                        "where the collection allows raw features, or run a new embedding job.")
            pub = self.docs.document(name)
            n_rows = len(pub.class_rows.get("classes") or pub.frames.classes_)
            rule_shortlist, b = compact_answer_shape(n_rows, self.release, float(q.epsilon), tuple(pc.widths_))
            self.pc, self.b = pc, int(b)
            self.shortlist = int(q.shortlist) if q.shortlist is not None else int(rule_shortlist)
            return {"answer": "compact", "code_bytes": self.b}
        if q.answer == "features":
            if not self.docs.collection(name).get("allow_raw_features"):
                raise InvalidInputError(f"collection {name!r} does not hand out raw features; use answer='compact' "
                                        "(the default).")
            return {"answer": "features"}
        return {}

    def body(self, req) -> dict:
        return {**super().body(req), **self.body_answer}

    def check(self, res: dict, req):
        if self.pc is not None:
            meta = res.get("codes") or {}
            if meta.get("digest") != self.pc.digest() or meta.get("bytes") != self.b:
                raise AlignmentError(f"the answer's codes ({meta.get('bytes')!r} bytes, digest "
                                     f"{str(meta.get('digest'))[:16]!r}...) are not the {self.b}-byte prefix of the "
                                     f"codes collection {self.q.name!r} publishes; refusing to re-rank by them.")
        shortlist = int(getattr(req, "shortlist", 0) or self.shortlist or 1000)
        try:
            return check_rows_answer(res.get("rows"), n_rows=int(req.n_rows), shortlist=shortlist,
                                     code_bytes=self.b if self.pc is not None else None,
                                     n_features=self.n_features if self.mode == "features" else None)
        except InvalidInputError as exc:  # the answer's fault, whatever the real row
            raise MalformedAnswerError(f"the answer is malformed: {exc}") from None

    def finish(self, res: dict, rows, req, secret, q_raw) -> dict:
        row = dict(secret.pick(rows))
        row["item_ids"] = [int(v) for v in np.asarray(row.get("item_ids", []), dtype=np.int64).ravel()]
        reranked = rerank_row(row, q_raw, self.mode, req, self.pc, self.b)
        if self.truncate:
            for key in _LISTS:
                if row.get(key) is not None:
                    row[key] = list(row[key])[: int(self.q.k)]
        return {**row, "n_cells": getattr(req, "n_cells", None), "shortlist": getattr(req, "shortlist", None),
                "label_predicted": bool(getattr(secret, "predicted", False)), "reranked": reranked,
                "answer": res.get("answer", "full"), "code_bytes": self.b}


class GaussianQuery(RowsQuery):
    """One query of the Gaussian class rows: (eps, delta), one noised row per class."""

    release = "gaussian"

    @classmethod
    def served(cls, docs, name: str) -> bool:
        return True  # every run publishes class frames

    def build(self, features, label=None, rng=None):
        q = self.q
        if q.n_cells is not None:
            raise InvalidInputError("n_cells applies to the cell release (release='cells' or 'auto').")
        client = knn(self.docs, q.name, epsilon=q.epsilon, delta=q.delta, shortlist=self.shortlist,
                     label_free=label is None, account=self.account)
        x = np.asarray(features, dtype=np.float64)
        self.n_features = x.size
        return seeded(client, rng).request(x, None if label is None else int(label))
