"""The wire format (pm_vector.protocol.codec): the documented msgpack layout byte for byte, the
compact forms of ids and codes, JSON's equivalents, and strict, bounded decoding of hostile bodies."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest

from pm_vector.errors import InvalidInputError
from pm_vector.protocol import codec
from pm_vector.protocol.codec import JSON, MSGPACK, TooLargeError, decode, encode


def _ext(code: int, data: bytes) -> bytes:
    return msgpack.packb(msgpack.ExtType(code, data))


def _array(dtype_code: int, shape, data: bytes) -> bytes:
    return struct.pack(f"<BB{len(shape)}I", dtype_code, len(shape), *shape) + data


def test_array_layout_byte_for_byte():
    """The module doc's layout: ext type 1, dtype code, ndim, uint32 LE shape, LE data."""
    body = encode({"a": np.array([[1.5, -2.0]], dtype=">f4")}, MSGPACK)  # big-endian input travels LE
    data = _array(5, (1, 2), np.array([1.5, -2.0], "<f4").tobytes())
    assert body == b"\x81\xa1a" + b"\xc7" + bytes([len(data), 1]) + data
    back = decode(body, MSGPACK)["a"]
    assert back.dtype == np.float32 and back.shape == (1, 2) and back.tolist() == [[1.5, -2.0]]
    assert back.flags.writeable


def test_ids_travel_as_uint32_and_codes_as_one_blob():
    """A compact answer's row: k' ids in 4 bytes each (int64 in memory), a (k', b) uint8 block of
    codes as k' * b bytes; each with a fixed 2 + 4 * ndim byte header and the ext's own 2-6 bytes."""
    kp, b = 64, 32
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 2 ** 32, kp, dtype=np.int64)
    codes = rng.integers(0, 256, (kp, b), dtype=np.uint8)
    one = encode(ids, MSGPACK)
    assert len(one) == 4 + (2 + 4) + 4 * kp  # ext16 (type + 2-byte length) + array header + data
    assert len(encode(codes, MSGPACK)) == 4 + (2 + 8) + kp * b  # ext16: 2-byte length
    row = decode(encode({"item_ids": ids, "codes": codes}, MSGPACK), MSGPACK)
    assert row["item_ids"].dtype == np.uint32 and row["item_ids"].tolist() == ids.tolist()
    assert row["codes"].dtype == np.uint8 and np.array_equal(row["codes"], codes)
    # values beyond uint32 keep 8 bytes; negatives that fit travel as int32
    assert decode(encode(np.array([2 ** 40, 1]), MSGPACK), MSGPACK).dtype == np.int64
    assert decode(encode(np.array([-5, 7]), MSGPACK), MSGPACK).tolist() == [-5, 7]
    with pytest.raises(TypeError):
        encode(np.array([2 ** 64 - 1], dtype=np.uint64), MSGPACK)


@pytest.mark.parametrize("dtype", ["u1", "u2", "u4", "i2", "i4", "f2", "f4", "f8"])
def test_every_dtype_round_trips(dtype):
    a = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    back = decode(encode({"x": a}, MSGPACK), MSGPACK)["x"]
    assert back.dtype == np.dtype(dtype) and np.array_equal(back, a)


def test_json_equivalents():
    doc = {"f": np.array([0.5, np.nan], np.float32), "b": b"\x00\xff", 3: np.int64(4), "t": (1, 2),
           "z": np.array(2.5), "flag": np.bool_(True)}
    assert decode(encode(doc, JSON)) == {"f": [0.5, None], "b": "AP8=", "3": 4, "t": [1, 2], "z": 2.5, "flag": True}
    back = decode(encode(doc, MSGPACK), MSGPACK)
    assert back["b"] == b"\x00\xff" and back["3"] == 4 and back["z"] == 2.5 and back["flag"] is True
    assert decode(encode(doc, MSGPACK), MSGPACK, arrays="lists")["f"][0] == 0.5
    with pytest.raises(TypeError):
        encode({"s": np.array(["a"])}, MSGPACK)
    with pytest.raises(TypeError):
        encode({"o": object()}, JSON)


VALID = encode({"request": {"rows": np.random.default_rng(1).standard_normal((10, 8)), "classes": list(range(10)),
                            "epsilon": 1.0, "format": "x"}, "k": 8}, MSGPACK)

