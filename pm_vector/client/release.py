"""The paper's iteration-distribute-recursion option, client side: a PrivateMail request that
stops after the private first iteration (:class:`ReleaseRequest`, built by
:class:`ReleaseOnlyPrivateMail`). The server post-processes it
(:func:`pm_vector.db.resolve.paper_resolution.post_process_release`); see that module for what the
client reveals by sending it.
"""

from __future__ import annotations

import numpy as np

from ..protocol.bounds import MAX_POST_ITER
from ..protocol.formats import RELEASE_FORMAT
from ..protocol.paper import ReleaseRequest
from .privatemail import PrivateMail

__all__ = ["MAX_POST_ITER", "RELEASE_FORMAT", "ReleaseOnlyPrivateMail", "ReleaseRequest"]

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
