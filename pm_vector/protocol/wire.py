"""The request documents as pydantic models: the wire contract of a resolve, once.

Each model is the document a request type's ``to_dict()`` writes (:class:`ClassRowsRequestBody`,
:class:`CellRequestBody`, :class:`LocationRequestBody`, :class:`PrivateMailRequestBody`), with
the bounds of :mod:`pm_vector.protocol.bounds` on its fields: strict types (a boolean is not a
number, a string not a flag), finite numbers within :data:`~.bounds.MAX_ABS_VALUE`, the ranges
of each field. The same model validates a body and makes its schema in ``/openapi.json``; the
service builds the resolve body's discriminated union from the table of releases
(:mod:`pm_vector.protocol.releases`, each entry's ``wire_model``), on the ``format`` field.

A server's own limits (rows, dimensions, k, k', rows x k of an answer, the collection a request
was built for) come in the validation context (:data:`LIMITS` keys, and ``collection``); without
a context only the protocol's bounds apply. Refusals a size limit makes carry an error type of
:data:`TOO_LARGE` (the service answers them 413, every other refusal 422).

What a model says about its answer (class variables, read by the service, not a switch on a
name; the answers a body may ask for are the release's ``answers``): ``ANSWER_RULE`` (the
refusal of another), ``BODY_CODE_BYTES`` (whether the body's ``code_bytes`` applies),
``ON_REPLICA`` (whether a replica may answer it), ``ANSWER_MODEL`` (the answer document's model,
:mod:`.answers_wire`), and :meth:`result_cells` (rows x candidates of its answer)."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr,
                      ValidationInfo, model_validator)
from pydantic_core import PydanticCustomError

from ..privacy.class_rows import NOISE
from . import bounds
from .answers_wire import LocationAnswer, RowsAnswer
from .class_rows import DEFAULT_SHORTLIST
from .formats import CELL_FORMAT, CLASS_ROWS_FORMAT, LOCATION_FORMAT, PRIVATEMAIL_FORMAT
from .location import MAX_CANDIDATES, MAX_CODE_BYTES, MAX_LEVEL
from .paper import MAX_ANCHOR_ID_CHARS

#: the server limits a validation context may hold (pm_vector.service.settings.ServiceSettings)
LIMITS = ("max_rows", "max_dim", "max_k", "max_shortlist", "max_result_cells")
#: error types of a refusal by size (413): the rest are 422
TOO_LARGE = ("too_many_rows", "too_many_dimensions", "result_too_large")
#: the most cells of a cell request's level (pm_vector.protocol.cell_request)
MAX_CELLS = 1 << 20


def _limit(info: ValidationInfo | None, name: str) -> int | None:
    ctx = info.context if info is not None else None
    return ctx.get(name) if isinstance(ctx, dict) else None


#: a JSON number (never a boolean or a string), finite, within MAX_ABS_VALUE
Number = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-bounds.MAX_ABS_VALUE, le=bounds.MAX_ABS_VALUE)]
#: a PostgreSQL bigint, strictly an integer
Int64 = Annotated[int, Field(strict=True, ge=-(2 ** 63), le=2 ** 63 - 1)]


def _not_nan(v: float) -> float:
    if math.isnan(v):
        raise PydanticCustomError("finite_number", "epsilon must be a number > 0 (or inf), got nan.")
    return v


#: epsilon of a pure-eps release: a number > 0, or infinity (benchmarks; a msgpack float)
PureEpsilon = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=True), AfterValidator(_not_nan)]
#: delta of a pure-eps release: 0
ZeroDelta = Annotated[float, Field(strict=True, ge=0, le=0, description="Always 0: a pure-eps release.")]
#: (epsilon, delta) of an approximate-DP release (bounds.privacy)
Epsilon = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=bounds.MIN_EPSILON, le=bounds.MAX_ABS_VALUE)]
Delta = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=bounds.MIN_DELTA, lt=1.0)]
#: a digest of published public data
Digest = Annotated[str, Field(strict=True, min_length=1, max_length=64)]


def _shortlist_limit(v: int, info: ValidationInfo) -> int:
    top = _limit(info, "max_shortlist")
    if top is not None and v > top:
        raise PydanticCustomError("shortlist_limit", "request.shortlist (k') must be an integer in 1..{top}, got {v}.",
                                  {"top": top, "v": v})
    return v


#: k' of a class-rows or cell request: at most the protocol's MAX_K_PRIME and the server's max_shortlist
Shortlist = Annotated[int, Field(strict=True, ge=1, le=bounds.MAX_K_PRIME, description="k': candidates per row."),
                      AfterValidator(_shortlist_limit)]


def _for_collection(v: Optional[str], info: ValidationInfo) -> Optional[str]:
    name = info.context.get("collection") if isinstance(info.context, dict) else None
    if v is not None and name is not None and v != name:
        raise PydanticCustomError("other_collection", "the request was built for collection {got}, not {name}.",
                                  {"got": repr(v)[:62], "name": repr(name)})
    return v


#: the collection a request was built for (None: any); a server refuses another's
Collection = Annotated[Optional[str], Field(None, strict=True, max_length=200), AfterValidator(_for_collection)]


def _rows_within(what: str):
    """A matrix's shape before its values: a non-empty list of non-empty rows of equal length,
    at most the server's rows and dimensions (413 above them, before any value is read)."""

    def check(rows: Any, info: ValidationInfo) -> Any:
        if not isinstance(rows, list) or not rows or not all(isinstance(row, list) for row in rows):
            raise PydanticCustomError("matrix_type", "{what} must be a non-empty list of rows (lists of numbers).",
                                      {"what": what})
        top, dim = _limit(info, "max_rows"), _limit(info, "max_dim")
        if top is not None and len(rows) > top:
            raise PydanticCustomError("too_many_rows", "{what} has {n} rows; this server accepts at most {top}.",
                                      {"what": what, "n": f"{len(rows):,}", "top": f"{top:,}"})
        width = len(rows[0])
        if dim is not None and width > dim:
            raise PydanticCustomError("too_many_dimensions", "{what} has {n} columns; this server accepts at most "
                                      "{top}.", {"what": what, "n": width, "top": dim})
        if width == 0:
            raise PydanticCustomError("matrix_type", "{what} row 0 is empty.", {"what": what})
        for i, row in enumerate(rows):
            if len(row) != width:
                raise PydanticCustomError("ragged_rows", "{what} row {i} has {n} values, row 0 has {w}; every row must "
                                          "have the same length.", {"what": what, "i": i, "n": len(row), "w": width})
        return rows

    return check


