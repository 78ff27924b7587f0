"""The client of a pm_vector request: build the private release, keep the secret, re-rank.

::

    client = PrivateKNN(frames, dummy_features, dummy_labels, epsilon=4.0)
    request, secret = client.request(x, label=3)         # or label=None with a classifier
    answer = server_resolve(request)                      # one entry per class row
    real = secret.pick(answer["rows"])
    top8 = client.rerank_codes(x, real["item_ids"], real["codes"], codes, k=8)  # a compact answer:
                                                          # by the published ProductCodes ``codes``
    top8 = client.rerank(x, real["item_ids"], real["features"], k=8)  # or by raw features

The request is one noised row per class (:mod:`pm_vector.privacy.class_rows` states the
guarantee): the real query in its class's row, a public dummy in every other. The client keeps
which row is real (:class:`~pm_vector.client.request.ClientSecret`). The server answers every row with ``k'`` candidates
and what the client needs to re-rank them (raw features or a published code); the client
re-ranks its real row's candidates locally and sends nothing more.

Randomness: dummies come from :mod:`secrets`; the noise (exact discrete Gaussian on a public
grid, :mod:`pm_vector.privacy.class_rows`) from a generator seeded with 128 bits from
:mod:`secrets`. No public API takes a seed; tests and benchmarks inject a generator with
:meth:`PrivateKNN._inject_generator`, and a request built that way says ``"seeded": true``.

Budget: every unseeded request is charged *before* its noise is drawn -- to ``accountant`` (any
object with ``spend(epsilon, delta, label=None)``: a
:class:`~pm_vector.privacy.PrivacyAccountant`, or a ledger entry from
:meth:`~pm_vector.client.budget.PrivacyBudget.account`). :class:`~pm_vector.client.http.Client`
passes its server's entry (its origin, :meth:`~pm_vector.client.http.Client.budget_key`), so a
query through a Client is charged once, there. Without an accountant the default ledger
(:class:`~pm_vector.client.budget.PrivacyBudget`, default budget) is charged under the one key
:data:`~pm_vector.client.budget.LOCAL_KEY` (``"local"``), whatever the collection or frames: the
key is the caller's, nothing published selects it (``accountant=client.account()`` charges a
Client's server instead). A refused request raises :class:`~pm_vector.errors.BudgetExceededError`
and releases nothing. A seeded request is not a private release (its noise can be recomputed
from the seed) and is not charged; services refuse it unless set to allow seeded requests.
"""

from __future__ import annotations

import secrets

import numpy as np

from .._validation import as_labels, as_matrix, normalize_rows
from ..errors import InvalidInputError
from ..manifold.class_frames import ClassFrames
from ..privacy.class_rows import ClassRowsGaussianMechanism
from ..privacy.rng import secure_generator
from ..protocol import bounds
# the wire types live in pm_vector.protocol; re-exported here (their old home)
from ..protocol.class_rows import DEFAULT_SHORTLIST, ClassRowsRequest, frames_digest
from ..protocol.formats import CLASS_ROWS_FORMAT
from .charging import ChargedRelease
from .request import ClientSecret
from .rerank import rerank, rerank_ids
from ..deprecation import renamed

__all__ = ["CLASS_ROWS_FORMAT", "DEFAULT_SHORTLIST", "ClassRowsRequest", "ClientSecret", "PrivateKNN", "frames_digest",
           "rerank"]


def __getattr__(name):  # old names (pm_vector.deprecation.RENAMED), until its REMOVED_IN

    return renamed(__name__, name)


