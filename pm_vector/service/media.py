"""Content negotiation of the service: which media type a request body is read in, and which an
answer is written in (:mod:`pm_vector.protocol.codec` holds the two layouts).

* **Request bodies**: ``Content-Type: application/json`` or ``application/msgpack`` (a parameter
  such as ``charset=utf-8`` may follow); anything else, or none, is 415 before the body is read
  (:func:`require_body_type`). A msgpack body is decoded to the very document a JSON body of the
  same values gives (arrays become lists of numbers) and goes through the same validation
  (:mod:`pm_vector.service.validation`: strict schema, size caps); the decoder is bounded first:
  no nesting deeper than :data:`~pm_vector.protocol.codec.MAX_DEPTH`, arrays of at most two
  dimensions and of at most ``max_rows x max_dim`` elements, no more maps, lists and values than
  the largest request holds (:func:`element_bounds`; 413 above), no ``bin`` data, no
  extension type but arrays. A malformed msgpack body is 400 ``malformed_msgpack``.
* **Answers** of the endpoints that serve documents (``/collections``, ``/collections/{name}``,
  its ``/anchor``, ``/items``, ``/resolve``, ``/kahm/models`` and ``/kahm/distances``: the
  endpoint depends on :func:`negotiate` and returns :func:`respond`; ``/health``, jobs and keys
  answer JSON): as ``Accept`` asks (:func:`answer_type`, RFC 9110 media ranges with ``q``
  weights): ``application/msgpack`` or ``application/json``; JSON when the client says nothing,
  ``*/*`` or ``application/*`` (or when both are equally preferred). An ``Accept`` that admits
  neither is **406** ``not_acceptable`` (decided before the endpoint does any work, so nothing
  is logged): a client never receives a body in a type it did not ask for. Answers carry
  ``Vary: Accept``. Refusals (4xx/5xx) are always JSON ``{"error", "message"}``, which every
  client reads (the client parses an answer by its ``Content-Type``).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from ..errors import InvalidInputError
from ..protocol import codec
from .errors import ApiError
from .validation import parse_json

#: media types of a request body the service reads
BODY_TYPES = (codec.JSON, codec.MSGPACK)
#: the names accepted for msgpack (the registered one first; ``x-msgpack`` is its older name)
_MSGPACK_NAMES = (codec.MSGPACK, "application/x-msgpack")


def _media(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def body_type(request: Request) -> str:
    """The media type of the request's body (:data:`BODY_TYPES`), or 415."""
    ct = request.headers.get("content-type") or ""
    m = _media(ct)
    if m == codec.JSON:
        return codec.JSON
    if m in _MSGPACK_NAMES:
        return codec.MSGPACK
    raise ApiError(415, "unsupported_media_type", f"the body must be sent as Content-Type: application/json or "
                                                  f"application/msgpack, got {ct[:60]!r}.")


async def require_body_type(request: Request) -> None:
    """A dependency of every endpoint with a body: 415 unless its ``Content-Type`` is one the
    service reads (checked before the body is read)."""
    body_type(request)


#: keys of the largest map of any request (a paper request's fields; its params.frame has 10)
MAX_MAP_KEYS = 64
#: maps and lists a request holds besides its matrix rows (the body, the request, params, ...)
_FEW = 64


def element_bounds(settings) -> dict[str, int]:
    """The element bounds of a request body (:func:`pm_vector.protocol.codec.decode`), from the
    largest request the settings allow: a list at most as long as the longest list of any
    request (rows, a row, ids), a map of at most :data:`MAX_MAP_KEYS` keys, at most one list per
    row (and a few more) and one value per matrix cell and id (and a few more)."""
    longest = max(settings.max_rows, settings.max_dim, settings.max_ids)
    return {"max_list_len": longest, "max_map_len": MAX_MAP_KEYS, "max_containers": settings.max_rows + _FEW,
            "max_values": settings.max_rows * (settings.max_dim + 1) + settings.max_ids + 4 * _FEW}


def read_body(media: str, body: bytes, settings) -> Any:
    """The document of a request body in ``media`` (:func:`body_type`), as a JSON body of the same
    values would give it (arrays of a msgpack body as lists of numbers), bounded by ``settings``
    (see the module's doc and :func:`element_bounds`: a body over them is 413 before it is
    parsed, a JSON one, or as soon as the count passes, a msgpack one)."""
    bounds = element_bounds(settings)
    if media == codec.JSON:
        try:
            codec.json_counts(body, bounds["max_containers"], bounds["max_values"])
        except codec.TooLargeError as exc:
            raise ApiError(413, "payload_too_large", str(exc)) from None
        return parse_json(body)
    if not body:
        raise ApiError(400, "malformed_msgpack", "the request body is empty; send a msgpack map.")
    try:
        return codec.decode(body, codec.MSGPACK, max_bytes=settings.max_body_bytes, max_ndim=2,
                            max_elements=settings.max_rows * settings.max_dim, allow_binary=False, arrays="lists",
                            **bounds)
    except codec.TooLargeError as exc:
        raise ApiError(413, "payload_too_large", str(exc)) from None
    except InvalidInputError as exc:
        raise ApiError(400, "malformed_msgpack", f"the request body is not a valid msgpack document: {exc}") from None


def _ranges(accept: str) -> list[tuple[str, float]]:
    out = []
    for part in accept.split(","):
        bits = [b.strip() for b in part.split(";")]
        if not bits[0]:
            continue
        q = 1.0
        for b in bits[1:]:
            if b[:2].lower() == "q=":
                try:
                    q = float(b[2:])
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:
                    q = 0.0
        out.append((bits[0].lower(), q))
    return out


def _weight(media: str, ranges: list[tuple[str, float]]) -> float | None:
    """The q of the most specific range matching ``media`` (None: no range matches)."""
    best, spec = None, -1
    top = media.split("/", 1)[0]
    for r, q in ranges:
        s = 2 if (r == media or (media == codec.MSGPACK and r in _MSGPACK_NAMES)) else \
            1 if r == f"{top}/*" else 0 if r == "*/*" else -1
        if s > spec:
            best, spec = q, s
    return best


def answer_type(request: Request) -> str:
    """The media type of the answer ``Accept`` asks for (see the module's doc), or 406."""
    accept = request.headers.get("accept")
    if accept is None or not accept.strip():
        return codec.JSON
    ranges = _ranges(accept)
    wj, wm = _weight(codec.JSON, ranges), _weight(codec.MSGPACK, ranges)
    wj, wm = wj or 0.0, wm or 0.0
    if wj <= 0 and wm <= 0:
        raise ApiError(406, "not_acceptable", f"this endpoint answers application/json or application/msgpack; "
                                              f"Accept: {accept[:80]!r} admits neither.")
    return codec.MSGPACK if wm > wj else codec.JSON


async def negotiate(request: Request) -> None:
    """A dependency of every endpoint that answers a document: 406 for an ``Accept`` the service
    cannot meet, before any work; the type goes to ``request.state.answer_type``."""
    request.state.answer_type = answer_type(request)


def respond(request: Request, doc: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``doc`` written in the negotiated type (:func:`negotiate`; JSON if it did not run)."""
    media = getattr(request.state, "answer_type", None) or answer_type(request)
    return Response(codec.encode(doc, media), status_code=status_code, media_type=media,
                    headers={"Vary": "Accept", **(headers or {})})


def body_schema(model: str) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of an endpoint that reads its body itself: the components
    schema ``model``, in either media type."""
    ref = {"schema": {"$ref": f"#/components/schemas/{model}"}}
    return {"requestBody": {"required": True, "content": {codec.JSON: ref, codec.MSGPACK: ref}}}
