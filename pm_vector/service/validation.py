"""Validation of request bodies the service parses itself (resolve, KAHM distances): JSON, matrices,
the strict request schema, size caps. Every refusal is an :class:`ApiError` (a 4xx) and writes nothing."""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import Request

from ..protocol import bounds
from ..protocol.class_rows import DEFAULT_SHORTLIST
from ..protocol import releases
from ..protocol.formats import PRIVATEMAIL_FORMAT
from ..errors import InvalidInputError
from .errors import ApiError
from .settings import ServiceSettings

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


def check_matrix(rows: Any, what: str, settings: ServiceSettings) -> None:
    """A JSON matrix: a non-empty list of equally long, non-empty rows of numbers of magnitude at
    most :data:`pm_vector.protocol.bounds.MAX_ABS_VALUE`, within the server's row and dimension
    limits (413 above them, 422 otherwise)."""
    if not isinstance(rows, list) or not rows or not all(isinstance(row, list) for row in rows):
        raise ApiError(422, "invalid_input", f"{what} must be a non-empty list of rows (lists of numbers).")
    if len(rows) > settings.max_rows:
        raise ApiError(413, "too_many_rows", f"{what} has {len(rows):,} rows; this server accepts at most "
                                             f"{settings.max_rows:,}.")
    width = len(rows[0])
    if width > settings.max_dim:
        raise ApiError(413, "too_many_dimensions", f"{what} has {width} columns; this server accepts at most "
                                                   f"{settings.max_dim}.")
    if width == 0:
        raise ApiError(422, "invalid_input", f"{what} row 0 is empty.")
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ApiError(422, "invalid_input", f"{what} row {i} has {len(row)} values, row 0 has {width}; every "
                                                 "row must have the same length.")
        for v in row:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ApiError(422, "invalid_input", f"{what} row {i} holds {v!r}; only numbers are allowed.")
            if isinstance(v, float) and not math.isfinite(v):  # e.g. 1e400 parses to inf
                raise ApiError(422, "invalid_input", f"{what} row {i} holds NaN or infinite values; only finite "
                                                     "numbers are allowed.")
            if abs(v) > bounds.MAX_ABS_VALUE:  # finite but absurd (and beyond float32 once squared)
                raise ApiError(422, "invalid_input", f"{what} row {i} holds a value too large (beyond "
                                                     f"+-{bounds.MAX_ABS_VALUE:g}); no valid client sends one.")


def check_cells(n_rows: int, per_row: int, settings: ServiceSettings) -> None:
    """rows x k of one answer within the server's cap (the response's size)."""
    if n_rows * per_row > settings.max_result_cells:
        raise ApiError(413, "result_too_large", f"{n_rows:,} rows x {per_row:,} results per row is more than this "
                                                f"server's {settings.max_result_cells:,}; ask for fewer rows or a "
                                                "smaller k / shortlist.")


#: what a resolve body may ask for (``answer``); ``compact`` is the default of pm_vector requests
ANSWERS = ("compact", "features", "full")


