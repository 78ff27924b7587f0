"""What a PrivateMail client sends (the request) and what it keeps (the secret)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from .._validation import as_matrix
from ..errors import InvalidInputError
from . import wire

FORMAT = "pm_vector.privatemail/1"


@dataclass
class PrivateMailRequest:
    """The released part of a PrivateMail query: nothing here is raw client data.

    ``embedding`` has ``n_query_rows`` query rows (the real one and one dummy per other class,
    in a CSPRNG-shuffled order) followed by one row per anchor in ``anchor_ids`` order.
    """

    anchor_ids: list
    embedding: np.ndarray
    n_query_rows: int
    epsilon: float
    delta: float
    sensitivity: float
    noise_sigma: float
    mechanism: str
    params: dict = field(default_factory=dict)
    collection: str | None = None

    def __post_init__(self):
        self.embedding = as_matrix(self.embedding, "embedding")
        wire.check_values(self.embedding, "embedding")
        self.n_query_rows = wire.integer(self.n_query_rows, "n_query_rows", 1, self.embedding.shape[0])
        self.epsilon, self.delta = wire.privacy(self.epsilon, self.delta)
        self.sensitivity = wire.number(self.sensitivity, "sensitivity", lo=0.0, lo_open=True)
        self.noise_sigma = wire.number(self.noise_sigma, "noise_sigma", lo=0.0)
        self.mechanism = wire.mechanism(self.mechanism, self.epsilon)
        self.params = wire.paper_params(self.params)
        if not isinstance(self.anchor_ids, list):
            raise InvalidInputError("anchor_ids must be a list of anchor ids.")
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
        d["format"] = FORMAT
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "PrivateMailRequest":
        if not isinstance(d, dict):
            raise InvalidInputError("a PrivateMail request must be a JSON object.")
        if d.get("format", FORMAT) != FORMAT:
            raise InvalidInputError(f"unsupported request format {d.get('format')!r}; expected {FORMAT!r}.")
        missing = [k for k in ("anchor_ids", "embedding", "n_query_rows", "epsilon", "delta", "sensitivity",
                               "noise_sigma", "mechanism") if k not in d]
        if missing:
            raise InvalidInputError(f"request is missing fields: {', '.join(missing)}.")
        try:
            emb = np.asarray(d["embedding"])
        except (TypeError, ValueError):
            emb = None
        if emb is None or emb.dtype.kind not in "iuf":  # no strings, booleans or ragged rows
            raise InvalidInputError("request embedding must be a list of equal-length lists of numbers.")
        if not isinstance(d["anchor_ids"], list):
            raise InvalidInputError("anchor_ids must be a list of anchor ids.")
        # the fields' types are checked as they are (a boolean is not a number, a string not a flag)
        return cls(anchor_ids=list(d["anchor_ids"]), embedding=emb.astype(np.float64),
                   n_query_rows=d["n_query_rows"], epsilon=d["epsilon"], delta=d["delta"],
                   sensitivity=d["sensitivity"], noise_sigma=d["noise_sigma"], mechanism=d["mechanism"],
                   params=d.get("params"), collection=d.get("collection"))

    @classmethod
    def from_json(cls, s: str) -> "PrivateMailRequest":
        try:
            return cls.from_dict(json.loads(s))
        except json.JSONDecodeError as e:
            raise InvalidInputError(f"request is not valid JSON: {e}.") from None


@dataclass(frozen=True)
class ClientSecret:
    """Kept by the client, never sent: which query row is the real one."""

    real_row: int
    label: int
    row_labels: tuple

    def pick(self, per_row_results: list):
        """The real row's answer from the server's per-row results."""
        return per_row_results[self.real_row]
