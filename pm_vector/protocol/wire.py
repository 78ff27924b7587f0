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
refusal of another), ``BODY_CODE_BYTES`` (whether the body's ``code_bytes`` applies), ``ANSWER_MODEL`` (the answer document's model,
:mod:`.answers_wire`), and :meth:`result_cells` (rows x candidates of its answer)."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal, Optional

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, StrictBool,
                      ValidationInfo, WithJsonSchema, model_validator)
from pydantic_core import PydanticCustomError

from ..errors import InvalidInputError
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
#: the error types of this module's validators (their messages are whole sentences)
CUSTOM_ERRORS = TOO_LARGE + ("int_range", "pure_eps", "epsilon_nan", "other_collection", "matrix_type", "ragged_rows",
                             "reports_type", "report_range", "n_query_rows", "param_value", "anchor_id",
                             "answer_rule")
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
        raise PydanticCustomError("epsilon_nan", "epsilon must be a number > 0 (or inf), got nan.")
    return v


#: epsilon of a pure-eps release: a number > 0, or infinity (benchmarks; a msgpack float)
PureEpsilon = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=True), AfterValidator(_not_nan)]
def _zero(v: float) -> float:
    if v != 0.0:
        raise PydanticCustomError("pure_eps", "a pure-eps request: delta must be 0; got {v}.", {"v": repr(v)[:40]})
    return 0.0


#: delta of a pure-eps release: 0
ZeroDelta = Annotated[float, Field(strict=True, description="Always 0: a pure-eps release.",
                                   json_schema_extra={"minimum": 0, "maximum": 0}), AfterValidator(_zero)]


def int_in(lo: int, hi: int, description: str | None = None, limit: str | None = None):
    """An integer (never a boolean or a float) in ``lo..hi``, and at most the server's ``limit``
    (a :data:`LIMITS` key of the validation context) when there is one, refused as ``<field> must
    be an integer in lo..hi, got v``."""

    def check(v: int, info: ValidationInfo) -> int:
        top = hi if limit is None else min(hi, _limit(info, limit) or hi)
        if not lo <= v <= top:
            raise PydanticCustomError("int_range", "{name} must be an integer in {lo}..{hi}, got {v}.",
                                      {"name": info.field_name, "lo": lo, "hi": top, "v": v})
        return v

    return Annotated[int, Field(strict=True, description=description, json_schema_extra={"minimum": lo, "maximum": hi}),
                     AfterValidator(check)]
#: (epsilon, delta) of an approximate-DP release (bounds.privacy)
Epsilon = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=bounds.MIN_EPSILON, le=bounds.MAX_ABS_VALUE)]
Delta = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=bounds.MIN_DELTA, lt=1.0)]
#: a digest of published public data
Digest = Annotated[str, Field(strict=True, min_length=1, max_length=64)]


#: k' of a class-rows or cell request: at most the protocol's MAX_K_PRIME and the server's max_shortlist
Shortlist = int_in(1, bounds.MAX_K_PRIME, "k': candidates per row (at most the server's max_shortlist).",
                   "max_shortlist")


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

    NOUN: ClassVar[str] = "request"
    ANSWER_RULE: ClassVar[str] = ("a {release} request's answer is one of {answers}, not {answer!r}; drop answer and "
                                  "include_features for its default.")
    BODY_CODE_BYTES: ClassVar[bool] = True
    ANSWER_MODEL: ClassVar[type[BaseModel] | None] = RowsAnswer

    def result_cells(self, k: int) -> int:
        """Rows x candidates of the answer to this request with ``k`` (bounded by max_result_cells)."""
        return 0

    def seeded_mark(self) -> bool:
        """Whether the request says its noise follows from a seed (not a private release)."""
        return bool(getattr(self, "seeded", False))


class OpenRequestBody(RequestBody):
    """A request document of a release without a model of its own: its ``format`` and any fields,
    which the release's ``service_check`` reads (:mod:`pm_vector.service.resolve_body`)."""

    model_config = ConfigDict(extra="allow", strict=True)
    ANSWER_MODEL: ClassVar[type[BaseModel] | None] = None


class ClassRowsRequestBody(RequestBody):
    """``ClassRowsRequest.to_dict()``: one noised row per class (release ``gaussian``)."""


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
        raise PydanticCustomError("reports_type", "request.reports must be a non-empty list of cells (one per class).")
    top = _limit(info, "max_rows")
    if top is not None and len(reports) > top:
        raise PydanticCustomError("too_many_rows", "request.reports has {n} cells; this server accepts at most {top}.",
                                  {"n": f"{len(reports):,}", "top": f"{top:,}"})
    return reports


class CellRequestBody(RequestBody):
    """``CellRequest.to_dict()``: one reported public cell per class (release ``cells``, pure eps)."""

    NOUN: ClassVar[str] = "cell request"

    format: Literal[CELL_FORMAT]
    reports: Annotated[list[Annotated[int, Field(strict=True, json_schema_extra={"minimum": 0})]],
                       BeforeValidator(_reports_within), Field(description="One reported cell per class, each in "
                                                                           "[0, n_cells).")]
    n_cells: int_in(2, MAX_CELLS, "K, the level of every class.")
    epsilon: PureEpsilon
    cells_digest: Digest
    shortlist: Shortlist = DEFAULT_SHORTLIST
    collection: Collection = None
    release: Literal["cells"] = "cells"
    delta: ZeroDelta = 0.0
    seeded: StrictBool = False

    @model_validator(mode="after")
    def _reports_in_level(self):
        bad = next((r for r in self.reports if not 0 <= r < self.n_cells), None)
        if bad is not None:
            raise PydanticCustomError("report_range", "every report must be an integer in [0, {n}); got {v}.",
                                      {"n": self.n_cells, "v": bad})
        return self

    def result_cells(self, k: int) -> int:
        return len(self.reports) * max(k, self.shortlist)