class PrivateKNN(ChargedRelease):
    """Builds pm_vector requests against published class frames and a public dummy pool.

    ``classifier``: any fitted object with ``predict`` (e.g. a
    :class:`~pm_vector.kahm.KAHMClassifier` fit on the public anchor) used when a query comes
    without a label; its choice is an input of the release like a label, so the guarantee is
    the same. ``shortlist``: k' candidates asked per row. ``accountant``: what every unseeded
    request is charged to (module doc); None charges the default ledger under ``"local"``.
    """

    def __init__(self, frames: ClassFrames, dummy_features, dummy_labels, epsilon: float = 4.0, delta: float = 1e-5,
                 *, shortlist: int = DEFAULT_SHORTLIST, classifier=None, collection: str | None = None,
                 accountant=None):
        self.frames = frames
        bounds.privacy(epsilon, delta)  # the request's bounds, checked before anything is charged
        self.mechanism = ClassRowsGaussianMechanism(epsilon, delta, frames.radii_, frames.components_.shape[1])
        self._set_accountant(accountant)  # None: the default ledger's key "local", nothing published selects it
        D = as_matrix(dummy_features, "dummy features")
        yd = as_labels(dummy_labels, D.shape[0], "dummy labels")
        self._pool = {}
        for c in frames.classes_:
            idx = np.flatnonzero(yd == c)
            if idx.size == 0:
                raise InvalidInputError(f"the dummy pool has no item of class {int(c)}; every class needs at least one "
                                        "public dummy.")
            # the pool is public: its frame coordinates are computed once
            self._pool[int(c)] = frames.clipped(D[idx], np.full(idx.size, c))
        self.shortlist = int(shortlist)
        self.classifier = classifier
        self.collection = collection
        self.digest = frames_digest(frames)

    def _choose(self, n: int) -> int:
        return int(self._rng.integers(n)) if self._rng is not None else secrets.randbelow(n)

    def request(self, x, label: int | None = None) -> tuple[ClassRowsRequest, ClientSecret]:
        """``(ClassRowsRequest, ClientSecret)`` for one query ``x`` (raw features, scaled to unit norm
        like the collection's rows) of class ``label``; ``label=None`` asks the client's
        classifier."""
        x = as_matrix(np.asarray(x, dtype=np.float64).reshape(1, -1), "query")
        if x.shape[1] != self.frames.n_features_in_:
            raise InvalidInputError(f"query has {x.shape[1]} features; the collection's frames have "
                                    f"{self.frames.n_features_in_}.")
        # unit norm, as the collection's rows are at ingest (the clip below bounds the privacy
        # whatever the input; this is for utility)
        x = normalize_rows(x)
        predicted = label is None
        if predicted:
            if self.classifier is None:
                raise InvalidInputError("no label given and no classifier: pass label=, or build the client with "
                                        "classifier= (e.g. a KAHMClassifier fit on the public anchor).")
            label = int(np.asarray(self.classifier.predict(x)).reshape(-1)[0])
        row = int(self.frames.class_index([int(label)])[0])
        self._charge()
        rows = np.empty((len(self.frames.classes_), self.frames.components_.shape[1]))
        for j, c in enumerate(self.frames.classes_):
            if j == row:
                rows[j] = self.frames.clipped(x, [c])[0]
            else:
                pool = self._pool[int(c)]
                rows[j] = pool[self._choose(pool.shape[0])]
        noise_rng = self._rng if self._rng is not None else secure_generator()
        released = self.mechanism.release(rows, noise_rng)
        req = ClassRowsRequest(rows=released, classes=self.frames.classes_.tolist(), epsilon=self.mechanism.epsilon,
                           delta=self.mechanism.delta, noise_scale=self.mechanism.noise_scale_,
                           sigmas=self.mechanism.sigmas_.tolist(), frames_digest=self.digest,
                           shortlist=self.shortlist, seeded=self._rng is not None, collection=self.collection,
                           noise=self.mechanism.noise,
                           grid=None if self.mechanism.grid_ is None else self.mechanism.grid_.tolist())
        return req, ClientSecret(real_row=row, label=int(label), predicted=predicted)

    @staticmethod
    def rerank(x, candidate_ids, candidate_features, k: int = 8) -> np.ndarray:
        """The ``k`` candidate ids nearest to ``x`` by raw features
        (:func:`pm_vector.client.rerank.rank`)."""
        return rerank_ids(x, candidate_ids, candidate_features, k)

    @staticmethod
    def rerank_codes(x, candidate_ids, codes, product_codes, k: int = 8) -> np.ndarray:
        """The ``k`` candidate ids nearest to ``x`` by their product codes (a compact answer's):
        :meth:`~pm_vector.manifold.codes.ProductCodes.distances`, the asymmetric distance of the
        exact query to each coded candidate; stable for ties (:func:`pm_vector.client.rerank.rank`)."""
        return rerank_ids(x, candidate_ids, k=k, codes=codes, product_codes=product_codes)
