"""How a document travels: JSON, or msgpack with numpy arrays as one documented extension.

A *document* is a tree of dicts (string keys), lists, strings, integers, floats, booleans, None,
``bytes`` and numpy arrays (tuples travel as lists, numpy scalars as numbers, datetimes as ISO 8601
strings, dict keys that are not strings as their ``str``). Two encodings, chosen by content
negotiation (``Content-Type`` of a body, ``Accept`` of an answer):

* ``application/json`` (:data:`JSON`): arrays as nested lists, ``bytes`` as base64 strings, NaN
  and infinities as ``null``;
* ``application/msgpack`` (:data:`MSGPACK`): msgpack (https://msgpack.org/, the spec's ``str``
  and ``bin`` types: strings as ``str``, ``bytes`` as ``bin``), and a numpy array of one or more
  dimensions as the extension type :data:`ARRAY_EXT` (= 1) whose data is, byte for byte::

      offset 0          uint8   dtype code (DTYPES: 1 u1, 2 i4, 3 i8, 4 f2, 5 f4, 6 f8,
                                            7 u2, 8 u4, 9 i2)
      offset 1          uint8   ndim, 1..MAX_NDIM
      offset 2          ndim x uint32 little-endian: the shape
      offset 2+4*ndim   prod(shape) x itemsize bytes: the elements in C order, little-endian

  The data's length is exactly ``2 + 4 * ndim + prod(shape) * itemsize``. Integer arrays travel
  in the narrowest of their dtype and ``uint32`` (item ids: 4 bytes each) when every value fits
  in ``[0, 2**32)``, else of ``int32`` when every value fits; a ``uint8`` array (e.g. a
  ``(k', b)`` block of product codes) is one blob of ``k' * b`` bytes; booleans travel as
  ``uint8``, a 0-d array as its scalar. Floats keep their width (float32 features: 4 bytes
  each; NaN stays NaN). Arrays of other dtypes (complex, objects, strings) do not travel.

Decoding (:func:`decode`) is strict and bounded, for bodies from an untrusted peer: a body over
``max_bytes`` is a :class:`TooLargeError`; malformed msgpack, trailing bytes, a declared length
longer than the body (no allocation beyond the body's size follows a declared length), an
extension type other than :data:`ARRAY_EXT` (msgpack's own timestamp type -1 included), an
unknown dtype code, an ``ndim`` outside ``1..max_ndim``, a shape that does not match the data,
a map key that is not a string, ``bin`` data where ``allow_binary`` is false, or a nesting deeper
than ``max_depth`` are an :class:`~pm_vector.errors.InvalidInputError` that says which; an array
of more than ``max_elements`` elements is a :class:`TooLargeError`, and so is a document over
its element bounds (``max_list_len``, ``max_map_len``, ``max_str_len``, ``max_containers``,
``max_values``: a peer's 16 MiB of one-byte empty maps would otherwise become 16 million Python
dicts). A msgpack body's maps and lists are counted before it is decoded
(:func:`~pm_vector.protocol.msgpack_counts.over_containers`); then it is read once: msgpack's hooks
check each map, list and array as it completes. ``arrays="lists"`` returns
the document a JSON body of the same values would give (arrays as nested lists of Python
numbers): a validator written for JSON then applies unchanged to msgpack.
"""

from __future__ import annotations

import base64
import re
import datetime as _dt
import struct
from typing import Any

import msgpack
import numpy as np
import orjson

from ..errors import InvalidInputError
from .msgpack_counts import over_containers

JSON = "application/json"
MSGPACK = "application/msgpack"
MEDIA_TYPES = (JSON, MSGPACK)
#: msgpack extension type of a numpy array
ARRAY_EXT = 1
#: dtype codes of the array extension
DTYPES = {1: "<u1", 2: "<i4", 3: "<i8", 4: "<f2", 5: "<f4", 6: "<f8", 7: "<u2", 8: "<u4", 9: "<i2"}
_CODE_OF = {np.dtype(v).str: k for k, v in DTYPES.items()}
#: deepest nesting :func:`decode` accepts by default (no request nests more than 4 levels)
MAX_DEPTH = 32
#: most dimensions of an array extension
MAX_NDIM = 8


class TooLargeError(InvalidInputError):
    """A body, or an array in it, over the decoder's bounds (a service answers 413)."""


