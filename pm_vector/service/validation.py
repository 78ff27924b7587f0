"""The bodies the service parses itself: JSON read strictly (:func:`parse_json`), and a pydantic
model's refusal as the service's error answer (:func:`api_error`). The models are the schema and
the validators at once (:mod:`pm_vector.protocol.wire`, :mod:`pm_vector.service.resolve_body`,
:mod:`pm_vector.service.schemas`); here their errors become one ``{"error", "message"}`` that
names the field and what it must be: 413 for a size limit (:data:`pm_vector.protocol.wire.TOO_LARGE`:
``too_many_rows``, ``too_many_dimensions``, ``result_too_large``), 422 ``invalid_input`` for
anything else. Every refusal writes nothing."""

from __future__ import annotations

import json
from typing import Any, Mapping

from pydantic import ValidationError

from ..protocol import bounds, wire
from .errors import ApiError


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed (JSON has no NaN/Infinity; the request must be finite numbers)")


def parse_json(body: bytes) -> Any:
    if not body:
        raise ApiError(400, "malformed_json", "the request body is empty; send a JSON object.")
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise ApiError(400, "malformed_json", "the request body is not UTF-8 JSON.") from None
    except json.JSONDecodeError as e:
        raise ApiError(400, "malformed_json", f"the request body is not valid JSON: {e.msg} at line {e.lineno} "
                                              f"column {e.colno}.") from None
    except ValueError as e:
        raise ApiError(400, "malformed_json", f"the request body is not valid JSON: {e}.") from None
    except RecursionError:  # e.g. 100k nested arrays: no valid request nests more than 3 deep
        raise ApiError(400, "malformed_json", "the request body nests too deeply; a request is an object of "
                                              "rows (lists of numbers).") from None


def _path(loc: tuple, tags: Mapping[str, Any]) -> tuple[str, str | None]:
    """``("request.sigmas[0]", tag)`` of an error's location, without the union's member tag."""
    out, tag = "", None
    for i, part in enumerate(loc):
        if i == 1 and loc[0] == "request" and part in tags:
            tag = part
        elif isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out, tag


_CELL = ("float_type", "finite_number", "greater_than_equal", "less_than_equal", "float_parsing", "int_type")


def _cell_message(path: str, e: dict) -> str | None:
    """A matrix value's refusal in the words of the old checks: ``what row i holds ...``."""
    loc = e["loc"]
    if len(loc) < 3 or not isinstance(loc[-1], int) or not isinstance(loc[-2], int) or e["type"] not in _CELL:
        return None
    what, i, v = path.rsplit("[", 2)[0], loc[-2], e.get("input")
    if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")):
        return f"{what} row {i} holds NaN or infinite values; only finite numbers are allowed."
    if isinstance(v, (int, float)) and not isinstance(v, bool):  # a number refused: its magnitude
        return f"{what} row {i} holds a value too large (beyond +-{bounds.MAX_ABS_VALUE:g}); no valid client sends one."
    return f"{what} row {i} holds {str(v)[:40]!r}; only numbers are allowed."


def _message(e: dict, errors: list[dict], tags: Mapping[str, Any]) -> str:
    kind, loc = e["type"], tuple(e["loc"])
    path, tag = _path(loc, tags)
    if kind in ("missing", "extra_forbidden"):
        parent = loc[:-1]
        names = [str(x["loc"][-1]) for x in errors if x["type"] == kind and tuple(x["loc"][:-1]) == parent]
        where, _ = _path(parent, tags)
        if kind == "missing":
            return f"{where or 'the body'} is missing field(s): {', '.join(map(repr, names))}."
        if not where:
            return f"unknown field(s) {names}; the body has its model's fields (/openapi.json)."
        if where == "request" and tag is not None:
            known = [f for f in tags[tag].model_fields if f != "format"]
            return f"unknown {tags[tag].NOUN} field(s) {names[:10]}; a {tag!r} request has {known}."
        return f"unknown {where.removeprefix('request.')} field(s) {names[:10]}."
    if kind in ("model_type", "dict_type", "model_attributes_type") and not loc:
        return "the body must be a JSON object {\"request\": {...}, \"k\": 8}."
    if kind == "union_tag_not_found":
        return "'request' must be a request object (a request type's to_dict(): ClassRowsRequest, LocationRequest, ...)."
    if kind == "union_tag_invalid":
        return (f"unsupported request format {e.get('ctx', {}).get('tag')!r}; this server resolves "
                f"{e.get('ctx', {}).get('expected_tags')}.")
    cell = _cell_message(path, e)
    if cell is not None:
        return cell
    msg = e["msg"]
    if kind == "literal_error" and tag is not None and path.count(".") == 1:
        return f"a {tag!r} request has {path.split('.')[1]} {e.get('ctx', {}).get('expected')}; got {e.get('input')!r:.40}."
    if kind == "literal_error":
        return f"{path} must be one of {e.get('ctx', {}).get('expected')}, got {e.get('input')!r:.40}."
    if msg.startswith("Input should be "):
        return f"{path or 'the body'} must be {msg[len('Input should be '):]}, got {e.get('input')!r:.40}."
    if msg.startswith("Value error, "):  # a validator's InvalidInputError
        msg = msg[len("Value error, "):]
    return msg if not path or kind in wire.CUSTOM_ERRORS else f"{path}: {msg}"


def api_error(exc: ValidationError, tags: Mapping[str, Any] | None = None) -> ApiError:
    """The service's error answer of a model's refusal: 413 when a size limit refused it, else 422
    with the first problem (``tags``: a union's member models by tag, to name a request's fields)."""
    errors = exc.errors(include_url=False)
    tags = tags or {}
    big = next((e for e in errors if e["type"] in wire.TOO_LARGE), None)
    if big is not None:
        return ApiError(413, big["type"], big["msg"])
    return ApiError(422, "invalid_input", _message(errors[0], errors, tags) if errors else str(exc))
