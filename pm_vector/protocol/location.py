"""The location release on the wire: the request (:class:`LocationRequest`) and the answer's checks
(:func:`check_location_answer`), below both the client and the server.

A location request reports ONE public cell of the whole collection (:mod:`pm_vector.privacy.location`)
and asks for ``candidates`` items with ``code_bytes`` of their product codes. The answer is a public
function of (run, its items, level, report, eps, candidates, code_bytes): ``n_items`` (the run's items
when the list was built), ``item_ids`` (``n`` distinct ids, ``n = min(candidates, n_items)`` of the run,
best first), ``codes`` (``n x code_bytes`` bytes, the prefix of each item's published code) and, for a
collection that stores payloads, ``payloads`` (``n`` JSON values). A client refuses the whole answer
unless every field has exactly that shape.

The run's items change without a new run (deletes, new items, an attached table's sync), so the
anchor document a client holds may count more items than the run has when it answers: the answer
says its own ``n_items``, and the client checks the list against it and against the request (never
more than ``candidates``). An answer without ``n_items`` (an earlier server) is checked against the
count the client holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import numpy as np

from ..errors import InvalidInputError
from . import bounds
from .formats import LOCATION_FORMAT, expect
from .wire_types import Collection, Digest, PureEpsilon, StrictBool, ZeroDelta, check_keys, int_in, wire, wire_names
from .published_codes import row_codes

#: the most candidates a location answer may hold (pm_vector.shortlist.MAX_LOCATION_CANDIDATES)
MAX_CANDIDATES = 65_536
#: the widest code prefix an answer may carry, in bytes
MAX_CODE_BYTES = 256
#: the largest level M
MAX_LEVEL = 1 << 20
#: the most items a run may declare
MAX_ITEMS = 1 << 40


def _int(name: str, v, lo: int, hi: int) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not lo <= int(v) <= hi:
        raise InvalidInputError(f"{name} must be an integer in [{lo}, {hi}]; got {v!r:.40}.")
    return int(v)


@dataclass
class LocationRequest:
    """What leaves the client in a location release: ``report`` (the reported cell, in
    ``[0, level)``), ``level`` (M), ``epsilon`` (> 0, or inf for benchmarks), ``delta`` (always 0),
    ``locations_digest`` (of the published location cells), ``candidates`` (S) and ``code_bytes``
    (the code prefix per candidate; chosen by the public plan, :func:`~pm_vector.privacy.location.plan`),
    ``collection``, ``release`` (always ``"location"``) and ``seeded`` (true only for a request built
    with an injected generator)."""

    # each field once, with its wire type: the document's model (LocationRequestBody) is made from these
    report: int = field(metadata=wire(int_in(0, MAX_LEVEL - 1, "The reported cell, in [0, level).")))
    level: int = field(metadata=wire(int_in(2, MAX_LEVEL, "M, the cells of the collection.")))
    epsilon: float = field(metadata=wire(PureEpsilon))
    locations_digest: str = field(metadata=wire(Digest))
    candidates: int = field(metadata=wire(int_in(1, MAX_CANDIDATES, "S: items in the answer.")))
    code_bytes: int = field(metadata=wire(int_in(1, MAX_CODE_BYTES, "The code prefix of each candidate, in bytes.")))
    collection: str | None = field(default=None, metadata=wire(Collection))
    release: str = field(default="location", metadata=wire(Literal["location"]))
    delta: float = field(default=0.0, metadata=wire(ZeroDelta))
    seeded: bool = field(default=False, metadata=wire(StrictBool))

    def __post_init__(self):
        expect(self.release, "location", f"a location request has release 'location'; got {self.release!r:.40}.")
        self.level = _int("level", self.level, 2, MAX_LEVEL)
        self.report = _int("report", self.report, 0, self.level - 1)
        self.candidates = _int("candidates", self.candidates, 1, MAX_CANDIDATES)
        self.code_bytes = _int("code_bytes", self.code_bytes, 1, MAX_CODE_BYTES)
        self.epsilon = bounds.pure_epsilon(self.epsilon)
        self.delta = bounds.zero_delta(self.delta, "a location request")
        bounds.digest(self.locations_digest, "locations_digest must be the hex digest of the published location cells.")
        self.collection = bounds.collection(self.collection)
        if not isinstance(self.seeded, (bool, np.bool_)):
            raise InvalidInputError("seeded must be true or false.")
        self.seeded = bool(self.seeded)

    @property
    def n_rows(self) -> int:
        return 1

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self._NEED + self._OPTIONAL}
        d["format"] = LOCATION_FORMAT
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d) -> "LocationRequest":
        expect(d.get("format") if isinstance(d, Mapping) else None, LOCATION_FORMAT,
               f"not a location request (format {LOCATION_FORMAT!r} expected).")
        check_keys(d, cls._NEED, cls._OPTIONAL, "location request",
                   f"a location request has {list(cls._NEED)} and optionally {list(cls._OPTIONAL)}")
        return cls(**{k: d[k] for k in cls._NEED + cls._OPTIONAL if k in d})


#: the document's required and optional keys, read from the fields
LocationRequest._NEED, LocationRequest._OPTIONAL = wire_names(LocationRequest)


def payload_wire_bytes(max_payload_bytes: int, wire: str = "msgpack") -> int:
    """The most bytes one candidate's payload may take in a location answer on the wire, for a
    collection whose payloads are at most ``max_payload_bytes`` bytes of compact JSON
    (:mod:`pm_vector.db.store.payloads`); 0 when it is 0 (no payload can be stored).

    JSON (``wire="json"``): the value as written (never longer than its compact JSON as stored) and
    its separator, or ``null`` for an item without payload: ``B + 5``. msgpack: a float takes 9
    bytes where compact JSON may take 3 (``1.5``) and a separator, every other value at most one
    byte more than its JSON (a string's header against its quotes): a payload of ``B`` bytes takes at
    most ``9 B / 4`` plus a few header bytes, ``9 B // 4 + 12`` (``[1.5,1.5,...]``: 64 floats in 257
    bytes of JSON, 579 of msgpack)."""
    b = int(max_payload_bytes)
    if b <= 0:
        return 0
    return b + 5 if wire == "json" else 9 * b // 4 + 12


def _ids(value: Any, n: int) -> np.ndarray:
    """``n`` item ids from what the wire made of them (a uint32/int array, a list of ints, or raw
    big-endian uint32 bytes), refused unless exactly ``n`` distinct non-negative integers."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        if len(value) != 4 * n:
            raise InvalidInputError(f"the answer's item_ids hold {len(value)} bytes; {n} x 4 expected.")
        a = np.frombuffer(bytes(value), dtype=">u4").astype(np.int64)
    elif isinstance(value, np.ndarray):
        if value.shape != (n,) or value.dtype.kind not in "ui":
            raise InvalidInputError(f"the answer's item_ids must be {n} integers; got shape {value.shape}, "
                                    f"dtype {value.dtype}.")
        a = value.astype(np.int64)
    elif isinstance(value, list):
        if len(value) != n or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise InvalidInputError(f"the answer's item_ids must be a list of {n} integers.")
        if n and (min(value) < 0 or max(value) >= 1 << 63):
            raise InvalidInputError("the answer's item_ids must be non-negative 64-bit integers.")
        a = np.asarray(value, dtype=np.int64)
    else:
        raise InvalidInputError("the answer's item_ids are missing or not an array of integers.")
    if a.size and (a.min() < 0 or np.unique(a).size != a.size):
        raise InvalidInputError("the answer's item_ids must be distinct non-negative integers.")
    return a