# ----------------------------------------------------------------------------- encode

def _narrow(a: np.ndarray) -> np.ndarray:
    """An integer array in uint32 (or int32) when every value fits, else int64; uint8 and the
    other narrow dtypes as they are."""
    if a.dtype.itemsize <= 4:
        return a
    lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
    if 0 <= lo and hi < 2 ** 32:
        return a.astype("<u4")
    if -2 ** 31 <= lo and hi < 2 ** 31:
        return a.astype("<i4")
    if hi >= 2 ** 63:
        raise TypeError("a uint64 array with values beyond int64 does not travel")
    return a.astype("<i8")


def _array_ext(a: np.ndarray):
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    if a.dtype.kind not in "uif":
        raise TypeError(f"arrays of dtype {a.dtype} do not travel; convert them first")
    if a.ndim > MAX_NDIM:
        raise TypeError(f"arrays of more than {MAX_NDIM} dimensions do not travel")
    if a.dtype.kind in "iu":
        a = _narrow(a)
    le = a.astype(a.dtype.newbyteorder("<"), copy=False)
    code = _CODE_OF.get(le.dtype.str)
    if code is None:  # float128 and the like
        le, code = a.astype("<f8"), _CODE_OF["<f8"]
    head = struct.pack(f"<BB{le.ndim}I", code, le.ndim, *le.shape)
    return msgpack.ExtType(ARRAY_EXT, head + np.ascontiguousarray(le).tobytes())


def _scalar(v: Any):
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, (_dt.datetime, _dt.date)):
        return v.isoformat()
    raise TypeError(f"not a document value: {type(v).__name__}")


#: values :func:`_prepare` leaves as they are without a call (most of an answer's fields)
_LEAVES = frozenset({str, int, float, bool, type(None), bytes, np.ndarray})