BAD = {
    "truncated": (VALID[: len(VALID) // 2], "not valid msgpack"),
    "trailing_bytes": (VALID + b"\x00", "not valid msgpack"),
    "ext_type_2": (_ext(2, _array(5, (1,), b"\x00" * 4)), "extension type 2"),
    "timestamp_ext": (msgpack.packb(msgpack.Timestamp(1, 0)), "Timestamp"),
    "unknown_dtype": (_ext(1, _array(42, (1,), b"\x00")), "dtype code 42"),
    "ext_too_short": (_ext(1, b"\x05"), "truncated"),
    "shape_truncated": (_ext(1, b"\x05\x02\x01\x00"), "shape is truncated"),
    "ndim_zero": (_ext(1, b"\x05\x00"), "0 dimensions"),
    "ndim_nine": (_ext(1, _array(1, (1,) * 9, b"\x00")), "9 dimensions"),
    "data_short": (_ext(1, _array(5, (2, 3), b"\x00" * 20)), "does not match"),
    "data_long": (_ext(1, _array(5, (2, 3), b"\x00" * 28)), "does not match"),
    "shape_overflow": (_ext(1, _array(6, (2 ** 32 - 1,) * 8, b"")), "does not match"),
    "declared_array_4g": (b"\xdd\xff\xff\xff\xff" + b"\xc0" * 16, "not valid msgpack"),
    "declared_map_4g": (b"\xdf\xff\xff\xff\xff" + b"\xc0" * 16, "not valid msgpack"),
    "declared_bin_4g": (b"\xc6\xff\xff\xff\xff" + b"\x00" * 16, "not valid msgpack"),
    "declared_str_4g": (b"\xdb\xff\xff\xff\xff" + b"a" * 16, "not valid msgpack"),
    "declared_ext_4g": (b"\xc9\xff\xff\xff\xff\x01" + b"\x00" * 16, "not valid msgpack"),
    "nesting_33": (b"\x91" * 33 + b"\x00", "deeper than 32"),
    "nesting_100k": (b"\x91" * 100_000 + b"\x00", "deeper than 32"),
    "int_key": (msgpack.packb({1: 2}), "not valid msgpack"),
    "bytes_key": (msgpack.packb({b"k": 2}, use_bin_type=True), "not a string"),
    "invalid_utf8": (b"\xa2\xff\xfe", "not valid msgpack"),
    "reserved_byte": (b"\xc1", "not valid msgpack"),
    "empty": (b"", "empty"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_msgpack_is_a_clean_error(case):
    body, needle = BAD[case]
    with pytest.raises(InvalidInputError, match=needle):
        decode(body, MSGPACK)


def test_bounds():
    big = _ext(1, _array(1, (1000, 1000), b"\x00" * 10 ** 6))
    assert decode(big, MSGPACK).shape == (1000, 1000)
    with pytest.raises(TooLargeError, match="1,000,000 elements"):
        decode(big, MSGPACK, max_elements=999_999)
    with pytest.raises(TooLargeError, match="elements"):  # refused from the header, before the data is checked
        decode(_ext(1, _array(6, (2 ** 32 - 1,) * 8, b"")), MSGPACK, max_elements=10 ** 6)
    with pytest.raises(TooLargeError, match="bytes"):
        decode(big, MSGPACK, max_bytes=len(big) - 1)
    with pytest.raises(InvalidInputError, match="3 dimensions"):
        decode(_ext(1, _array(1, (1, 1, 1), b"\x00")), MSGPACK, max_ndim=2)
    with pytest.raises(InvalidInputError, match="binary"):
        decode(msgpack.packb({"a": b"x"}, use_bin_type=True), MSGPACK, allow_binary=False)
    deep = {"a": [[[np.zeros((2, 2))]]]}
    with pytest.raises(InvalidInputError, match="deeper than 5"):  # an array's dimensions count as levels
        decode(encode(deep, MSGPACK), MSGPACK, max_depth=5)
    assert decode(encode(deep, MSGPACK), MSGPACK, max_depth=6)["a"][0][0][0].shape == (2, 2)
    with pytest.raises(InvalidInputError, match="deeper"):
        decode(b"[" * 40 + b"]" * 40, JSON)
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        decode(b"[NaN]", JSON)


def test_every_prefix_and_random_corruption_is_clean():
    """Any prefix of a valid body, and random byte flips in it, decode or raise InvalidInputError:
    never another exception."""
    for n in range(len(VALID)):
        with pytest.raises(InvalidInputError):
            decode(VALID[:n], MSGPACK)
    rng = np.random.default_rng(7)
    odd = 0
    for _ in range(3000):
        b = bytearray(VALID)
        for i in rng.integers(0, len(b), int(rng.integers(1, 4))):
            b[i] = int(rng.integers(0, 256))
        try:
            decode(bytes(b), MSGPACK, max_elements=10_000)
        except InvalidInputError:
            odd += 1
    assert odd > 0

