"""A class-rows request (:class:`ClassRowsRequest`): what leaves a :class:`~pm_vector.client.query.PrivateKNN`
client, one noised row per class (:mod:`pm_vector.privacy.class_rows` states the guarantee), and
the digest of the published class frames it was built on (:func:`frames_digest`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal, Mapping, Optional

import numpy as np

from .._validation import as_labels, as_matrix
from ..errors import InvalidInputError
from ..privacy.class_rows import NOISE
from . import bounds
from .formats import CLASS_ROWS_FORMAT, expect
from .wire_types import (Collection, Delta, Epsilon, Field, Int64, Shortlist, StrictBool, check_keys, matrix, wire,
                         wire_names)

if TYPE_CHECKING:
    from ..manifold.class_frames import ClassFrames

#: candidates per row the server is asked for by default (k')
DEFAULT_SHORTLIST = 128


def frames_digest(frames: "ClassFrames") -> str:
    """A digest of the published frames: the server refuses a request built on other frames."""
    doc = frames.to_dict()
    h = hashlib.sha256()
    for key in ("n_components", "clip_quantile", "classes"):
        h.update(json.dumps(doc[key]).encode())
    for a in (frames.means_, frames.components_, frames.radii_):
        # + 0.0 turns -0.0 into 0.0: a frame that went through a JSON store must hash the same
        h.update(np.ascontiguousarray(np.round(a, 12) + 0.0, dtype=np.float64).tobytes())
    return h.hexdigest()[:32]


#: the noise name requests of older clients carry (before the discrete Gaussian was named)
_OLD_NOISE = "gaussian"


@dataclass
class ClassRowsRequest:
    """What leaves the client: ``rows`` (``C x d``, class order), the classes, (epsilon, delta),
    the noise per row, the frames' digest, ``shortlist`` (k'), ``seeded`` (true only for a
    request built with an injected generator: tests and benchmarks), and the release's provenance:
    ``noise`` (``"discrete_gaussian"``) and ``grid`` (the public grid step of each row; every row
    value is an integer multiple of it), and ``release`` (always ``"gaussian"``: which release the
    request is; the cell release's requests are :class:`~pm_vector.client.request.CellRequest`)."""

    # each field once, with its wire type: the document's model (ClassRowsRequestBody) is made from these
    rows: np.ndarray = field(metadata=wire(matrix("request.rows", "C x d noised rows, in class order.")))
    classes: list = field(metadata=wire(Annotated[list[Int64], Field(description="The class of each row.")]))
    epsilon: float = field(metadata=wire(Epsilon))
    delta: float = field(metadata=wire(Delta))
    noise_scale: float = field(metadata=wire(Annotated[float, Field(strict=True, gt=0, le=bounds.MAX_ABS_VALUE)]))
    sigmas: list = field(metadata=wire(list[Annotated[float, Field(strict=True, ge=0, le=bounds.MAX_ABS_VALUE)]]))
    frames_digest: str = field(metadata=wire(Annotated[str, Field(strict=True, max_length=bounds.MAX_DIGEST_CHARS)]))
    shortlist: int = field(default=DEFAULT_SHORTLIST, metadata=wire(Shortlist))
    seeded: bool = field(default=False, metadata=wire(StrictBool))
    collection: str | None = field(default=None, metadata=wire(Collection))
    noise: str | None = field(default=None, metadata=wire(Optional[Literal["gaussian", NOISE]]))
    grid: list | None = field(default=None, metadata=wire(
        Optional[list[Annotated[float, Field(strict=True, gt=0, le=bounds.MAX_ABS_VALUE)]]]))
    release: str = field(default="gaussian", metadata=wire(Literal["gaussian"]))

    def __post_init__(self):
        expect(self.release, "gaussian", f"a class-rows request has release 'gaussian'; got {self.release!r:.40}.")
        self.rows = as_matrix(self.rows, "rows")
        C = self.rows.shape[0]
        if self.noise not in (None, _OLD_NOISE, NOISE):
            raise InvalidInputError(f"noise must be {NOISE!r} (or 'gaussian' for requests of older clients); "
                                    f"got {self.noise!r:.40}.")
        bounds.check_values(self.rows, "rows")
        if self.grid is not None:
            self.grid = bounds.number_list(self.grid, "grid", C, lo=0.0, lo_open=True)
        self.classes = [int(c) for c in as_labels(np.asarray(self.classes), C, "classes")]
        self.sigmas = bounds.number_list(self.sigmas, "sigmas", C, lo=0.0)
        self.epsilon, self.delta = bounds.privacy(self.epsilon, self.delta)
        self.noise_scale = bounds.number(self.noise_scale, "noise_scale", lo=0.0, lo_open=True)
        bounds.digest(self.frames_digest, "frames_digest must be the 32-character digest of the published frames.",
                      empty=True)
        self.collection = bounds.collection(self.collection)
        if isinstance(self.shortlist, bool) or int(self.shortlist) != self.shortlist or int(self.shortlist) < 1:
            raise InvalidInputError(f"shortlist must be a positive integer; got {self.shortlist!r}.")
        self.shortlist = int(self.shortlist)
        self.seeded = bounds.flag(self.seeded, "seeded")

    @property
    def n_rows(self) -> int:
        return int(self.rows.shape[0])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = self.rows.tolist()
        d["format"] = CLASS_ROWS_FORMAT
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ClassRowsRequest":
        expect(d.get("format") if isinstance(d, Mapping) else None, CLASS_ROWS_FORMAT,
               f"not a pm_vector request (format {CLASS_ROWS_FORMAT!r} expected).")
        need, optional = cls._NEED, cls._OPTIONAL
        check_keys(d, need, optional, "request",
                   f"a pm_vector request has {sorted(need)} and optionally {', '.join(optional)}")
        try:
            rows = np.asarray(d["rows"])
        except (TypeError, ValueError):
            rows = None
        if rows is None or rows.dtype.kind not in "iuf":  # no strings, booleans or ragged rows
            raise InvalidInputError("rows must be a list of equal-length lists of numbers.")
        for k in ("classes", "sigmas"):
            if not isinstance(d[k], (list, tuple, np.ndarray)):
                raise InvalidInputError(f"{k} must be a list (one entry per row).")
        if not isinstance(d["frames_digest"], str):
            raise InvalidInputError("frames_digest must be the 32-character digest of the published frames.")
        try:
            return cls(**{**{k: d[k] for k in need + optional if k in d},
                          "rows": rows, "classes": list(d["classes"]), "sigmas": list(d["sigmas"])})
        except (TypeError, ValueError, OverflowError) as exc:  # a field of another type than the schema's
            raise InvalidInputError(f"invalid pm_vector request: a field has the wrong type ({exc}).") from None


#: the document's required and optional keys, read from the fields
ClassRowsRequest._NEED, ClassRowsRequest._OPTIONAL = wire_names(ClassRowsRequest)
