"""The items' product codes as a collection publishes them, and what a client checks of them.

The embedding job fits :class:`~pm_vector.manifold.codes.ProductCodes` on the run's public
anchor only and publishes it with the public anchor document (``frame["product_codes"]``,
:func:`pack`): its arrays are little-endian float32, base64 in the document, so the text is the
same on either wire encoding and about a third of JSON numbers. The run's ``class_rows``
document carries :func:`summary`: ``{"code_bytes", "n_stages", "stage_bytes", "widths", "offsets",
"digest"}``, and a compact answer says which width it carries and the digest of the codes it was coded with
(``answer["codes"] = {"bytes", "digest"}``). A client rebuilds the codes with :func:`unpack`,
which refuses a document that does not hash to the published digest, and reads a row's codes
with :func:`row_codes` (a uint8 array, raw bytes, base64 text or nested lists: whatever the
wire encoding made of the ``(k', b)`` uint8 array the server put in the answer).
"""

from __future__ import annotations

import base64
from typing import Any, Mapping

import numpy as np

from ..errors import AlignmentError, InvalidInputError
from ..manifold.codes import ProductCodes

#: largest array a published codes document may hold (elements): a 16,000-d rotation is 2.56e8
MAX_ELEMENTS = 300_000_000


def _pack_array(a) -> dict[str, Any]:
    a = np.ascontiguousarray(np.asarray(a, dtype="<f4"))
    return {"dtype": "<f4", "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode("ascii")}


def _unpack_array(d: Any, what: str) -> np.ndarray:
    if isinstance(d, np.ndarray) or isinstance(d, list):  # already arrays (an in-process document)
        return np.asarray(d, dtype=np.float32)
    if not isinstance(d, Mapping) or d.get("dtype") != "<f4" or not isinstance(d.get("data"), str):
        raise InvalidInputError(f"product codes {what}: expected {{'dtype': '<f4', 'shape', 'data'}}.")
    shape = d.get("shape")
    if (not isinstance(shape, list) or not 1 <= len(shape) <= 3
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in shape)
            or int(np.prod(shape)) > MAX_ELEMENTS):
        raise InvalidInputError(f"product codes {what}: bad shape {shape!r}.")
    try:
        raw = base64.b64decode(d["data"], validate=True)
    except ValueError:
        raise InvalidInputError(f"product codes {what}: data is not base64.") from None
    if len(raw) != 4 * int(np.prod(shape)):
        raise InvalidInputError(f"product codes {what}: {len(raw)} bytes do not fill shape {shape}.")
    return np.frombuffer(raw, dtype="<f4").reshape(shape)


def pack(pc) -> dict[str, Any]:
    """The published document of fitted :class:`~pm_vector.manifold.codes.ProductCodes`."""
    d = pc.to_dict()
    return {**{k: v for k, v in d.items() if k not in ("mean", "rotation", "centroids", "wide_centroids")},
            "mean": _pack_array(d["mean"]), "rotation": _pack_array(d["rotation"]),
            "centroids": [_pack_array(c) for c in d["centroids"]],
            "wide_centroids": [_pack_array(c) for c in d["wide_centroids"]]}


def summary(pc) -> dict[str, Any]:
    """What a run's ``class_rows`` document says of its codes: the residual stages
    (``stage_bytes``: their prefix widths), every width an answer may carry (``widths``) and where
    each sits in an item's stored code (``offsets``, bytes), and the digest."""
    return {"code_bytes": int(pc.code_bytes), "n_stages": int(pc.n_stages),
            "stage_bytes": [int(b) for b in pc.stage_bytes_], "widths": [int(w) for w in pc.widths_],
            "offsets": [int(pc.span(w)[0]) for w in pc.widths_], "digest": pc.digest()}


def unpack(doc: Mapping[str, Any], digest: str | None = None):
    """:class:`~pm_vector.manifold.codes.ProductCodes` from a published document; with ``digest``
    (the run's published one) a document that does not hash to it raises AlignmentError."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("centroids"), list):
        raise InvalidInputError("not a product-codes document (centroids missing).")
    wide = doc.get("wide_centroids", [])
    if not isinstance(wide, list):
        raise InvalidInputError("not a product-codes document (wide_centroids is not a list).")
    d = {**doc, "mean": _unpack_array(doc.get("mean"), "mean"),
         "rotation": _unpack_array(doc.get("rotation"), "rotation"),
         "centroids": [_unpack_array(c, f"centroids[{j}]") for j, c in enumerate(doc["centroids"])],
         **({"wide_centroids": [_unpack_array(c, f"wide_centroids[{j}]") for j, c in enumerate(wide)]}
            if "wide_centroids" in doc else {})}
    pc = ProductCodes.from_dict(d)
    if digest is not None and pc.digest() != digest:
        raise AlignmentError("the published product codes do not hash to the digest the run publishes; refusing "
                             "to re-rank by them.")
    return pc


def row_codes(value: Any, n: int, width: int) -> np.ndarray:
    """A row's ``(n, width)`` uint8 codes from what the wire made of them: a numpy array
    (msgpack), nested lists of integers (JSON), raw bytes or base64 text of ``n * width`` bytes.
    Anything else, or another shape, raises InvalidInputError."""
    if isinstance(value, str):
        try:
            value = base64.b64decode(value, validate=True)
        except ValueError:
            raise InvalidInputError("an answer's codes are not base64.") from None
    if isinstance(value, (bytes, bytearray, memoryview)):
        a = np.frombuffer(bytes(value), dtype=np.uint8)
        if a.size != n * width:
            raise InvalidInputError(f"an answer row's codes have {a.size} bytes; {n} x {width} expected.")
        return a.reshape(n, width)
    a = np.asarray(value)
    if n == 0 and a.size == 0:
        return np.zeros((0, width), np.uint8)
    if a.shape != (n, width) or a.dtype.kind not in "ui" or (a.size and (a.min() < 0 or a.max() > 255)):
        raise InvalidInputError(f"an answer row's codes must be ({n}, {width}) bytes; got shape {a.shape}, "
                                f"dtype {a.dtype}.")
    return a.astype(np.uint8)