def _prepare(v: Any) -> Any:
    """The document msgpack can write: dict keys as strings, tuples as lists, 0-d arrays as
    scalars (arrays and scalars themselves are left to :func:`_default`)."""
    if isinstance(v, dict):
        return {k if isinstance(k, str) else str(_scalar(k) if isinstance(k, np.generic) else k):
                x if type(x) in _LEAVES and (type(x) is not np.ndarray or x.ndim) else _prepare(x)
                for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [x if type(x) in _LEAVES and (type(x) is not np.ndarray or x.ndim) else _prepare(x) for x in v]
    if isinstance(v, np.ndarray) and v.ndim == 0:
        return _scalar(v[()])
    return v


def _wide_int(v: int) -> float:
    """An integer beyond 64 bits as the nearest float: what jsonb gives back for a float such as
    ``1e300`` (an integer of 301 digits) travels as the number that was stored."""
    try:
        return float(v)
    except OverflowError:
        raise TypeError(f"an integer of {len(str(abs(v)))} digits does not travel") from None


def _wide_ints(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _wide_ints(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_wide_ints(v) for v in doc]
    if isinstance(doc, int) and not isinstance(doc, bool) and not -2 ** 63 <= doc < 2 ** 64:
        return _wide_int(doc)
    return doc


def _default(v: Any):
    if isinstance(v, np.ndarray):
        return _array_ext(v)
    if isinstance(v, int) and not isinstance(v, bool):  # msgpack holds 64 bits
        return _wide_int(v)
    return _scalar(v)


def _json_default(v: Any):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, np.ndarray):
        if v.dtype.kind not in "uifb":
            raise TypeError(f"arrays of dtype {v.dtype} do not travel; convert them first")
        return v.tolist()
    return _scalar(v)


def encode(doc: Any, media_type: str = JSON) -> bytes:
    """The bytes of ``doc`` in ``media_type`` (:data:`JSON` or :data:`MSGPACK`); a value that is
    not part of a document is a :class:`TypeError`. An integer beyond 64 bits travels as the
    nearest float (jsonb gives a stored ``1e300`` back as an integer of 301 digits)."""
    if media_type == MSGPACK:
        return msgpack.packb(_prepare(doc), default=_default, use_bin_type=True, strict_types=False,
                             datetime=False)
    if media_type == JSON:
        opts = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
        try:
            return orjson.dumps(doc, default=_json_default, option=opts)
        except orjson.JSONEncodeError as e:
            if "64-bit" not in str(e):
                raise TypeError(str(e)) from None
        try:  # an integer beyond 64 bits somewhere (e.g. a payload stored before ingest refused them)
            return orjson.dumps(_wide_ints(doc), default=_json_default, option=opts)
        except orjson.JSONEncodeError as e:
            raise TypeError(str(e)) from None
    raise InvalidInputError(f"media type {media_type!r} is not served; use one of {list(MEDIA_TYPES)}.")


def float_arrays(doc: Any) -> Any:
    """``doc`` with every regular nested list of Python floats (e.g. a matrix read back from
    JSON in the database) replaced by a float64 array of the same values: the same document in
    JSON, arrays (8 bytes a value) instead of msgpack floats (9) and list headers in msgpack.
    Lists holding anything else (integers, strings, None, ragged rows) stay lists."""
    if isinstance(doc, dict):
        return {k: float_arrays(v) for k, v in doc.items()}
    if isinstance(doc, list):
        if doc:
            a = np.array(doc, dtype=object)
            if 1 <= a.ndim <= MAX_NDIM and all(type(x) is float for x in a.flat):
                return a.astype(np.float64)
        return [float_arrays(v) for v in doc]
    return doc


# ----------------------------------------------------------------------------- decode

#: the plain values of a document (exact types: msgpack and JSON decoders make no subclasses)
_LEAVES = frozenset({str, int, float, bool, type(None)})


class _Bounds:
    """The hooks of one msgpack decode: arrays (the extension) checked and built, and every map
    and list checked as msgpack completes it (innermost first), so that the document is read
    once: its nesting, key and value types, and the number of containers and values, with
    :class:`TooLargeError` as soon as a count passes its bound."""

    def __init__(self, max_elements: int | None, max_ndim: int, max_depth: int = MAX_DEPTH,
                 allow_binary: bool = True, lists: bool = False, max_containers: int | None = None,
                 max_values: int | None = None):
        self.max_elements, self.max_ndim = max_elements, max_ndim
        self.max_depth, self.allow_binary, self.lists = max_depth, allow_binary, lists
        self.max_containers, self.max_values = max_containers, max_values
        self.containers = self.values = 0
        self.heights: dict[int, int] = {}  # id of a finished container (alive in the document) -> levels

    def _count(self, containers: int, values: int) -> None:
        self.containers += containers
        self.values += values
        if self.max_containers is not None and self.containers > self.max_containers:
            raise TooLargeError(f"the document holds more than {self.max_containers:,} maps and lists; no request "
                                "of this protocol holds that many.")
        if self.max_values is not None and self.values > self.max_values:
            raise TooLargeError(f"the document holds more than {self.max_values:,} values; no request of this "
                                "protocol holds that many.")

    def _height(self, obj, children) -> int:
        h = 0
        for c in children:
            t = type(c)
            if t in _LEAVES:
                continue
            if t is dict or t is list or t is np.ndarray:
                h = max(h, self.heights.get(id(c), 1))
            else:
                self.leaf(c)
        h += 1
        if h > self.max_depth:
            raise InvalidInputError(f"the document nests deeper than {self.max_depth} levels.")
        self.heights[id(obj)] = h
        return h

    def leaf(self, v) -> None:
        """A value that is neither a container nor a plain scalar: ``bytes`` where allowed."""
        if type(v) is bytes:
            if not self.allow_binary:
                raise InvalidInputError("binary data (msgpack bin) is not part of this document.")
        elif type(v) not in _LEAVES and type(v) not in (dict, list, np.ndarray):
            raise InvalidInputError(f"a value of msgpack type {type(v).__name__} is not part of the protocol.")

    def list_hook(self, lst: list):
        self._count(1, len(lst))
        self._height(lst, lst)
        return lst

    def object_hook(self, d: dict):
        self._count(1, len(d))
        for k in d:
            if type(k) is not str:
                raise InvalidInputError("a map key is not a string (only string keys are part of the protocol).")
        self._height(d, d.values())
        return d

    def ext_hook(self, code: int, data: bytes):
        if code != ARRAY_EXT:
            raise InvalidInputError(f"msgpack extension type {code} is not part of the protocol (only "
                                    f"{ARRAY_EXT}: arrays).")
        if len(data) < 2:
            raise InvalidInputError("a msgpack array extension is truncated (no dtype and ndim).")
        dt, nd = data[0], data[1]
        if dt not in DTYPES:
            raise InvalidInputError(f"array dtype code {dt} is unknown (known: {sorted(DTYPES)}).")
        if not 1 <= nd <= self.max_ndim:
            raise InvalidInputError(f"a msgpack array has {nd} dimensions; 1 to {self.max_ndim} are allowed here.")
        if nd > self.max_depth:
            raise InvalidInputError(f"the document nests deeper than {self.max_depth} levels.")
        if len(data) < 2 + 4 * nd:
            raise InvalidInputError("a msgpack array extension's shape is truncated.")
        shape = struct.unpack(f"<{nd}I", data[2:2 + 4 * nd])
        n = 1
        for s in shape:  # Python integers: no overflow
            n *= s
        if self.max_elements is not None and n > self.max_elements:
            raise TooLargeError(f"a msgpack array of shape {shape} has {n:,} elements; at most "
                                f"{self.max_elements:,} are accepted.")
        dtype = np.dtype(DTYPES[dt])
        body = memoryview(data)[2 + 4 * nd:]
        if len(body) != n * dtype.itemsize:
            raise InvalidInputError(f"a msgpack array's data ({len(body)} bytes) does not match its shape {shape} "
                                    f"and dtype {dtype.name} ({n * dtype.itemsize} bytes).")
        # as lists, an (r, c) array is r + 1 lists holding r + r * c values: count what it becomes
        level, containers, values = 1, 0, 0
        for s in shape:
            containers += level
            level *= s
            values += level
        self._count(containers if self.lists else 1, values if self.lists else n)
        a = np.frombuffer(body, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))
        out = a.tolist() if self.lists else a
        self.heights[id(out)] = nd
        return out