class LocationRequestBody(RequestBody):
    """``LocationRequest.to_dict()``: one reported public cell of the whole collection (release
    ``location``, the default; pure eps). Its answer is one list of ``min(candidates, n_items)``
    candidates with the code width the request names (:class:`~.answers_wire.LocationAnswer`)."""

    NOUN: ClassVar[str] = "location request"
    ANSWER_RULE: ClassVar[str] = ("a location answer is compact, with the code width the request names "
                                  "(request.code_bytes); drop answer, code_bytes and include_features.")
    BODY_CODE_BYTES: ClassVar[bool] = False
    ANSWER_MODEL: ClassVar[type[BaseModel] | None] = LocationAnswer

    format: Literal[LOCATION_FORMAT]
    report: int_in(0, MAX_LEVEL - 1, "The reported cell, in [0, level).")
    level: int_in(2, MAX_LEVEL, "M, the cells of the collection.")
    epsilon: PureEpsilon
    locations_digest: Digest
    candidates: int_in(1, MAX_CANDIDATES, "S: items in the answer.")
    code_bytes: int_in(1, MAX_CODE_BYTES, "The code prefix of each candidate, in bytes.")
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


def _param_type(prefix: str):
    """A params value of the paper's request: a bounded number, a flag, null or a short string
    (:func:`~.bounds.param_value`)."""

    def check(v: Any, info: ValidationInfo) -> Any:
        try:
            return bounds.param_value(v, f"{prefix}.{info.field_name}")
        except InvalidInputError as exc:
            raise PydanticCustomError("param_value", "{m}", {"m": str(exc)}) from None

    return Annotated[Any, PlainValidator(check), WithJsonSchema(
        {"anyOf": [{"type": "number"}, {"type": "boolean"}, {"type": "string", "maxLength": bounds.MAX_PARAM_STR},
                   {"type": "null"}]})]


ParamValue = _param_type("params")
FrameValue = _param_type("params.frame")


def _anchor_id(v: Any) -> Any:
    if isinstance(v, bool) or not (isinstance(v, int) and -2 ** 63 <= v < 2 ** 63 or isinstance(v, str) and
                                   len(v) <= MAX_ANCHOR_ID_CHARS and "\x00" not in v):
        raise PydanticCustomError("anchor_id", "anchor_ids holds {v} (an id outside the 64-bit range or an invalid "
                                  "string); send the ids of the anchor document.", {"v": repr(v)[:40]})
    return v


#: an anchor id: a 64-bit integer or a string of the anchor document
AnchorId = Annotated[Any, PlainValidator(_anchor_id), WithJsonSchema(
    {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": MAX_ANCHOR_ID_CHARS}]})]


class FrameParams(BaseModel):
    """``params.frame``: the AnchorFrame's parameters (:data:`~.bounds.FRAME_PARAMS`)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    n_components: FrameValue = None
    sigma: FrameValue = None
    label_sigma: FrameValue = None
    alpha: FrameValue = None
    n_iter: FrameValue = None
    n_extend_iter: FrameValue = None
    n_neighbors: FrameValue = None
    label_graph: FrameValue = None
    label_encoding: FrameValue = None
    seed: FrameValue = None


class PaperParams(BaseModel):
    """A paper request's ``params`` (:data:`~.bounds.PAPER_PARAMS`): the request log stores this form."""

    model_config = ConfigDict(extra="forbid", strict=True)
    dp_sigma: ParamValue = None
    dp_alpha: ParamValue = None
    n_post_iter: Optional[int_in(0, bounds.MAX_POST_ITER)] = None
    post_alpha: ParamValue = None
    frame: Optional[FrameParams] = None
    seeded: StrictBool = False


class PrivateMailRequestBody(RequestBody):
    """``PrivateMailRequest.to_dict()`` (the paper's protocol; ``format`` may be left out)."""

    ANSWER_RULE: ClassVar[str] = (f"a compact answer (ids and product codes) applies to class-rows and cell requests "
                                  f"(formats {CLASS_ROWS_FORMAT!r}, {CELL_FORMAT!r}); ask the paper's protocol for "
                                  "answer 'full' or 'features'.")

    format: Literal[PRIVATEMAIL_FORMAT] = PRIVATEMAIL_FORMAT
    anchor_ids: list[AnchorId]
    embedding: matrix("request.embedding", "n_query_rows query rows, then one row per anchor id.")
    n_query_rows: int_in(1, bounds.MAX_QUERY_ROWS)
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


#: what a resolve body may ask for (``answer``); a release's ``answers`` are some of these
Answer = Literal["compact", "features", "full"]

__all__ = ["Answer", "CUSTOM_ERRORS", "LIMITS", "TOO_LARGE", "CellRequestBody", "ClassRowsRequestBody", "LocationRequestBody",
           "OpenRequestBody", "PrivateMailRequestBody", "RequestBody", "matrix"]
