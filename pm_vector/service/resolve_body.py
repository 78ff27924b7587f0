"""The body of ``POST /collections/{name}/resolve`` as one pydantic model, built from the table of
releases: it validates a body and is the body's schema in ``/openapi.json``.

``{"request": <a request document>, "k": 8, "answer": "compact" | "features" | "full",
"include_features": false, "code_bytes": b}``. ``request`` is a discriminated union on its
``format``: one member per release of :data:`pm_vector.protocol.releases.RELEASES` that names a
``wire_model`` (:mod:`pm_vector.protocol.wire`); a document without ``format`` is the member whose
``format`` has a default (the paper's). The union is rebuilt when the table changes, so a release
registered at run time is parsed, checked and answered like the built-in ones. A release without
a wire model but with a ``service_check`` is an open member (its format, any fields) that its
check reads; a release with neither is not served over HTTP (the paper's release-only request).

:func:`parse_resolve_body` validates a decoded body against it with the server's limits (the
validation context), applies the release's answer rules (its ``answers``, the first the default)
and the seeded-request policy (403), and returns the release's request object
(``release.parse``). :func:`resolve_answer_schema` is the answer's schema: the answer models the
served releases' wire models name, in either media type."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Discriminator, Field, StrictBool, Tag, ValidationError,
                      ValidationInfo, create_model, model_validator)
from pydantic_core import PydanticCustomError

from ..errors import InvalidInputError
from ..manifold.codes import MAX_CODE_BYTES, MIN_CODE_BYTES
from ..protocol import bounds, releases, wire
from .errors import ApiError
from .settings import ServiceSettings
from .validation import api_error


def wire_model(release: releases.Release) -> type[wire.RequestBody] | None:
    """The pydantic model of a release's request document: its ``wire_model``, or for a release
    that has only a ``service_check``, an open document of its format (the check reads the rest);
    None: not served over HTTP."""
    if release.wire_model is not None:
        return releases.load(release.wire_model)
    if release.service_check is None:
        return None
    return _open_model(release.wire_format, release.name)


@lru_cache(maxsize=64)
def _open_model(fmt: str, name: str) -> type[wire.RequestBody]:
    title = "".join(p.capitalize() for p in re.split(r"[^0-9A-Za-z]+", name) if p) + "RequestBody"
    return create_model(title, __base__=wire.OpenRequestBody, format=(Literal[fmt], ...))


#: the releases ``served`` last looked at and its answer (the table changes rarely: a test's registration)
_LAST: list = [((), ())]


def served() -> tuple[tuple[str, type[wire.RequestBody]], ...]:
    """``(format, wire model)`` of every release the service answers, in the table's order."""
    rels = tuple(releases.RELEASES.values())
    seen, out = _LAST[0]  # one pair, replaced whole: threads see an old or a new one
    if len(seen) == len(rels) and all(a is b for a, b in zip(seen, rels)):
        return out
    out = tuple((rel.wire_format, m) for rel in rels if (m := wire_model(rel)) is not None)
    _LAST[0] = (rels, out)
    return out


class _Body(BaseModel):
    """The fields of the resolve body beside its request."""

    model_config = ConfigDict(extra="forbid", strict=True)

    k: wire.int_in(1, bounds.MAX_K_PRIME, limit="max_k") = Field(
        8, description="Neighbours per query row (at most the server's max_k).")
    include_features: StrictBool = Field(False, description="Return the raw features of every row's neighbours "
                                         "(only if the collection allows raw features); the same as answer "
                                         "'features'.")
    answer: Optional[wire.Answer] = Field(None, description="'compact' (the default of pm_vector's releases: every "
                                          "row's candidate ids and product-code prefixes, and payloads when there "
                                          "are any), 'features' (full rows with raw features) or 'full' (full rows "
                                          "without); the release's answers (its first the default).")
    code_bytes: Optional[wire.int_in(MIN_CODE_BYTES, MAX_CODE_BYTES)] = Field(
        None, description="Compact answers: the code prefix, one of the run's published code widths "
                          "(class_rows.codes.widths); default the residual code.")

    @model_validator(mode="after")
    def _answer_rules(self, info: ValidationInfo):
        req = self.request  # type: ignore[attr-defined]
        rel = releases.by_format(req.format)
        inc, answer = self.include_features, self.answer
        if inc and answer not in (None, "features"):
            raise PydanticCustomError("answer_rule", "include_features asks for raw features; answer {a} carries none "
                                      "(use answer 'features').", {"a": repr(answer)})
        if answer is None:
            answer = "features" if inc else rel.answers[0]
        if answer not in rel.answers or (self.code_bytes is not None and not req.BODY_CODE_BYTES):
            raise PydanticCustomError("answer_rule", req.ANSWER_RULE.format(answer=answer, answers=list(rel.answers),
                                                                            release=rel.name))
        if self.code_bytes is not None and answer != "compact":
            raise PydanticCustomError("answer_rule", "code_bytes applies to compact answers (answer 'compact').")
        self.answer, self.include_features = answer, answer == "features"
        top = info.context.get("max_result_cells") if isinstance(info.context, dict) else None
        cells = req.result_cells(self.k)
        if top is not None and cells > top:
            raise PydanticCustomError("result_too_large", "{n} rows x candidates is more than this server's {top}; "
                                      "ask for fewer rows or a smaller k / shortlist.",
                                      {"n": f"{cells:,}", "top": f"{top:,}"})
        return self