def _check_tree(doc: Any, max_depth: int) -> None:
    """Nesting of a decoded JSON document (no copy: JSON holds no keys but strings, no binary)."""
    stack = [(doc, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth >= max_depth:
                raise InvalidInputError(f"the document nests deeper than {max_depth} levels.")
            for x in (v.values() if isinstance(v, dict) else v):
                if isinstance(x, (dict, list)):
                    stack.append((x, depth + 1))


#: a JSON string (its brackets and commas are not structure)
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def json_counts(body: bytes, max_containers: int | None, max_values: int | None) -> None:
    """Refuse (:class:`TooLargeError`) a JSON body that holds more than ``max_containers``
    objects and arrays or more than ``max_values`` values, before it is parsed: each ``{`` or
    ``[`` outside a string opens one, and a document of n values has at most n - 1 commas
    outside strings. The bytes are counted first (in C); only a body over a bound by that count
    has its strings masked (one regular-expression pass) and is counted again."""
    def over(b: bytes) -> tuple[int, int]:
        return b.count(b"[") + b.count(b"{"), b.count(b",") + 1

    def refuse(n_cont: int, n_val: int) -> None:
        if max_containers is not None and n_cont > max_containers:
            raise TooLargeError(f"the document holds {n_cont:,} objects and arrays; no request of this protocol "
                                f"holds more than {max_containers:,}.")
        if max_values is not None and n_val > max_values:
            raise TooLargeError(f"the document holds more than {max_values:,} values; no request of this protocol "
                                "holds that many.")

    n_cont, n_val = over(body)
    if (max_containers is not None and n_cont > max_containers) or (max_values is not None and n_val > max_values):
        refuse(*over(_JSON_STRING.sub(b'""', body)))


def decode(body: bytes, media_type: str = JSON, *, max_bytes: int | None = None, max_depth: int = MAX_DEPTH,
           max_elements: int | None = None, max_ndim: int = MAX_NDIM, allow_binary: bool = True,
           arrays: str = "numpy", max_list_len: int | None = None, max_map_len: int | None = None,
           max_str_len: int | None = None, max_containers: int | None = None,
           max_values: int | None = None) -> Any:
    """The document in ``body`` (see the module's doc for the bounds); a malformed body is an
    :class:`InvalidInputError`, one over the bounds a :class:`TooLargeError`. ``arrays``:
    ``"numpy"`` (msgpack arrays as numpy arrays) or ``"lists"`` (as nested lists, the document a
    JSON body of the same values gives). JSON bodies: RFC 8259 (no NaN or Infinity literals).

    Element bounds (None: the body's length): ``max_list_len`` / ``max_map_len`` /
    ``max_str_len`` the longest list, map and string (msgpack refuses a longer declared length
    before allocating it); ``max_containers`` the maps and lists of the whole document (an array
    extension counts as one, or as the lists it becomes with ``arrays="lists"``) and
    ``max_values`` their elements. A msgpack document is read once, its checks made as each
    container completes; a JSON body is counted before it is parsed (:func:`json_counts`)."""
    if arrays not in ("numpy", "lists"):
        raise ValueError("arrays must be 'numpy' or 'lists'")
    body = bytes(body)
    if max_bytes is not None and len(body) > max_bytes:
        raise TooLargeError(f"the body has {len(body):,} bytes; at most {max_bytes:,} are accepted.")
    if not body:
        raise InvalidInputError("the body is empty.")
    if media_type == MSGPACK:
        if max_containers is not None:  # counted before msgpack builds a single object

            if over_containers(body, int(max_containers)):
                raise TooLargeError(f"the document holds more than {int(max_containers):,} maps and lists; no "
                                    "request of this protocol holds that many.")
        bounds = _Bounds(max_elements, min(int(max_ndim), MAX_NDIM), max_depth, allow_binary, arrays == "lists",
                         max_containers, max_values)
        n = len(body)  # no declared length may exceed the body itself

        def cap(v):
            return n if v is None else max(0, min(int(v), n))

        try:
            doc = msgpack.unpackb(body, ext_hook=bounds.ext_hook, list_hook=bounds.list_hook,
                                  object_hook=bounds.object_hook, raw=False, strict_map_key=True, use_list=True,
                                  timestamp=0, max_str_len=cap(max_str_len), max_bin_len=n,
                                  max_array_len=cap(max_list_len), max_map_len=cap(max_map_len), max_ext_len=n)
        except InvalidInputError:
            raise
        except msgpack.exceptions.StackError:
            raise InvalidInputError(f"the document nests deeper than {max_depth} levels.") from None
        except ValueError as e:
            m = re.fullmatch(r"(\d+) exceeds max_\w+_len\((\d+)\)", str(e))
            if m and int(m[2]) < n and int(m[1]) <= n:
                # a declared length within the body but over its bound: refused before allocation
                raise TooLargeError(f"the document holds a list, map or string longer than this decoder "
                                    f"accepts ({e}).") from None
            raise InvalidInputError(f"the body is not valid msgpack ({e or type(e).__name__}).") from None
        except (msgpack.exceptions.ExtraData, msgpack.exceptions.FormatError, TypeError,
                UnicodeDecodeError, OverflowError) as e:
            why = str(e) or type(e).__name__
            raise InvalidInputError(f"the body is not valid msgpack ({why}).") from None
        bounds.leaf(doc)
        return doc
    if media_type == JSON:
        json_counts(body, max_containers, max_values)
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise InvalidInputError(f"the body is not valid JSON ({e}).") from None
        _check_tree(doc, max_depth)
        return doc
    raise InvalidInputError(f"media type {media_type!r} is not served; use one of {list(MEDIA_TYPES)}.")


# ----------------------------------------------------------------------------- decode, a client's answer

def decode_bounded(body: bytes, media_type: str, *, max_bytes: int, max_containers: int, max_items: int,
                   max_elements: int, max_depth: int = MAX_DEPTH, arrays: str = "numpy") -> Any:
    """:func:`decode` for a body from a peer that may be hostile, with every allocation bounded
    before it is made: at most ``max_bytes`` bytes, ``max_containers`` lists and maps in all,
    ``max_items`` entries in any one list or map (msgpack's declared lengths), ``max_elements``
    elements in any one array, ``max_depth`` levels. A JSON body is refused from a count of its
    ``[`` and ``{`` bytes (an upper bound of its containers) before it is parsed. Over a bound:
    :class:`TooLargeError`; malformed: :class:`~pm_vector.errors.InvalidInputError`."""
    return decode(body, media_type, max_bytes=max_bytes, max_depth=max_depth, max_elements=max_elements,
                  arrays=arrays, max_list_len=max_items, max_map_len=max_items, max_containers=max_containers)
