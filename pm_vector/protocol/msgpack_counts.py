"""The maps and lists of a msgpack body, counted before anything is decoded.

:func:`over_containers` is the msgpack half of what :func:`pm_vector.protocol.codec.json_counts` is
for JSON: it tells whether a body from a hostile peer holds more maps and lists than its bound,
before msgpack builds one Python object (:func:`pm_vector.protocol.codec.decode` then refuses it,
a :class:`~pm_vector.protocol.codec.TooLargeError`). Without
it, a 16 MiB answer of empty lists (``0xdd`` + a count + 16 million ``0x90`` bytes) was refused by
the decoder's hooks only after msgpack had built a million lists and a 16-million-slot list to hold
them: 5.3 s and +140 MB in the client (issue #35, finding 11).

How: first an upper bound in C (numpy): every map or list starts with one byte in ``0x80..0x9f``
or ``0xdc..0xdf``, so a body with no more such bytes than the bound is within it and is not walked.
Otherwise the body's structure is walked without decoding it: each element's size follows from its
first bytes (strings, binary data and extensions are stepped over by their declared length), and
a list or map whose children are all one-byte values (small integers, nil, booleans, empty strings,
lists and maps) is counted at once in C. The walk stops as soon as the count passes the bound. A
body it cannot walk (a malformed byte, a truncated length), or one whose lists of larger values
hold more than ``4 x max_containers`` values in all without a verdict, is left to the decoder, whose
hooks count its maps and lists as before (so the walk never costs more than about a second).
"""

from __future__ import annotations

import numpy as np

#: the walk stops deeper than this (msgpack's own decoder refuses nesting far shallower)
MAX_WALK_DEPTH = 1024
#: bytes that start a map or list (fixmap, fixarray, array 16/32, map 16/32)
_HEADER = np.zeros(256, dtype=bool)
_HEADER[0x80:0xA0] = True
_HEADER[0xDC:0xE0] = True
#: one-byte values: positive and negative fixints, empty fixmap / fixarray / fixstr, nil, booleans
_ONE_BYTE = np.zeros(256, dtype=bool)
_ONE_BYTE[0x00:0x80] = True
_ONE_BYTE[0xE0:0x100] = True
_ONE_BYTE[[0x80, 0x90, 0xA0, 0xC0, 0xC2, 0xC3]] = True
#: the same as the bytes ``bytes.translate`` deletes
_ONE_BYTE_VALUES = bytes(np.flatnonzero(_ONE_BYTE).astype(np.uint8))
#: a scalar's fixed size by its first byte (0: not a fixed-size scalar)
_FIXED = [0] * 256
for _t in list(range(0x00, 0x80)) + list(range(0xE0, 0x100)) + [0xC0, 0xC2, 0xC3]:
    _FIXED[_t] = 1
for _t, _n in {0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9,
               0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18}.items():
    _FIXED[_t] = _n
#: a sized value's (length field bytes, bytes before its data besides the length field)
_SIZED = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1), 0xD9: (1, 0),
          0xDA: (2, 0), 0xDB: (4, 0)}


#: bytes looked up at a time (the lookups' temporary arrays stay this small)
_CHUNK = 1 << 20


def _count(a: np.ndarray, table: np.ndarray) -> int:
    """How many bytes of ``a`` the boolean ``table`` marks, in chunks of :data:`_CHUNK`."""
    return sum(int(np.count_nonzero(table[a[i:i + _CHUNK]])) for i in range(0, a.size, _CHUNK))


def _empties(body: bytes, pos: int, c: int) -> int:
    """The empty lists and maps among ``body[pos:pos + c]`` if every one of those bytes is a one-byte
    value, else -1 (in chunks of :data:`_CHUNK`: no large copy)."""
    empties = 0
    for i in range(pos, pos + c, _CHUNK):
        kids = body[i:min(i + _CHUNK, pos + c)]
        if kids.translate(None, _ONE_BYTE_VALUES):
            return -1
        empties += kids.count(b"\x80") + kids.count(b"\x90")
    return empties


def over_containers(body: bytes, max_containers: int) -> bool:
    """Whether a msgpack ``body`` holds more than ``max_containers`` maps and lists, found without
    decoding it (module doc). False for a body it cannot walk (the decoder refuses that)."""
    a = np.frombuffer(body, dtype=np.uint8)
    if _count(a, _HEADER) <= max_containers:
        return False
    n, pos, containers, steps, budget = len(body), 0, 0, 0, 4 * max_containers + 4096
    left = [1]  # values still to read at each open level
    fixed, sized = _FIXED, _SIZED
    while left:
        k = left.pop()
        while k:  # the values of the current level
            k -= 1
            steps += 1
            if steps > budget:
                return False  # this much walking without a verdict: the decoder's own count takes over
            if pos >= n:
                return False  # truncated: the decoder says so
            t = body[pos]
            size = fixed[t]
            if size:
                pos += size
                continue
            if 0xA0 <= t <= 0xBF:  # fixstr
                pos += 1 + (t & 0x1F)
                continue
            if t in sized:
                w, extra = sized[t]
                pos += 1 + w + extra + int.from_bytes(body[pos + 1:pos + 1 + w], "big")
                continue
            if 0x80 <= t <= 0x9F:
                c, pos = t & 0x0F, pos + 1
            elif t == 0xDC or t == 0xDE:
                c, pos = int.from_bytes(body[pos + 1:pos + 3], "big"), pos + 3
            elif t == 0xDD or t == 0xDF:
                c, pos = int.from_bytes(body[pos + 1:pos + 5], "big"), pos + 5
            else:
                return False  # 0xc1, never used: the decoder refuses it
            if t <= 0x8F or t >= 0xDE:
                c *= 2  # a map: keys and values
            containers += 1
            if containers > max_containers:
                return True
            if c >= 8 and pos + c <= n:  # children that are all one-byte values: counted at once, in C
                empties = _empties(body, pos, c)
                if empties >= 0:
                    containers += empties
                    if containers > max_containers:
                        return True
                    pos += c
                    continue
            if c:
                if len(left) > MAX_WALK_DEPTH:
                    return False  # deeper than any decoder here accepts: msgpack refuses it
                left.append(k)  # back to this level after the child's values
                k = c
    return False