def check_resolve_body(d: Any, settings: ServiceSettings, name: str):
    """Validate a resolve body; returns ``(request, k, include_features, answer)`` or raises
    ApiError. ``answer``: ``{"compact": bool, "code_bytes": int | None}`` (what
    :func:`pm_vector.service.documents.resolve_document` takes).

    The body: ``{"request": {...}, "k": 8, "answer": "compact" | "features" | "full",
    "code_bytes": b}``. ``answer`` (default ``"compact"`` for class-rows and cell requests,
    ``"full"`` for the paper's): ``"compact"`` the ids, code prefixes and payloads of every row's
    candidates; ``"features"`` the full rows with raw features (the collection must allow them;
    ``include_features: true`` says the same); ``"full"`` the full rows without features.
    ``code_bytes`` (compact answers): the code width, one of the run's published code widths
    (checked against the run: a 422 saying which), default the whole code."""
    from ..manifold.codes import MAX_CODE_BYTES, MIN_CODE_BYTES

    if not isinstance(d, dict):
        raise ApiError(422, "invalid_input", "the body must be a JSON object {\"request\": {...}, \"k\": 8}.")
    fields = {"request", "k", "include_features", "answer", "code_bytes"}
    unknown = sorted(set(d) - fields)
    if unknown:
        raise ApiError(422, "invalid_input", f"unknown field(s) {unknown}; the body has {sorted(fields)}.")
    k = d.get("k", 8)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= settings.max_k:
        raise ApiError(422, "invalid_input", f"k must be an integer in 1..{settings.max_k}, got {k!r}.")
    inc = d.get("include_features", False)
    if not isinstance(inc, bool):
        raise ApiError(422, "invalid_input", "include_features must be true or false.")
    answer = d.get("answer")
    if answer is not None and answer not in ANSWERS:
        raise ApiError(422, "invalid_input", f"answer must be one of {list(ANSWERS)}, got {answer!r}.")
    if inc and answer not in (None, "features"):
        raise ApiError(422, "invalid_input", f"include_features asks for raw features; answer {answer!r} carries "
                                             "none (use answer 'features').")
    cb = d.get("code_bytes")
    if cb is not None and (isinstance(cb, bool) or not isinstance(cb, int)
                           or not MIN_CODE_BYTES <= cb <= MAX_CODE_BYTES):
        raise ApiError(422, "invalid_input", f"code_bytes must be an integer in {MIN_CODE_BYTES}..{MAX_CODE_BYTES} "
                                             f"(one of the run's published code widths), got {cb!r}.")
    r = d.get("request")
    if not isinstance(r, dict):
        raise ApiError(422, "invalid_input", "'request' must be a request object (ClassRowsRequest.to_dict(), or "
                                             "PrivateMailRequest.to_dict() for the paper's protocol).")
    check_seeded(r, settings)
    rel = releases.by_format(r.get("format", PRIVATEMAIL_FORMAT))  # the paper's requests may omit it
    if rel is None or rel.service_check is None:
        served = [f for f, x in releases.RELEASES.items() if x.service_check is not None]
        raise ApiError(422, "invalid_input", f"unsupported request format {str(r.get('format'))[:60]!r}; this "
                                             f"service answers the releases {served} (their request's format).")
    if answer is None:  # the release's own default answer
        answer = "features" if inc else rel.answers[0]
    inc = answer == "features"
    if cb is not None and answer != "compact":
        raise ApiError(422, "invalid_input", "code_bytes applies to compact answers (answer 'compact').")
    if answer not in rel.answers:
        raise ApiError(422, "invalid_input", f"a {rel.name} request's answer is one of {list(rel.answers)}, not "
                                             f"{answer!r}; drop answer and include_features for its default.")
    req = releases.load(rel.service_check)(r, settings, name, k=k, code_bytes=cb)
    return req, k, inc, {"compact": answer == "compact", "code_bytes": cb}


def check_location_request(r: dict, settings: ServiceSettings, name: str, *, k: int, code_bytes=None):
    """Validate a location request (one reported cell of the whole collection); returns a
    LocationRequest or raises ApiError. Its answer is one list of at most
    :data:`pm_vector.protocol.location.MAX_CANDIDATES` candidates (the request type's bound): its
    size is what the client's byte budget chose, not rows x k."""
    from ..protocol.location import LocationRequest

    if code_bytes is not None:
        raise ApiError(422, "invalid_input", "a location answer is compact, with the code width the request names "
                                             "(request.code_bytes); drop answer, code_bytes and include_features.")
    try:
        lr = LocationRequest.from_dict(r)
    except InvalidInputError as exc:
        raise ApiError(422, "invalid_input", f"invalid location request: {exc}") from None
    if lr.collection not in (None, name):
        raise ApiError(422, "invalid_input", f"the request was built for collection {lr.collection!r:.60}, "
                                             f"not {name!r}.")
    return lr


def check_paper_request(r: dict, settings: ServiceSettings, name: str, *, k: int, code_bytes=None):
    """Validate the paper's request: its schema, types and bounds are PrivateMailRequest's
    (:mod:`pm_vector.protocol.paper`), checked after the size limits."""
    from ..protocol.paper import PrivateMailRequest

    emb = r.get("embedding")
    check_matrix(emb, "request.embedding", settings)
    if r.get("collection") not in (None, name):
        raise ApiError(422, "invalid_input", f"the request was built for collection {r.get('collection')!r}, "
                                             f"not {name!r}.")
    nq = r.get("n_query_rows")
    if isinstance(nq, bool) or not isinstance(nq, int) or not 1 <= nq <= len(emb):
        raise ApiError(422, "invalid_input", f"request.n_query_rows must be an integer in 1..{len(emb)}, got {nq!r}.")
    check_cells(nq, k, settings)
    try:
        return PrivateMailRequest.from_dict(r)
    except (InvalidInputError, TypeError, ValueError) as exc:
        raise ApiError(422, "invalid_input", f"invalid PrivateMail request: {exc}") from None


def check_shortlist(shortlist: Any, settings: ServiceSettings) -> None:
    """k' of a class-rows or cell request: an integer in ``1..settings.max_shortlist`` (a service's
    own limit, at most the protocol's :data:`~pm_vector.protocol.bounds.MAX_K_PRIME`, which
    :mod:`pm_vector.db` checks again for callers that bypass the service)."""
    if isinstance(shortlist, bool) or not isinstance(shortlist, int) or not 1 <= shortlist <= settings.max_shortlist:
        raise ApiError(422, "invalid_input", "request.shortlist (k') must be an integer in "
                                             f"1..{settings.max_shortlist}, got {shortlist!r}.")


