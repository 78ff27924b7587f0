"""The paper's iteration-distribute-recursion option, client side: a PrivateMail request that
stops after the private first iteration (:class:`ReleaseRequest`, built by
:class:`ReleaseOnlyPrivateMail`). The server post-processes it
(:func:`pm_vector.db.resolve.paper_resolution.post_process_release`); see that module for what the
client reveals by sending it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Mapping

import numpy as np

from .._validation import as_labels, as_matrix
from ..errors import InvalidInputError, RequestError
from . import wire
from .privatemail import PrivateMail

RELEASE_FORMAT = "pm_vector.privatemail-release/1"
#: post-processing iterations a release-only request may ask the server to run
MAX_POST_ITER = wire.MAX_POST_ITER


@dataclass
class ReleaseRequest:
    """A PrivateMail request that stops after the private first iteration.

    ``release``: the noisy first iteration ``f(X) + noise`` of all ``C + A`` rows (query rows
    in the client's shuffled order, then the anchor rows in ``anchor_ids`` order);
    ``query_labels``: the C query rows' labels in that order (the post-processing needs
    them); ``noise_sigma``/``q_rms``: what the post-processing's bandwidth uses;
    ``n_post_iter``/``post_alpha``: its iterations. See the module doc for what the client
    reveals by sending this instead of a post-processed :class:`PrivateMailRequest`.
    """

    anchor_ids: list
    release: np.ndarray
    query_labels: list
    epsilon: float
    delta: float
    sensitivity: float
    noise_sigma: float
    q_rms: float
    mechanism: str
    n_post_iter: int
    post_alpha: float
    params: dict = field(default_factory=dict)
    collection: str | None = None

    def __post_init__(self):
        self.release = as_matrix(self.release, "release")
        self.query_labels = [int(v) for v in as_labels(np.asarray(self.query_labels), len(self.query_labels),
                                                       "query_labels")]
        if len(self.query_labels) < 1:
            raise RequestError("a release request needs at least one query row (query_labels is empty).")
        if len(self.anchor_ids) + len(self.query_labels) != self.release.shape[0]:
            raise RequestError(f"release has {self.release.shape[0]} rows; expected {len(self.query_labels)} query "
                               f"rows + {len(self.anchor_ids)} anchor rows.")
        wire.check_values(self.release, "release")
        try:
            self.epsilon, self.delta = wire.privacy(self.epsilon, self.delta)
            for name in ("sensitivity", "noise_sigma", "q_rms", "post_alpha"):
                setattr(self, name, wire.number(getattr(self, name), name, lo=0.0))
            self.mechanism = wire.mechanism(self.mechanism, self.epsilon)
            self.params = wire.paper_params(self.params)
        except InvalidInputError as exc:
            raise RequestError(str(exc)) from None
        if self.q_rms <= 0:
            raise RequestError("q_rms must be positive.")
        if isinstance(self.n_post_iter, bool) or int(self.n_post_iter) != self.n_post_iter or \
                not 0 <= int(self.n_post_iter) <= MAX_POST_ITER:
            raise RequestError(f"n_post_iter must be an integer in 0..{MAX_POST_ITER}, got {self.n_post_iter!r}.")
        self.n_post_iter = int(self.n_post_iter)

    @property
    def n_query_rows(self) -> int:
        return len(self.query_labels)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["release"] = self.release.tolist()
        d["anchor_ids"] = [a.item() if isinstance(a, np.generic) else a for a in self.anchor_ids]
        d["format"] = RELEASE_FORMAT
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping) -> "ReleaseRequest":
        if not isinstance(d, Mapping):
            raise RequestError("a release request must be a JSON object.")
        if d.get("format") != RELEASE_FORMAT:
            raise RequestError(f"unsupported format {d.get('format')!r}; expected {RELEASE_FORMAT!r}.")
        need = ("anchor_ids", "release", "query_labels", "epsilon", "delta", "sensitivity", "noise_sigma", "q_rms",
                "mechanism", "n_post_iter", "post_alpha")
        missing = [k for k in need if k not in d]
        if missing:
            raise RequestError(f"release request is missing fields: {', '.join(missing)}.")
        try:
            rel = np.asarray(d["release"], dtype=np.float64)
        except (TypeError, ValueError):
            raise RequestError("release must be a list of equal-length lists of numbers.") from None
        if not isinstance(d["anchor_ids"], list) or not isinstance(d["query_labels"], list):
            raise RequestError("anchor_ids and query_labels must be lists.")
        try:
            return cls(anchor_ids=list(d["anchor_ids"]), release=rel, query_labels=list(d["query_labels"]),
                       epsilon=d["epsilon"], delta=d["delta"], sensitivity=d["sensitivity"],
                       noise_sigma=d["noise_sigma"], q_rms=d["q_rms"], mechanism=d["mechanism"],
                       n_post_iter=d["n_post_iter"], post_alpha=d["post_alpha"],
                       params=d.get("params"), collection=d.get("collection"))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, InvalidInputError):
                raise
            raise RequestError(f"release request has a field of the wrong type ({exc}).") from None


class ReleaseOnlyPrivateMail(PrivateMail):
    """A :class:`~pm_vector.client.PrivateMail` client that can stop after the noisy first
    iteration and leave the post-processing to the server (iteration-distribute-recursion).

    :meth:`request_release` runs exactly the steps of :meth:`PrivateMail.request` -- same
    dummies, shuffle, noise for the same seed -- but returns the release instead of
    post-processing it. :meth:`request` still builds ordinary requests.
    """

    _capture: dict | None = None

    def post_process(self, release, query_labels, *, noise_sigma: float, q_rms: float):
        if self._capture is None:
            return super().post_process(release, query_labels, noise_sigma=noise_sigma, q_rms=q_rms)
        self._capture.update(release=np.array(release, dtype=np.float64), query_labels=np.asarray(query_labels),
                             noise_sigma=float(noise_sigma), q_rms=float(q_rms))
        return np.zeros((len(query_labels), self.frame.anchor_embedding_.shape[1]))

    def request_release(self, query, label: int, anchor, collection: str | None = None):
        """``(ReleaseRequest, ClientSecret)`` for one query row; nothing is post-processed."""
        self._capture = {}
        try:
            req, secret = self.request(query, label, anchor, collection)
            cap = self._capture
        finally:
            self._capture = None
        rel = ReleaseRequest(anchor_ids=list(req.anchor_ids), release=cap["release"],
                             query_labels=[int(v) for v in cap["query_labels"]], epsilon=req.epsilon,
                             delta=req.delta, sensitivity=req.sensitivity, noise_sigma=cap["noise_sigma"],
                             q_rms=cap["q_rms"], mechanism=req.mechanism, n_post_iter=int(self.n_post_iter),
                             post_alpha=float(self.post_alpha), params=dict(req.params), collection=collection)
        return rel, secret
