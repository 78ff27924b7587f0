"""The field types of the request documents, and how a request type declares its fields ONCE.

The types (:data:`Number`, :func:`int_in`, :data:`PureEpsilon`, :data:`Collection`, :func:`matrix`,
...) carry the bounds of :mod:`pm_vector.protocol.bounds` and a server's limits from the
validation context (:mod:`pm_vector.protocol.wire`'s doc). A request type (a dataclass of
:mod:`pm_vector.protocol`) gives each field that travels its wire type where it declares the
field (``level: int = field(metadata=wire(int_in(2, MAX_LEVEL)))``); :func:`body_model` makes the
pydantic model of its document from those fields (names, defaults, types: the service's validator
and ``/openapi.json``'s schema), and :func:`wire_names` the required and optional keys its
``from_dict`` reads. A new field is one line of the dataclass (and its ``__post_init__`` check
where the client needs one)."""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Literal, Optional

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, StrictBool,
                      ValidationInfo, WithJsonSchema, create_model)
from pydantic_core import PydanticCustomError

from ..errors import InvalidInputError
from . import bounds
from .bounds import MAX_ANCHOR_ID_CHARS

#: the keys of a dataclass field's metadata that hold its wire type (and its document's default)
WIRE, WIRE_DEFAULT = "pm_vector.wire", "pm_vector.wire_default"
_NONE = object()


def wire(type_: Any, default: Any = _NONE) -> dict[str, Any]:
    """The metadata of a request type's field that travels: its wire type (``field(metadata=wire(T))``);
    ``default``: the document's default when it is not the dataclass's (the paper's ``params``: None)."""
    return {WIRE: type_} if default is _NONE else {WIRE: type_, WIRE_DEFAULT: default}


def _wire_fields(request_type: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(request_type) if WIRE in f.metadata]


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]


def wire_names(request_type: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(required, optional)``: the document keys of ``request_type``'s wire fields (besides ``format``)."""
    fs = _wire_fields(request_type)
    return tuple(f.name for f in fs if _required(f)), tuple(f.name for f in fs if not _required(f))


def check_keys(d, need: tuple[str, ...], optional: tuple[str, ...], what: str, has: str) -> None:
    """A request document's keys, as its type's ``from_dict`` reads them (:func:`wire_names`): every
    key of ``need`` present, none beyond ``need``, ``optional`` and ``format`` (a strict schema:
    nothing the client chose beyond the fields reaches the request log). ``what``: the request in
    the messages; ``has``: what such a request has."""
    missing = [k for k in need if k not in d]
    if missing:
        raise InvalidInputError(f"{what} is missing fields: {', '.join(missing)}.")
    unknown = sorted(set(map(str, d)) - set(need) - set(optional) - {"format"})
    if unknown:
        raise InvalidInputError(f"unknown {what} field(s) {unknown[:10]}; {has}.")


def body_model(request_type: type, base: type, fmt: str, *, name: str | None = None, doc: str | None = None,
               format_default: bool = False) -> type:
    """The pydantic model of ``request_type``'s document (format ``fmt``): ``base`` (a
    :class:`~pm_vector.protocol.wire.RequestBody` with the answer's rules and any check across
    fields) with one field per wire field of the dataclass, its default the dataclass's.
    ``format_default``: a document without ``format`` is this one (the paper's)."""
    fields: dict[str, Any] = {"format": (Literal[fmt], fmt if format_default else ...)}
    for f in _wire_fields(request_type):
        if WIRE_DEFAULT in f.metadata:
            default = f.metadata[WIRE_DEFAULT]
        else:
            default = ... if _required(f) else (f.default if f.default is not dataclasses.MISSING else
                                                 Field(default_factory=f.default_factory))  # type: ignore[misc]
        fields[f.name] = (f.metadata[WIRE], default)
    return create_model(name or request_type.__name__ + "Body", __base__=base, __doc__=doc or base.__doc__,
                        __module__=base.__module__, **fields)


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
Digest = Annotated[str, Field(strict=True, min_length=1, max_length=bounds.MAX_DIGEST_CHARS)]


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
Collection = Annotated[Optional[str], Field(None, strict=True, max_length=bounds.MAX_COLLECTION_CHARS),
                       AfterValidator(_for_collection)]


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

def _reports_within(reports: Any, info: ValidationInfo) -> Any:
    if not isinstance(reports, list) or not reports:
        raise PydanticCustomError("reports_type", "request.reports must be a non-empty list of cells (one per class).")
    top = _limit(info, "max_rows")
    if top is not None and len(reports) > top:
        raise PydanticCustomError("too_many_rows", "request.reports has {n} cells; this server accepts at most {top}.",
                                  {"n": f"{len(reports):,}", "top": f"{top:,}"})
    return reports


#: one reported cell per class (a cell request's ``reports``), at most the server's rows
Reports = Annotated[list[Annotated[int, Field(strict=True, json_schema_extra={"minimum": 0})]],
                    BeforeValidator(_reports_within), Field(description="One reported cell per class, each in "
                                                                        "[0, n_cells).")]

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


__all__ = ["AnchorId", "Collection", "Delta", "Digest", "Epsilon", "Field", "FrameParams", "Int64", "Number",
           "PaperParams", "PureEpsilon", "Reports", "Shortlist", "StrictBool", "WIRE", "ZeroDelta", "body_model",
           "int_in", "matrix", "wire", "wire_names"]