def matrix(what: str, description: str):
    """The type of a matrix field named ``what`` in messages: rows of :data:`Number`."""
    return Annotated[list[list[Number]], BeforeValidator(_rows_within(what)), Field(description=description)]


class RequestBody(BaseModel):
    """What every request document's model states about its answer (see the module's doc)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ANSWER_RULE: ClassVar[str] = "answer {answer!r} does not apply to this request; it answers {answers}."
    BODY_CODE_BYTES: ClassVar[bool] = True
    ON_REPLICA: ClassVar[bool] = False
    ANSWER_MODEL: ClassVar[type[BaseModel] | None] = RowsAnswer

    def result_cells(self, k: int) -> int:
        """Rows x candidates of the answer to this request with ``k`` (bounded by max_result_cells)."""
        return 0

    def seeded_mark(self) -> bool:
        """Whether the request says its noise follows from a seed (not a private release)."""
        return bool(getattr(self, "seeded", False))


class ClassRowsRequestBody(RequestBody):
    """``ClassRowsRequest.to_dict()``: one noised row per class (release ``gaussian``)."""

    ON_REPLICA: ClassVar[bool] = True

    format: Literal[CLASS_ROWS_FORMAT]
    rows: matrix("request.rows", "C x d noised rows, in class order.")
    classes: list[Int64] = Field(description="The class of each row.")
    epsilon: Epsilon
    delta: Delta
    noise_scale: Annotated[float, Field(strict=True, gt=0, le=bounds.MAX_ABS_VALUE)]
    sigmas: list[Annotated[float, Field(strict=True, ge=0, le=bounds.MAX_ABS_VALUE)]]
    frames_digest: Annotated[str, Field(strict=True, max_length=64)]
    shortlist: Shortlist = DEFAULT_SHORTLIST
    seeded: StrictBool = False
    collection: Collection = None
    noise: Optional[Literal["gaussian", NOISE]] = None
    grid: Optional[list[Annotated[float, Field(strict=True, gt=0, le=bounds.MAX_ABS_VALUE)]]] = None
    release: Literal["gaussian"] = "gaussian"

    def result_cells(self, k: int) -> int:
        return len(self.rows) * max(k, self.shortlist)


def _reports_within(reports: Any, info: ValidationInfo) -> Any:
    if not isinstance(reports, list) or not reports:
        raise PydanticCustomError("list_type", "request.reports must be a non-empty list of cells (one per class).")
    top = _limit(info, "max_rows")
    if top is not None and len(reports) > top:
        raise PydanticCustomError("too_many_rows", "request.reports has {n} cells; this server accepts at most {top}.",
                                  {"n": f"{len(reports):,}", "top": f"{top:,}"})
    return reports


class CellRequestBody(RequestBody):
    """``CellRequest.to_dict()``: one reported public cell per class (release ``cells``, pure eps)."""

    ON_REPLICA: ClassVar[bool] = True

    format: Literal[CELL_FORMAT]
    reports: Annotated[list[Annotated[int, Field(strict=True, ge=0, lt=MAX_CELLS)]], BeforeValidator(_reports_within),
                       Field(description="One reported cell per class, each in [0, n_cells).")]
    n_cells: Annotated[int, Field(strict=True, ge=2, le=MAX_CELLS, description="K, the level of every class.")]
    epsilon: PureEpsilon
    cells_digest: Digest
    shortlist: Shortlist = DEFAULT_SHORTLIST
    collection: Collection = None
    release: Literal["cells"] = "cells"
    delta: ZeroDelta = 0.0
    seeded: StrictBool = False

    def result_cells(self, k: int) -> int:
        return len(self.reports) * max(k, self.shortlist)


class LocationRequestBody(RequestBody):
    """``LocationRequest.to_dict()``: one reported public cell of the whole collection (release
    ``location``, the default; pure eps). Its answer is one list of ``min(candidates, n_items)``
    candidates with the code width the request names (:class:`~.answers_wire.LocationAnswer`)."""

    ANSWER_RULE: ClassVar[str] = ("a location answer is compact, with the code width the request names "
                                  "(request.code_bytes); drop answer, code_bytes and include_features.")
    BODY_CODE_BYTES: ClassVar[bool] = False
    ON_REPLICA: ClassVar[bool] = True
    ANSWER_MODEL: ClassVar[type[BaseModel] | None] = LocationAnswer

    format: Literal[LOCATION_FORMAT]
    report: Annotated[int, Field(strict=True, ge=0, lt=MAX_LEVEL, description="The reported cell, in [0, level).")]
    level: Annotated[int, Field(strict=True, ge=2, le=MAX_LEVEL, description="M, the cells of the collection.")]
    epsilon: PureEpsilon
    locations_digest: Digest
    candidates: Annotated[int, Field(strict=True, ge=1, le=MAX_CANDIDATES, description="S: items in the answer.")]
    code_bytes: Annotated[int, Field(strict=True, ge=1, le=MAX_CODE_BYTES,
                                     description="The code prefix of each candidate, in bytes.")]
    collection: Collection = None
    release: Literal["location"] = "location"
    delta: ZeroDelta = 0.0
    seeded: StrictBool = False

    @model_validator(mode="after")
    def _report_in_level(self):
        if self.report >= self.level:
            raise PydanticCustomError("report_range", "request.report must be an integer in [0, {top}], got {v}.",
                                      {"top": self.level - 1, "v": self.report})
        return self


#: a params value of the paper's request: a bounded number, a flag, null or a short string
ParamValue = Union[StrictBool, Int64, Number, Annotated[str, Field(strict=True, max_length=bounds.MAX_PARAM_STR,
                                                                   pattern=r"^[^\x00]*$")], None]


class FrameParams(BaseModel):
    """``params.frame``: the AnchorFrame's parameters (:data:`~.bounds.FRAME_PARAMS`)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    n_components: ParamValue = None
    sigma: ParamValue = None
    label_sigma: ParamValue = None
    alpha: ParamValue = None
    n_iter: ParamValue = None
    n_extend_iter: ParamValue = None
    n_neighbors: ParamValue = None
    label_graph: ParamValue = None
    label_encoding: ParamValue = None
    seed: ParamValue = None


