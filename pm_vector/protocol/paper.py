"""The paper protocol's requests: :class:`PrivateMailRequest` (what leaves a
:class:`~pm_vector.client.PrivateMail` client, post-processed) and :class:`ReleaseRequest` (the
iteration-distribute-recursion option: the noisy first iteration only, built by
:class:`~pm_vector.client.release.ReleaseOnlyPrivateMail`; the server post-processes it,
:func:`pm_vector.db.resolve.paper_resolution.post_process_release`, whose module says what the client
reveals by sending it)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Annotated, Literal, Mapping, Optional

import numpy as np

from .._validation import as_labels, as_matrix
from ..errors import InvalidInputError, RequestError
from . import bounds
from .bounds import MAX_ANCHOR_ID_CHARS, MAX_POST_ITER
from .formats import PRIVATEMAIL_FORMAT, RELEASE_FORMAT, expect
from .wire_types import (AnchorId, Collection, Delta, Epsilon, Field, PaperParams, check_keys, int_in, matrix, wire,
                         wire_names)


@dataclass
class PrivateMailRequest:
    """The released part of a PrivateMail query: nothing here is raw client data.

    ``embedding`` has ``n_query_rows`` query rows (the real one and one dummy per other class,
    in a CSPRNG-shuffled order) followed by one row per anchor in ``anchor_ids`` order.
    """

    # each field once, with its wire type: the document's model (PrivateMailRequestBody) is made from these
    anchor_ids: list = field(metadata=wire(list[AnchorId]))
    embedding: np.ndarray = field(metadata=wire(matrix("request.embedding", "n_query_rows query rows, then one row per "
                                                                            "anchor id.")))
    n_query_rows: int = field(metadata=wire(int_in(1, bounds.MAX_QUERY_ROWS)))
    epsilon: float = field(metadata=wire(Epsilon))
    delta: float = field(metadata=wire(Delta))
    sensitivity: float = field(metadata=wire(Annotated[float, Field(strict=True, gt=0, le=bounds.MAX_ABS_VALUE)]))
    noise_sigma: float = field(metadata=wire(Annotated[float, Field(strict=True, ge=0, le=bounds.MAX_ABS_VALUE)]))
    mechanism: str = field(metadata=wire(Literal[bounds.PAPER_MECHANISMS]))
    params: dict = field(default_factory=dict, metadata=wire(Optional[PaperParams], None))
    collection: str | None = field(default=None, metadata=wire(Collection))

    #: a post-processed request: the server answers it as it is (a :class:`ReleaseRequest` is post-processed first)
    release_only = False

    @property
    def rows(self) -> np.ndarray:
        """The released rows the server reads (query rows, then anchor rows)."""
        return self.embedding

    def __post_init__(self):
        self.embedding = as_matrix(self.embedding, "embedding")
        bounds.check_values(self.embedding, "embedding")
        self.n_query_rows = bounds.integer(self.n_query_rows, "n_query_rows", 1, self.embedding.shape[0])
        self.epsilon, self.delta = bounds.privacy(self.epsilon, self.delta)
        self.sensitivity = bounds.number(self.sensitivity, "sensitivity", lo=0.0, lo_open=True)
        self.noise_sigma = bounds.number(self.noise_sigma, "noise_sigma", lo=0.0)
        self.mechanism = bounds.mechanism(self.mechanism, self.epsilon)
        self.params = bounds.paper_params(self.params)
        if not isinstance(self.anchor_ids, list) or not all(
                isinstance(i, (int, np.integer, str)) and not isinstance(i, (bool, np.bool_)) for i in self.anchor_ids):
            raise InvalidInputError("anchor_ids must be a list of anchor ids.")
        if any(not isinstance(i, str) and not -2 ** 63 <= int(i) < 2 ** 63 for i in self.anchor_ids) or \
                any(isinstance(i, str) and (len(i) > MAX_ANCHOR_ID_CHARS or "\x00" in i) for i in self.anchor_ids):
            raise InvalidInputError("anchor_ids holds an id outside the 64-bit range or an invalid string; send the "
                                    "ids of the anchor document.")
        if len(self.anchor_ids) + int(self.n_query_rows) != self.embedding.shape[0]:
            raise InvalidInputError(f"embedding has {self.embedding.shape[0]} rows; expected {self.n_query_rows} "
                                    f"query rows + {len(self.anchor_ids)} anchor rows.")

    @property
    def query_rows(self) -> np.ndarray:
        return self.embedding[: self.n_query_rows]

    @property
    def anchor_rows(self) -> np.ndarray:
        return self.embedding[self.n_query_rows:]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["embedding"] = self.embedding.tolist()
        d["anchor_ids"] = [a.item() if isinstance(a, np.generic) else a for a in self.anchor_ids]
        d["format"] = PRIVATEMAIL_FORMAT
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "PrivateMailRequest":
        if not isinstance(d, dict):
            raise InvalidInputError("a PrivateMail request must be a JSON object.")
        expect(d.get("format", PRIVATEMAIL_FORMAT), PRIVATEMAIL_FORMAT,
               f"unsupported request format {d.get('format')!r}; expected {PRIVATEMAIL_FORMAT!r}.")
        check_keys(d, cls._NEED, cls._OPTIONAL, "request", f"a PrivateMail request has {sorted(PAPER_FIELDS)}")
        try:
            emb = np.asarray(d["embedding"])
        except (TypeError, ValueError):
            emb = None
        if emb is None or emb.dtype.kind not in "iuf":  # no strings, booleans or ragged rows
            raise InvalidInputError("request embedding must be a list of equal-length lists of numbers.")
        if not isinstance(d["anchor_ids"], list):
            raise InvalidInputError("anchor_ids must be a list of anchor ids.")
        # the fields' types are checked as they are (a boolean is not a number, a string not a flag)
        return cls(**{**{k: d.get(k) for k in cls._NEED + cls._OPTIONAL},
                      "anchor_ids": list(d["anchor_ids"]), "embedding": emb.astype(np.float64)})

    @classmethod
    def from_json(cls, s: str) -> "PrivateMailRequest":
        try:
            return cls.from_dict(json.loads(s))
        except json.JSONDecodeError as e:
            raise InvalidInputError(f"request is not valid JSON: {e}.") from None


#: the document's required and optional keys, read from the fields
PrivateMailRequest._NEED, PrivateMailRequest._OPTIONAL = wire_names(PrivateMailRequest)
#: the fields of a PrivateMail request document
PAPER_FIELDS = ("format",) + PrivateMailRequest._NEED + PrivateMailRequest._OPTIONAL


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

    #: the server post-processes it (:func:`pm_vector.db.resolve.paper_resolution.post_process_release`)
    release_only = True

    @property
    def rows(self) -> np.ndarray:
        """The released rows the server reads (query rows, then anchor rows)."""
        return self.release

    def __post_init__(self):
        self.release = as_matrix(self.release, "release")
        self.query_labels = [int(v) for v in as_labels(np.asarray(self.query_labels), len(self.query_labels),
                                                       "query_labels")]
        if len(self.query_labels) < 1:
            raise RequestError("a release request needs at least one query row (query_labels is empty).")
        if len(self.anchor_ids) + len(self.query_labels) != self.release.shape[0]:
            raise RequestError(f"release has {self.release.shape[0]} rows; expected {len(self.query_labels)} query "
                               f"rows + {len(self.anchor_ids)} anchor rows.")
        bounds.check_values(self.release, "release")
        try:
            self.epsilon, self.delta = bounds.privacy(self.epsilon, self.delta)
            for name in ("sensitivity", "noise_sigma", "q_rms", "post_alpha"):
                setattr(self, name, bounds.number(getattr(self, name), name, lo=0.0))
            self.mechanism = bounds.mechanism(self.mechanism, self.epsilon)
            self.params = bounds.paper_params(self.params)
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
        expect(d.get("format"), RELEASE_FORMAT, f"unsupported format {d.get('format')!r}; expected {RELEASE_FORMAT!r}.",
               RequestError)
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
