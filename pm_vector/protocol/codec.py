"""How a document travels: JSON, or msgpack with numpy arrays as one documented extension.

A document is a tree of dicts (string keys), lists, strings, integers, floats, booleans, None,
``bytes`` and numpy arrays. Two encodings, chosen by content negotiation (``Content-Type`` of a
body, ``Accept`` of an answer):

* ``application/json``: arrays as nested lists, ``bytes`` as base64 strings;
* ``application/msgpack``: msgpack (https://msgpack.org), ``bytes`` as ``bin``, and a numpy
  array as the extension type :data:`ARRAY_EXT` whose data is

  ``uint8 dtype code`` (:data:`DTYPES`), ``uint8 ndim``, ``ndim x uint32`` shape (little-endian),
  then the elements in C order, little-endian.

Decoding is strict: a malformed body, an unknown extension or dtype, a shape that does not
match the data, or a nesting deeper than :data:`MAX_DEPTH` is an
:class:`~pm_vector.errors.InvalidInputError` that says which.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

import numpy as np

from ..errors import InvalidInputError

JSON = "application/json"
MSGPACK = "application/msgpack"
MEDIA_TYPES = (JSON, MSGPACK)
#: msgpack extension type of a numpy array
ARRAY_EXT = 1
#: dtype codes of the array extension
DTYPES = {1: "<u1", 2: "<i4", 3: "<i8", 4: "<f2", 5: "<f4", 6: "<f8", 7: "<u2", 8: "<u4", 9: "<i2"}
_CODE_OF = {np.dtype(v).str: k for k, v in DTYPES.items()}
MAX_DEPTH = 32


def _array_ext(a: np.ndarray):
    import msgpack

    a = np.asarray(a)
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    if a.dtype.kind not in "uif":
        raise TypeError(f"arrays of dtype {a.dtype} do not travel; convert them first")
    le = a.astype(a.dtype.newbyteorder("<"), copy=False)
    code = _CODE_OF.get(le.dtype.str)
    if code is None:
        le = a.astype("<f8") if a.dtype.kind == "f" else a.astype("<i8")
        code = _CODE_OF[le.dtype.str]
    head = struct.pack("<BB", code, le.ndim) + struct.pack(f"<{le.ndim}I", *le.shape)
    return msgpack.ExtType(ARRAY_EXT, head + np.ascontiguousarray(le).tobytes())


def _default(v: Any):
    if isinstance(v, np.ndarray):
        return _array_ext(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, tuple):
        return list(v)
    raise TypeError(f"not a document value: {type(v).__name__}")


def _ext_hook(code: int, data: bytes):
    if code != ARRAY_EXT:
        raise InvalidInputError(f"msgpack extension type {code} is not part of the protocol (only {ARRAY_EXT}: arrays).")
    if len(data) < 2:
        raise InvalidInputError("a msgpack array extension is truncated.")
    dt, nd = data[0], data[1]
    if dt not in DTYPES:
        raise InvalidInputError(f"array dtype code {dt} is unknown (known: {sorted(DTYPES)}).")
    if nd > 8 or len(data) < 2 + 4 * nd:
        raise InvalidInputError("a msgpack array extension has a bad shape header.")
    shape = struct.unpack(f"<{nd}I", data[2:2 + 4 * nd])
    dtype = np.dtype(DTYPES[dt])
    body = data[2 + 4 * nd:]
    if len(body) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise InvalidInputError(f"a msgpack array's data ({len(body)} bytes) does not match its shape {shape}.")
    return np.frombuffer(body, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def encode(doc: Any, media_type: str = JSON) -> bytes:
    """The bytes of ``doc`` in ``media_type`` (:data:`JSON` or :data:`MSGPACK`)."""
    if media_type == MSGPACK:
        import msgpack

        return msgpack.packb(doc, default=_default, use_bin_type=True, strict_types=False)
    if media_type == JSON:
        import orjson

        return orjson.dumps(doc, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    raise InvalidInputError(f"media type {media_type!r} is not served; use one of {list(MEDIA_TYPES)}.")


def _json_default(v: Any):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, np.ndarray):
        return v.tolist()
    return _default(v)


def decode(body: bytes, media_type: str = JSON) -> Any:
    """The document in ``body``; a malformed body is an :class:`InvalidInputError`."""
    if media_type == MSGPACK:
        import msgpack

        try:
            doc = msgpack.unpackb(body, ext_hook=_ext_hook, raw=False, strict_map_key=True,
                                  use_list=True)
        except InvalidInputError:
            raise
        except (ValueError, msgpack.exceptions.ExtraData, msgpack.exceptions.FormatError,
                msgpack.exceptions.StackError, TypeError) as e:
            raise InvalidInputError(f"the body is not valid msgpack: {e}.") from None
        _check_depth(doc)
        return doc
    if media_type == JSON:
        import orjson

        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise InvalidInputError(f"the body is not valid JSON: {e}.") from None
    raise InvalidInputError(f"media type {media_type!r} is not served; use one of {list(MEDIA_TYPES)}.")


def _check_depth(doc: Any, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise InvalidInputError(f"the document nests deeper than {MAX_DEPTH} levels.")
    if isinstance(doc, dict):
        for v in doc.values():
            _check_depth(v, depth + 1)
    elif isinstance(doc, list):
        for v in doc:
            _check_depth(v, depth + 1)
