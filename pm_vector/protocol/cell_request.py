"""A cell request (:class:`CellRequest`): what leaves a :class:`~pm_vector.client.cell_client.PrivateCellKNN`
client in a cell release (:mod:`pm_vector.privacy.cell_release`), one reported public cell per class."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..errors import InvalidInputError
from .class_rows import DEFAULT_SHORTLIST
from . import bounds
from .formats import CELL_FORMAT, expect
from .wire_types import (Collection, Digest, PureEpsilon, Reports, Shortlist, StrictBool, ZeroDelta, check_keys, int_in,
                         wire, wire_names)

#: the most cells of a cell request's level
MAX_CELLS = 1 << 20


@dataclass
class CellRequest:
    """What leaves the client in a cell release (:mod:`pm_vector.privacy.cell_release`): one reported cell
    per class (``reports``, class order, each in ``[0, n_cells)``), the level ``n_cells`` (K, the
    same for every class), ``epsilon`` (> 0, or inf for benchmarks), ``delta`` (always 0: pure
    eps), the published cells' digest, ``shortlist`` (k'), ``collection``, ``release`` (always
    ``"cells"``) and ``seeded`` (true only for a request built with an injected generator)."""

    # each field once, with its wire type: the document's model (CellRequestBody) is made from these
    reports: list = field(metadata=wire(Reports))
    n_cells: int = field(metadata=wire(int_in(2, MAX_CELLS, "K, the level of every class.")))
    epsilon: float = field(metadata=wire(PureEpsilon))
    cells_digest: str = field(metadata=wire(Digest))
    shortlist: int = field(default=DEFAULT_SHORTLIST, metadata=wire(Shortlist))
    collection: str | None = field(default=None, metadata=wire(Collection))
    release: str = field(default="cells", metadata=wire(Literal["cells"]))
    delta: float = field(default=0.0, metadata=wire(ZeroDelta))
    seeded: bool = field(default=False, metadata=wire(StrictBool))

    def __post_init__(self):
        expect(self.release, "cells", f"a cell request has release 'cells'; got {self.release!r:.40}.")
        K = self.n_cells
        if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or not 2 <= int(K) <= MAX_CELLS:
            raise InvalidInputError(f"n_cells must be an integer in [2, 2^20]; got {K!r:.40}.")
        self.n_cells = int(K)
        if not isinstance(self.reports, (list, tuple, np.ndarray)) or len(self.reports) < 1:
            raise InvalidInputError("reports must be a non-empty list of integers (one cell per class).")
        reps = []
        for r in self.reports:
            if isinstance(r, (bool, np.bool_)) or not isinstance(r, (int, np.integer)) or not 0 <= int(r) < self.n_cells:
                raise InvalidInputError(f"every report must be an integer in [0, {self.n_cells}); got {r!r:.40}.")
            reps.append(int(r))
        self.reports = reps
        self.epsilon = bounds.pure_epsilon(self.epsilon)
        self.delta = bounds.zero_delta(self.delta, "a cell request")
        bounds.digest(self.cells_digest, "cells_digest must be the hex digest of the published cells.")
        self.collection = bounds.collection(self.collection)
        k = self.shortlist
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or int(k) < 1:
            raise InvalidInputError(f"shortlist must be a positive integer; got {k!r:.40}.")
        self.shortlist = int(k)
        if not isinstance(self.seeded, (bool, np.bool_)):
            raise InvalidInputError("seeded must be true or false.")
        self.seeded = bool(self.seeded)

    @property
    def n_rows(self) -> int:
        return len(self.reports)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self._NEED + self._OPTIONAL}
        d["reports"] = list(self.reports)
        d["format"] = CELL_FORMAT
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d) -> "CellRequest":
        expect(d.get("format") if isinstance(d, dict) else None, CELL_FORMAT,
               f"not a cell request (format {CELL_FORMAT!r} expected).")
        check_keys(d, cls._NEED, cls._OPTIONAL, "cell request",
                   f"a cell request has {list(cls._NEED)} and optionally {list(cls._OPTIONAL)}")
        try:
            return cls(**{k: d[k] for k in cls._NEED + cls._OPTIONAL if k in d})
        except (TypeError, ValueError, OverflowError) as exc:  # a field of another type than the schema's
            raise InvalidInputError(f"invalid cell request: a field has the wrong type ({exc}).") from None

    @classmethod
    def from_json(cls, s: str) -> "CellRequest":
        try:
            return cls.from_dict(json.loads(s))
        except json.JSONDecodeError as e:
            raise InvalidInputError(f"request is not valid JSON: {e}.") from None


#: the document's required and optional keys, read from the fields
CellRequest._NEED, CellRequest._OPTIONAL = wire_names(CellRequest)
