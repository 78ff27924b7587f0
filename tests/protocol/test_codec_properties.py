"""Property tests (hypothesis) of the wire codec, the request types and the payload bounds
(issue 25, "tools of the field"): generated documents instead of a hand-picked list.

* ``decode(encode(x)) == x`` in both media types (JSON: the JSON values; msgpack: with ``bytes``
  and numpy arrays too);
* every strict prefix of an encoded document, and any byte string at all, is either a document
  or an :class:`InvalidInputError` -- never another exception;
* the element bounds: a document with exactly the bound's number of containers or values is
  read, one more is a :class:`TooLargeError`;
* a request's ``from_dict(to_dict())`` is the request, and any field replaced by any JSON value
  is either a request or an :class:`InvalidInputError` (the service's 422);
* a payload is either refused with an :class:`InvalidInputError` or stored in a form that every
  answer can carry: encodable in both media types, nested at most 16 deep, its counted size the
  compact JSON of what is stored.

Bounded example counts: the file runs in a few seconds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pm_vector.errors import InvalidInputError
from pm_vector.protocol import codec

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

int64 = st.integers(-2 ** 63, 2 ** 63 - 1)
json_scalars = st.none() | st.booleans() | int64 | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)


def _json_docs(leaves=json_scalars, max_leaves=30):
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                                             max_size=5),
                        max_leaves=max_leaves)


arrays = hnp.arrays(dtype=st.sampled_from(["<u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<f2", "<f4", "<f8", "?"]),
                    shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4))
msgpack_scalars = json_scalars | st.floats() | st.binary(max_size=20) | st.integers(-2 ** 63, 2 ** 64 - 1)


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(
            a.astype(np.float64) if a.dtype.kind == "f" else a.astype(np.int64) if a.dtype.kind in "iub" else a,
            b.astype(np.float64) if b.dtype.kind == "f" else b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@FAST
@given(_json_docs())
def test_json_round_trip(doc):
    assert _same(doc, codec.decode(codec.encode(doc, codec.JSON), codec.JSON))


@FAST
@given(_json_docs(msgpack_scalars | arrays))
def test_msgpack_round_trip(doc):
    assert _same(doc, codec.decode(codec.encode(doc, codec.MSGPACK), codec.MSGPACK))


def _refused_or_read(body: bytes, media: str, **kw) -> None:
    try:
        codec.decode(body, media, **kw)
    except InvalidInputError:
        pass  # TooLargeError is one too


@FAST
@given(st.dictionaries(st.text(max_size=8), _json_docs(msgpack_scalars | arrays, 12), min_size=1, max_size=4))
def test_every_strict_prefix_is_refused(doc):
    for media in codec.MEDIA_TYPES:
        if media == codec.JSON:
            doc = codec.decode(codec.encode(doc, codec.JSON), codec.JSON)  # what JSON carries
        body = codec.encode(doc, media)
        for i in range(len(body)):
            with pytest.raises(InvalidInputError):
                codec.decode(body[:i], media)


@FAST
@given(st.binary(max_size=300), st.sampled_from(codec.MEDIA_TYPES))
def test_any_bytes_are_a_document_or_a_clean_refusal(body, media):
    _refused_or_read(body, media, max_depth=8, max_list_len=50, max_map_len=20, max_containers=40, max_values=200,
                     allow_binary=False)


@FAST
@given(_json_docs(msgpack_scalars | arrays, 12), st.integers(0, 2 ** 32), st.data())
def test_mutated_msgpack_is_a_document_or_a_clean_refusal(doc, seed, data):
    body = bytearray(codec.encode({"d": doc}, codec.MSGPACK))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    _refused_or_read(bytes(body), codec.MSGPACK, max_containers=100, max_values=1000)


def _counts(doc) -> tuple[int, int]:
    """(maps and lists, their elements) of a decoded JSON-values document."""
    if isinstance(doc, dict):
        parts = [_counts(v) for v in doc.values()]
        return 1 + sum(p[0] for p in parts), len(doc) + sum(p[1] for p in parts)
    if isinstance(doc, list):
        parts = [_counts(v) for v in doc]
        return 1 + sum(p[0] for p in parts), len(doc) + sum(p[1] for p in parts)
    return 0, 0


def _longest(doc) -> int:
    if isinstance(doc, (dict, list)):
        inner = doc.values() if isinstance(doc, dict) else doc
        return max([len(doc)] + [_longest(x) for x in inner])
    return 0


@FAST
@given(st.lists(_json_docs(st.none() | st.booleans() | st.integers(-100, 100), 20), min_size=1, max_size=6))
def test_container_and_value_bounds_are_exact_for_msgpack(doc):
    body = codec.encode(doc, codec.MSGPACK)
    n_cont, n_val = _counts(doc)
    assert _same(doc, codec.decode(body, codec.MSGPACK, max_containers=n_cont, max_values=n_val))
    with pytest.raises(codec.TooLargeError):
        codec.decode(body, codec.MSGPACK, max_containers=n_cont - 1)
    if n_val:
        with pytest.raises(codec.TooLargeError):
            codec.decode(body, codec.MSGPACK, max_values=n_val - 1)
    longest = _longest(doc)
    codec.decode(body, codec.MSGPACK, max_list_len=longest, max_map_len=longest)
    if longest > 1:  # (a one-byte body bounds every length by itself)
        with pytest.raises(codec.TooLargeError):
            codec.decode(body, codec.MSGPACK, max_list_len=longest - 1, max_map_len=longest - 1)


def _lists_counted(doc) -> int:
    """Maps and lists of a document as msgpack holds them (an array extension is no list)."""
    if isinstance(doc, dict):
        return 1 + sum(_lists_counted(v) for v in doc.values())
    if isinstance(doc, list):
        return 1 + sum(_lists_counted(v) for v in doc)
    return 0


@FAST
@given(_json_docs(msgpack_scalars | arrays | st.binary(max_size=300) | st.text(min_size=30, max_size=300)
                  | st.lists(st.integers(-32, 127) | st.none() | st.just([]) | st.just({}), min_size=60,
                             max_size=200), 20))
def test_msgpack_counts_are_exact_before_decoding(doc):
    """The msgpack pre-count (pm_vector.protocol.msgpack_counts, issue #35 finding 11) refuses
    exactly the bodies over the bound, long lists of one-byte values counted at once included."""
    from pm_vector.protocol.msgpack_counts import over_containers

    body = codec.encode(doc, codec.MSGPACK)
    n = _lists_counted(doc)
    assert not over_containers(body, n)
    assert n == 0 or over_containers(body, n - 1)


@FAST
@given(_json_docs(st.none() | st.integers(-5, 5), 20))
def test_json_counts_never_refuse_what_the_bounds_allow(doc):
    """The JSON pre-count errs only on the side of refusing: a document within the bounds
    (counted exactly) passes it."""
    body = codec.encode(doc, codec.JSON)
    n_cont, n_val = _counts(doc)
    codec.decode(body, codec.JSON, max_containers=n_cont, max_values=max(1, n_val))


# ----------------------------------------------------------------------------- request types

def _query_request():
    from pm_vector.protocol.class_rows import ClassRowsRequest

    return ClassRowsRequest(rows=np.arange(6, dtype=float).reshape(3, 2), classes=[0, 1, 2], epsilon=1.0, delta=1e-6,
                        noise_scale=0.5, sigmas=[0.5, 0.5, 0.5], frames_digest="ab" * 16, shortlist=8)


def _cell_request():
    from pm_vector.protocol.cell_request import CellRequest

    return CellRequest(reports=[0, 3, 1], n_cells=4, epsilon=2.0, cells_digest="cd" * 16, shortlist=8)


@pytest.mark.parametrize("make", [_query_request, _cell_request])
def test_request_round_trip_through_both_media_types(make):
    req = make()
    for media in codec.MEDIA_TYPES:
        back = type(req).from_dict(codec.decode(codec.encode(req.to_dict(), media), media, arrays="lists"))
        assert back.to_dict().keys() == req.to_dict().keys()
        assert codec.encode(back.to_dict(), codec.JSON) == codec.encode(req.to_dict(), codec.JSON)


@FAST
@given(st.sampled_from([_query_request, _cell_request]), st.data())
def test_any_field_replaced_by_any_json_value_is_a_request_or_a_clean_refusal(make, data):
    req = make()
    d = req.to_dict()
    field = data.draw(st.sampled_from(sorted(d) + ["unknown_field"]))
    d[field] = data.draw(_json_docs(max_leaves=8))
    try:
        type(req).from_dict(d)
    except InvalidInputError:
        pass


# ----------------------------------------------------------------------------- payloads

payload_leaves = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats()
                  | st.text(max_size=10))


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


@FAST
@given(st.recursive(payload_leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=4), inner, max_size=3), max_leaves=40))
def test_a_payload_is_refused_or_stored_in_a_form_every_answer_carries(value):
    import json

    from pm_vector.db.store.payloads import MAX_PAYLOAD_DEPTH, payload_bytes, stored_form, stored_text

    try:
        size = payload_bytes(value)
    except InvalidInputError:
        return
    text = stored_text(value)
    assert size == (0 if value is None else len(text.encode("utf-8")))  # None: no payload
    stored = stored_form(value)
    assert _depth(stored) <= MAX_PAYLOAD_DEPTH
    assert json.loads(text) == stored
    answer = {"rows": [{"payloads": [stored]}]}  # how an answer nests it
    for media in codec.MEDIA_TYPES:
        assert codec.decode(codec.encode(answer, media), media) == answer


def test_deep_payloads_are_refused_at_the_bound():
    from pm_vector.db.store.payloads import MAX_PAYLOAD_DEPTH, payload_bytes

    v: object = 0
    for _ in range(MAX_PAYLOAD_DEPTH):
        v = {"a": v}
    payload_bytes(v)
    with pytest.raises(InvalidInputError, match="nests deeper"):
        payload_bytes([v])