def _default_format(choices) -> str | None:
    for fmt, m in choices:
        f = m.model_fields.get("format")
        if f is not None and not f.is_required():
            return fmt
    return None


@lru_cache(maxsize=16)
def _build(choices: tuple[tuple[str, type[wire.RequestBody]], ...]) -> type[BaseModel]:
    fallback = _default_format(choices)

    def format_of(v: Any) -> str | None:
        if isinstance(v, dict):
            f = v.get("format", fallback)
            return f if isinstance(f, str) or f is None else repr(f)[:40]
        return getattr(v, "format", None)

    members = tuple(Annotated[m, Tag(fmt)] for fmt, m in choices)
    union = Union[members] if len(members) > 1 else members[0]  # type: ignore[valid-type]
    request = Annotated[union, Discriminator(format_of), Field(
        description="A request document (a request type's to_dict()), by its format: " +
                    ", ".join(f"{fmt!r} ({m.__name__})" for fmt, m in choices) + ".")]
    return create_model("ResolveBody", __base__=_Body, request=(request, ...))


def resolve_body_model() -> type[BaseModel]:
    """The resolve body's model for the releases served now (cached per set of releases)."""
    return _build(served())


def context(settings: ServiceSettings, name: str | None = None) -> dict[str, Any]:
    """The validation context of a body: the server's limits and the collection it is sent to."""
    return {**{k: getattr(settings, k) for k in wire.LIMITS}, "collection": name}


@dataclass(frozen=True)
class Resolve:
    """A validated resolve body: the release, its request object, and what the answer holds."""

    release: releases.Release
    request: Any
    k: int
    include_features: bool
    answer: dict[str, Any]  # {"compact": bool, "code_bytes": int | None}: documents.resolve_document
    on_replica: bool


def parse_resolve_body(doc: Any, settings: ServiceSettings, name: str) -> Resolve:
    """A decoded resolve body validated (the module's doc), or :class:`ApiError`: 422 for a body
    the model refuses, 413 for one over the server's size limits, 403 for a seeded request the
    settings do not allow."""
    model = resolve_body_model()
    try:
        body = model.model_validate(doc, context=context(settings, name))
    except ValidationError as exc:
        raise api_error(exc, tags={fmt: m for fmt, m in served()}) from None
    req_doc, rel = body.request, releases.by_format(body.request.format)
    if req_doc.seeded_mark() and not settings.allow_seeded_requests:
        raise ApiError(403, "seeded_request", "the request is marked seeded (its noise follows from a seed: not a "
                                              "private release); this service refuses seeded requests unless its "
                                              "setting allow_seeded_requests is on "
                                              "(PM_VECTOR_SERVICE_ALLOW_SEEDED_REQUESTS=1, for tests only).")
    try:
        if rel.wire_model is None:  # a release with a check of its own (module doc)
            req = releases.load(rel.service_check)(doc["request"], settings, name, k=body.k, code_bytes=body.code_bytes)
        else:
            req = rel.parse(doc["request"])
    except (InvalidInputError, TypeError, ValueError) as exc:  # what one field's bound cannot say (row counts)
        raise ApiError(422, "invalid_input", f"invalid {rel.name} request: {exc}") from None
    return Resolve(rel, req, body.k, body.include_features,
                   {"compact": body.answer == "compact", "code_bytes": body.code_bytes}, rel.replica_reads)


def resolve_schemas() -> dict[str, Any]:
    """The components of ``/openapi.json`` the resolve endpoint names: ``ResolveBody`` (the union,
    with its discriminator's mapping), every request and answer model, and ``ResolveAnswer`` (any
    of the served releases' answer models)."""
    choices = served()
    model = _build(choices)
    comps: dict[str, Any] = {}
    js = model.model_json_schema(ref_template="#/components/schemas/{model}")
    comps.update(js.pop("$defs", {}))
    req = js["properties"]["request"]
    req["discriminator"] = {"propertyName": "format",
                            "mapping": {fmt: f"#/components/schemas/{m.__name__}" for fmt, m in choices}}
    comps["ResolveBody"] = js
    answers = []
    for _, m in choices:
        a = m.ANSWER_MODEL
        if a is None or a.model_config.get("title", a.__name__) in answers:
            continue
        title = a.model_config.get("title", a.__name__)
        ajs = a.model_json_schema(ref_template="#/components/schemas/{model}")
        comps.update(ajs.pop("$defs", {}))
        comps[title] = ajs
        answers.append(title)
    comps["ResolveAnswer"] = {"title": "ResolveAnswer", "description": "The answer of the request's release.",
                              "anyOf": [{"$ref": f"#/components/schemas/{t}"} for t in answers]}
    return comps


__all__ = ["Resolve", "context", "parse_resolve_body", "resolve_body_model", "resolve_schemas", "served",
           "wire_model"]
