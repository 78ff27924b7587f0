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
:mod:`.answers_wire`), and :meth:`result_cells` (rows x candidates of its answer).

A request document's fields are declared ONCE, in its request type (a dataclass of
:mod:`pm_vector.protocol`, each field with its wire type: :mod:`.wire_types`); its model here is
made from them (:func:`~.wire_types.body_model`) on a class holding only the answer's rules and the
checks across fields (every built-in request document: location, cells, class rows, the paper's).
The field types and :func:`~.wire_types.int_in`, :data:`~.wire_types.Int64`, :func:`~.wire_types.matrix`
are :mod:`.wire_types`' (read here by their older name too)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from .answers_wire import LocationAnswer, RowsAnswer
from .class_rows import ClassRowsRequest
from .formats import CELL_FORMAT, CLASS_ROWS_FORMAT, LOCATION_FORMAT, PRIVATEMAIL_FORMAT
from .cell_request import MAX_CELLS, CellRequest
from .location import LocationRequest
from .paper import PrivateMailRequest
from .wire_types import Int64, body_model, int_in, matrix  # noqa: F401 (Int64, int_in, matrix: older names)

#: the server limits a validation context may hold (pm_vector.service.settings.ServiceSettings)
LIMITS = ("max_rows", "max_dim", "max_k", "max_shortlist", "max_result_cells")
#: error types of a refusal by size (413): the rest are 422
TOO_LARGE = ("too_many_rows", "too_many_dimensions", "result_too_large")
#: the error types of this module's validators (their messages are whole sentences)
CUSTOM_ERRORS = TOO_LARGE + ("int_range", "pure_eps", "epsilon_nan", "other_collection", "matrix_type", "ragged_rows",
                             "reports_type", "report_range", "n_query_rows", "param_value", "anchor_id",
                             "answer_rule")


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


class _ClassRowsRules(RequestBody):
    """``ClassRowsRequest.to_dict()``: one noised row per class (release ``gaussian``)."""

    def result_cells(self, k: int) -> int:
        return len(self.rows) * max(k, self.shortlist)


#: the class-rows request's document: its fields are ClassRowsRequest's (pm_vector.protocol.class_rows)
ClassRowsRequestBody = body_model(ClassRowsRequest, _ClassRowsRules, CLASS_ROWS_FORMAT, name="ClassRowsRequestBody")


class _CellRules(RequestBody):
    """``CellRequest.to_dict()``: one reported public cell per class (release ``cells``, pure eps)."""

    NOUN: ClassVar[str] = "cell request"

    @model_validator(mode="after")
    def _reports_in_level(self):
        bad = next((r for r in self.reports if not 0 <= r < self.n_cells), None)
        if bad is not None:
            raise PydanticCustomError("report_range", "every report must be an integer in [0, {n}); got {v}.",
                                      {"n": self.n_cells, "v": bad})
        return self

    def result_cells(self, k: int) -> int:
        return len(self.reports) * max(k, self.shortlist)


#: the cell request's document: its fields are CellRequest's (pm_vector.protocol.cell_request)
CellRequestBody = body_model(CellRequest, _CellRules, CELL_FORMAT, name="CellRequestBody")


class _LocationRules(RequestBody):
    """``LocationRequest.to_dict()``: one reported public cell of the whole collection (release
    ``location``, the default; pure eps). Its answer is one list of ``min(candidates, n_items)``
    candidates with the code width the request names (:class:`~.answers_wire.LocationAnswer`)."""

    NOUN: ClassVar[str] = "location request"
    ANSWER_RULE: ClassVar[str] = ("a location answer is compact, with the code width the request names "
                                  "(request.code_bytes); drop answer, code_bytes and include_features.")
    BODY_CODE_BYTES: ClassVar[bool] = False
    ANSWER_MODEL: ClassVar[type[BaseModel] | None] = LocationAnswer

    @model_validator(mode="after")
    def _report_in_level(self):
        if self.report >= self.level:
            raise PydanticCustomError("report_range", "request.report must be an integer in [0, {top}], got {v}.",
                                      {"top": self.level - 1, "v": self.report})
        return self


#: the location request's document: its fields are LocationRequest's (pm_vector.protocol.location)
LocationRequestBody = body_model(LocationRequest, _LocationRules, LOCATION_FORMAT, name="LocationRequestBody")


class _PrivateMailRules(RequestBody):
    """``PrivateMailRequest.to_dict()`` (the paper's protocol; ``format`` may be left out)."""

    ANSWER_RULE: ClassVar[str] = (f"a compact answer (ids and product codes) applies to class-rows and cell requests "
                                  f"(formats {CLASS_ROWS_FORMAT!r}, {CELL_FORMAT!r}); ask the paper's protocol for "
                                  "answer 'full' or 'features'.")

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


#: the paper's request document: its fields are PrivateMailRequest's (pm_vector.protocol.paper)
PrivateMailRequestBody = body_model(PrivateMailRequest, _PrivateMailRules, PRIVATEMAIL_FORMAT,
                                    name="PrivateMailRequestBody", format_default=True)


#: what a resolve body may ask for (``answer``); a release's ``answers`` are some of these
Answer = Literal["compact", "features", "full"]

__all__ = ["Answer", "CUSTOM_ERRORS", "LIMITS", "TOO_LARGE", "CellRequestBody", "ClassRowsRequestBody", "LocationRequestBody",
           "OpenRequestBody", "PrivateMailRequestBody", "RequestBody", "matrix"]