def check_query_request(r: dict, settings: ServiceSettings, name: str, *, k: int | None = None, code_bytes=None):
    """Validate a pm_vector request (one noised row per class); returns a ClassRowsRequest or raises
    ApiError. ``k``: the body's, for the answer's size (rows x max(k, k'))."""
    from ..protocol.class_rows import ClassRowsRequest

    check_matrix(r.get("rows"), "request.rows", settings)
    if r.get("collection") not in (None, name):
        raise ApiError(422, "invalid_input", f"the request was built for collection {r.get('collection')!r}, "
                                             f"not {name!r}.")
    check_shortlist(r.get("shortlist"), settings)
    try:
        q = ClassRowsRequest.from_dict(r)
    except (InvalidInputError, TypeError, ValueError) as exc:
        raise ApiError(422, "invalid_input", f"invalid pm_vector request: {exc}") from None
    if k is not None:
        check_cells(q.n_rows, max(k, q.shortlist), settings)
    return q


def check_cell_request(r: dict, settings: ServiceSettings, name: str, *, k: int | None = None, code_bytes=None):
    """Validate a cell request (release "cells": one reported cell per class); returns a CellRequest
    or raises ApiError. Its level, digest and number of reports are checked against the run by
    :func:`pm_vector.db.resolve.cell_resolution.check_against_run` (422 as well)."""
    from ..protocol.cell_request import CellRequest

    reports = r.get("reports")
    if not isinstance(reports, list) or not reports:
        raise ApiError(422, "invalid_input", "request.reports must be a non-empty list of cells (one per class).")
    if len(reports) > settings.max_rows:
        raise ApiError(413, "too_many_rows", f"request.reports has {len(reports):,} cells; this server accepts at most "
                                             f"{settings.max_rows:,}.")
    if r.get("collection") not in (None, name):
        raise ApiError(422, "invalid_input", f"the request was built for collection {r.get('collection')!r}, "
                                             f"not {name!r}.")
    check_shortlist(r.get("shortlist", DEFAULT_SHORTLIST), settings)
    try:
        cr = CellRequest.from_dict(r)
    except (InvalidInputError, TypeError, ValueError) as exc:
        raise ApiError(422, "invalid_input", f"invalid cell request: {exc}") from None
    if k is not None:
        check_cells(cr.n_rows, max(k, cr.shortlist), settings)
    return cr


def check_distances_body(d: Any, settings: ServiceSettings) -> tuple[list[list[float]], int | None]:
    """Validate a ``/kahm/distances`` body; returns ``(features rows, model_id)`` or raises ApiError.
    The feature dimension is checked against the collection by :func:`pm_vector.db.kahm.roles.party_distances`."""
    if not isinstance(d, dict):
        raise ApiError(422, "invalid_input", "the body must be a JSON object {\"features\": [[...], ...]}.")
    unknown = sorted(set(d) - {"features", "model_id"})
    if unknown:
        raise ApiError(422, "invalid_input", f"unknown field(s) {unknown}; the body has 'features' and 'model_id'.")
    mid = d.get("model_id")
    if mid is not None and (isinstance(mid, bool) or not isinstance(mid, int) or not 1 <= mid < 2 ** 63):
        raise ApiError(422, "invalid_input", f"model_id must be a positive integer or null, got {mid!r}.")
    X = d.get("features")
    check_matrix(X, "features", settings)
    return X, mid


def check_seeded(r: dict, settings: ServiceSettings) -> None:
    """Refuse (403) a request marked seeded -- ``"seeded"`` of a class-rows request, ``params.seeded``
    of the paper's -- unless ``settings.allow_seeded_requests``: its noise is a function of a seed,
    so it is not a private release, and only tests may send it."""
    params = r.get("params")
    marks = [r.get("seeded"), params.get("seeded") if isinstance(params, dict) else None]
    if any(m is not None and not isinstance(m, bool) for m in marks):
        raise ApiError(422, "invalid_input", "seeded must be true or false (a JSON boolean).")
    if not settings.allow_seeded_requests and any(m is True for m in marks):
        raise ApiError(403, "seeded_request", "the request is marked seeded (its noise follows from a seed: not a "
                                              "private release); this service refuses seeded requests unless its "
                                              "setting allow_seeded_requests is on "
                                              "(PM_VECTOR_SERVICE_ALLOW_SEEDED_REQUESTS=1, for tests only).")


#: the media types of a request body this service reads (JSON only; a parameter such as
#: ``charset=utf-8`` may follow)
JSON_MEDIA_TYPES = ("application/json",)


async def require_json(request: Request) -> None:
    """A dependency of every endpoint with a body: 415 unless ``Content-Type`` is JSON (before
    the body is read)."""
    ct = request.headers.get("content-type") or ""
    if ct.split(";", 1)[0].strip().lower() not in JSON_MEDIA_TYPES:
        raise ApiError(415, "unsupported_media_type", f"the body must be sent as Content-Type: application/json, got "
                                                      f"{ct[:60]!r}; the service reads JSON only.")