class PaperParams(BaseModel):
    """A paper request's ``params`` (:data:`~.bounds.PAPER_PARAMS`): the request log stores this form."""

    model_config = ConfigDict(extra="forbid", strict=True)
    dp_sigma: ParamValue = None
    dp_alpha: ParamValue = None
    n_post_iter: Optional[Annotated[int, Field(strict=True, ge=0, le=bounds.MAX_POST_ITER)]] = None
    post_alpha: ParamValue = None
    frame: Optional[FrameParams] = None
    seeded: StrictBool = False


class PrivateMailRequestBody(RequestBody):
    """``PrivateMailRequest.to_dict()`` (the paper's protocol; ``format`` may be left out)."""

    ANSWER_RULE: ClassVar[str] = (f"a compact answer (ids and product codes) applies to class-rows and cell requests "
                                  f"(formats {CLASS_ROWS_FORMAT!r}, {CELL_FORMAT!r}); ask the paper's protocol for "
                                  "answer 'full' or 'features'.")

    format: Literal[PRIVATEMAIL_FORMAT] = PRIVATEMAIL_FORMAT
    anchor_ids: list[Union[Int64, Annotated[str, Field(strict=True, max_length=MAX_ANCHOR_ID_CHARS,
                                                       pattern=r"^[^\x00]*$")]]]
    embedding: matrix("request.embedding", "n_query_rows query rows, then one row per anchor id.")
    n_query_rows: Annotated[int, Field(strict=True, ge=1, le=bounds.MAX_QUERY_ROWS)]
    epsilon: Epsilon
    delta: Delta
    sensitivity: Annotated[float, Field(strict=True, gt=0, le=bounds.MAX_ABS_VALUE)]
    noise_sigma: Annotated[float, Field(strict=True, ge=0, le=bounds.MAX_ABS_VALUE)]
    mechanism: Literal[bounds.PAPER_MECHANISMS]
    params: Optional[PaperParams] = None
    collection: Collection = None

    @model_validator(mode="after")
    def _query_rows_in_embedding(self):
        if self.n_query_rows > len(self.embedding):
            raise PydanticCustomError("n_query_rows", "request.n_query_rows must be an integer in 1..{n}, got {v}.",
                                      {"n": len(self.embedding), "v": self.n_query_rows})
        return self

    def result_cells(self, k: int) -> int:
        return self.n_query_rows * k

    def seeded_mark(self) -> bool:
        return bool(self.params is not None and self.params.seeded)


#: the body's answers (``answer``): ``compact`` the default of pm_vector's releases
ANSWERS = ("compact", "features", "full")

__all__ = ["ANSWERS", "LIMITS", "TOO_LARGE", "CellRequestBody", "ClassRowsRequestBody", "LocationRequestBody",
           "PrivateMailRequestBody", "RequestBody", "matrix"]