def check_location_answer(answer: Any, request: LocationRequest, *, n_items: int, codes_digest: str,
                          run_id: Any) -> tuple[np.ndarray, np.ndarray, list | None]:
    """``(item_ids, codes, payloads)`` of a location answer after checking ALL of it against the
    request and the public document it was built on: the release, level and report echoed, the run
    and codes digest the request was built on, exactly ``n = min(candidates, N)`` distinct ids, ``n x
    code_bytes`` code bytes, and ``payloads`` either absent (None) or a list of exactly ``n``; ``N``
    is the answer's own ``n_items`` (an integer in ``[0, MAX_ITEMS]``: the run's items when its list
    was built, fewer than the document's after a delete), or ``n_items`` (the client's published
    count) for an answer that says none. So an answer never holds more than the request asked for,
    and always exactly what its run holds. Anything else raises
    :class:`~pm_vector.errors.InvalidInputError` with one message that names the field; its checks
    use only the answer and public values, never the client's query."""
    if not isinstance(answer, Mapping):
        raise InvalidInputError("the answer is not a document.")
    held = answer.get("n_items", n_items)
    if isinstance(held, (bool, np.bool_)) or not isinstance(held, (int, np.integer)) or not 0 <= held <= MAX_ITEMS:
        raise InvalidInputError(f"the answer's n_items must be an integer in [0, {MAX_ITEMS}]; got {str(held)[:40]!r}.")
    n = min(int(request.candidates), int(held))
    for key, want in (("release", "location"), ("level", request.level), ("report", request.report),
                      ("run_id", run_id)):
        got = answer.get(key)
        if isinstance(got, bool) or got != want:
            raise InvalidInputError(f"the answer's {key} is {str(got)[:40]!r}; the request has {str(want)[:40]!r}.")
    meta = answer.get("codes")
    if not isinstance(meta, Mapping) or meta.get("digest") != codes_digest or meta.get("bytes") != request.code_bytes:
        raise InvalidInputError("the answer's codes are not the published codes' prefix the request asked for.")
    ids = _ids(answer.get("item_ids"), n)
    codes = row_codes(answer.get("codes_data"), n, int(request.code_bytes))
    pl = answer.get("payloads")
    if pl is not None and (not isinstance(pl, list) or len(pl) != n):
        raise InvalidInputError(f"the answer's payloads must be absent or a list of {n} values.")
    return ids, codes, pl
