"""PostgreSQL binary COPY of fixed-width rows, encoded and decoded with numpy (no per-row Python).

Used for the embedding tables (``bigint``/``integer`` key + ``vector(k)``) and for reading
items back (``bigint, bigint, vector(d)``). pgvector's binary format of ``vector`` is
``uint16 dim, uint16 unused, float4[dim]`` big-endian; ``halfvec`` the same with ``float2``.
"""

from __future__ import annotations

import numpy as np
from psycopg import sql

SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
TRAILER = b"\xff\xff"

_INT = {"int8": ">i8", "int4": ">i4"}
_VEC = {"vector": ">f4", "halfvec": ">f2"}
#: float8 scalars; "float8[]" / "int8[]" are 1-d arrays of ``dim`` elements (no NULLs): fixed width too
_FLOAT = {"float8": ">f8"}
_FLOAT8_OID = 701
_ARRAY = {"float8[]": (">f8", _FLOAT8_OID), "int8[]": (">i8", 20)}
_ARR_HEADER = 5 * 4  # ndim, has-null flag, element oid, length, lower bound
#: ``bytea`` of exactly ``dim`` bytes (fixed width: the items' product codes)
_BYTES = {"bytea": "u1"}


def _row_dtype(columns: list[tuple[str, str, int]]) -> np.dtype:
    """columns: (name, kind, dim) with kind in int8/int4/vector/halfvec/bytea (dim only for vectors and bytea)."""
    fields: list[tuple] = [("_nfields", ">i2")]
    for name, kind, dim in columns:
        fields.append((f"_len_{name}", ">i4"))
        if kind in _INT:
            fields.append((name, _INT[kind]))
        elif kind in _FLOAT:
            fields.append((name, _FLOAT[kind]))
        elif kind in _ARRAY:
            fields += [(f"_arr_{name}", ">i4", (5,)), (f"_elen_{name}", [("l", ">i4"), ("v", _ARRAY[kind][0])], (dim,))]
        elif kind in _VEC:
            fields += [(f"_dim_{name}", ">u2"), (f"_unused_{name}", ">u2"), (name, _VEC[kind], (dim,))]
        elif kind in _BYTES:
            fields.append((name, _BYTES[kind], (dim,)))
        else:  # pragma: no cover - programming error
            raise ValueError(kind)
    return np.dtype(fields)


def _field_len(kind: str, dim: int) -> int:
    if kind in _INT:
        return np.dtype(_INT[kind]).itemsize
    if kind in _FLOAT:
        return 8
    if kind in _ARRAY:
        return _ARR_HEADER + 12 * dim
    if kind in _BYTES:
        return dim
    return 4 + np.dtype(_VEC[kind]).itemsize * dim


def encode(columns: list[tuple[str, str, int]], data: dict[str, np.ndarray], with_header: bool = True) -> bytes:
    """Binary COPY stream (signature, rows, trailer) for the given columns and arrays."""
    dtype = _row_dtype(columns)
    n = len(next(iter(data.values())))
    rows = np.empty(n, dtype=dtype)
    rows["_nfields"] = len(columns)
    for name, kind, dim in columns:
        rows[f"_len_{name}"] = _field_len(kind, dim)
        if kind in _VEC:
            rows[f"_dim_{name}"] = dim
            rows[f"_unused_{name}"] = 0
        if kind in _ARRAY:
            rows[f"_arr_{name}"] = (1, 0, _ARRAY[kind][1], dim, 1)
            rows[f"_elen_{name}"]["l"] = 8
            rows[f"_elen_{name}"]["v"] = data[name]
            continue
        rows[name] = data[name]
    body = rows.tobytes()
    return SIGNATURE + body + TRAILER if with_header else body


def decode(columns: list[tuple[str, str, int]], buf: bytes) -> dict[str, np.ndarray]:
    """Arrays from a binary COPY TO stream of non-NULL fixed-width rows of these columns."""
    if not buf.startswith(SIGNATURE[:11]):
        raise ValueError("not a PostgreSQL binary COPY stream")
    ext = int.from_bytes(buf[15:19], "big")
    start = 19 + ext
    if not buf.endswith(TRAILER):
        raise ValueError("binary COPY stream without trailer")
    body = memoryview(buf)[start:len(buf) - 2]
    return _columns(columns, _rows(columns, body))


def _rows(columns: list[tuple[str, str, int]], body) -> np.ndarray:
    """The checked structured rows of a body of whole rows (no signature, no trailer)."""
    dtype = _row_dtype(columns)
    if len(body) % dtype.itemsize:
        raise ValueError("binary COPY rows are not of the expected width (NULLs or another dimension?)")
    rows = np.frombuffer(body, dtype=dtype)
    if rows.size:
        if np.any(rows["_nfields"] != len(columns)):
            raise ValueError("unexpected field count in binary COPY stream")
        for name, kind, dim in columns:
            if np.any(rows[f"_len_{name}"] != _field_len(kind, dim)):
                raise ValueError(f"column {name}: unexpected field width (NULL or wrong dimension)")
    return rows


def _columns(columns: list[tuple[str, str, int]], rows: np.ndarray) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, kind, dim in columns:
        if kind in _ARRAY:
            out[name] = rows[f"_elen_{name}"]["v"].astype(np.float64 if kind == "float8[]" else np.int64)
            continue
        a = rows[name]
        if kind in _BYTES:
            out[name] = np.ascontiguousarray(a, dtype=np.uint8)
            continue
        out[name] = a.astype(np.int64) if kind in _INT else a.astype(np.float64 if kind in _FLOAT else np.float32)
    return out


def _copy_to_stdout(query: str | sql.Composable) -> sql.Composed:
    """``COPY (query) TO STDOUT (FORMAT BINARY)``, built from parts (``query``: a composed statement,
    or a statement's constant text)."""
    return sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(
        query if isinstance(query, sql.Composable) else sql.SQL(query))


def copy_out(conn, query: str | sql.Composable, params=None) -> bytes:
    """Run ``COPY (query) TO STDOUT (FORMAT BINARY)`` on a psycopg connection; return the stream."""
    chunks: list[bytes] = []
    with conn.cursor() as cur:
        with cur.copy(_copy_to_stdout(query), params) as cp:
            for data in cp:
                chunks.append(bytes(data))
    return b"".join(chunks)


def copy_out_columns(conn, query: str | sql.Composable, columns: list[tuple[str, str, int]], n_rows: int,
                     params=None, block: int = 1 << 22) -> dict[str, np.ndarray]:
    """:func:`decode` of ``COPY (query) TO STDOUT (FORMAT BINARY)``, streamed: the rows are decoded
    as they arrive (``block`` bytes at a time) into arrays of ``n_rows`` rows allocated once (grown, by doubling, only if the
    query returns more), so the stream itself is never held whole. Returns the arrays of the rows
    received, as :func:`decode` gives them (vectors float32)."""
    dtype = _row_dtype(columns)
    w = dtype.itemsize
    cap = max(int(n_rows), 1)
    out: dict[str, np.ndarray] = {}
    n = 0
    carry = b""
    header_done = False

    def put(body) -> None:
        nonlocal n, cap, out
        rows = _rows(columns, body)
        part = _columns(columns, rows)
        if not out:
            out = {k: np.empty((cap,) + v.shape[1:], v.dtype) for k, v in part.items()}
        m = rows.shape[0]
        if n + m > cap:
            cap = max(2 * cap, n + m)
            out = {k: np.concatenate([v[:n], np.empty((cap - n,) + v.shape[1:], v.dtype)]) for k, v in out.items()}
        for k, v in part.items():
            out[k][n:n + m] = v
        n += m

    with conn.cursor() as cur:
        with cur.copy(_copy_to_stdout(query), params) as cp:
            pending: list[bytes] = []
            size = 0
            for data in cp:
                pending.append(bytes(data))
                size += len(data)
                if size < block:
                    continue
                buf = carry + b"".join(pending)
                pending, size = [], 0
                if not header_done:
                    if len(buf) < 19:
                        carry = buf
                        continue
                    if not buf.startswith(SIGNATURE[:11]):
                        raise ValueError("not a PostgreSQL binary COPY stream")
                    start = 19 + int.from_bytes(buf[15:19], "big")
                    if len(buf) < start:
                        carry = buf
                        continue
                    buf = buf[start:]
                    header_done = True
                whole = (len(buf) // w) * w
                if whole:
                    put(memoryview(buf)[:whole])
                carry = buf[whole:]
            buf = carry + b"".join(pending)
            if not header_done and buf.startswith(SIGNATURE[:11]) and len(buf) >= 19:
                buf = buf[19 + int.from_bytes(buf[15:19], "big"):]
                header_done = True
            whole = (max(len(buf) - 2, 0) // w) * w
            if header_done and whole:
                put(memoryview(buf)[:whole])
            carry = buf[whole:]
    if not header_done or carry != TRAILER:
        raise ValueError("binary COPY stream without trailer (or rows of another width)")
    if not out:  # no rows: the arrays decode() gives for an empty stream
        return decode(columns, SIGNATURE + TRAILER)
    return {k: v[:n] for k, v in out.items()}


def copy_options(frozen: bool = False) -> sql.SQL:
    """The options of a binary COPY: ``(FORMAT BINARY)``, and with ``frozen`` ``FREEZE``.

    A frozen COPY writes its rows frozen and visible to all, and marks the pages it began empty so in
    the visibility map (it writes 1,000 rows at a time: of a narrow table's pages about a quarter are
    begun by the thousand before and left to vacuum): no first reader and, but for those pages, no
    vacuum writes the table again. With data checksums (PostgreSQL 18's
    default) each such later write logs the whole page in the WAL, that every commit of the server
    then waits behind: a run's locations table at 100,000 items took 400 MB of WAL to write and 295
    MB more when vacuumed after a checkpoint, frozen none. PostgreSQL allows it on a table created
    (or truncated) in the caller's transaction, which then holds every batch: a writer given
    ``frozen`` does not commit between them, its caller commits once the table is full."""
    return sql.SQL("(FORMAT BINARY, FREEZE)" if frozen else "(FORMAT BINARY)")


def copy_in(conn, statement: str | sql.Composable, stream: bytes, chunk: int = 1 << 20) -> None:
    """Send a complete binary COPY stream to ``COPY ... FROM STDIN (FORMAT BINARY)``."""
    with conn.cursor() as cur:
        with cur.copy(statement) as cp:
            mv = memoryview(stream)
            for i in range(0, len(mv), chunk):
                cp.write(mv[i:i + chunk])


_NULL = b"\xff\xff\xff\xff"


def encode_with_tail(columns: list[tuple[str, str, int]], data: dict[str, np.ndarray],
                     tails: list[list[bytes | None]] | None) -> bytes:
    """Binary COPY stream whose rows are the fixed-width ``columns`` followed by variable-length
    fields given already encoded (``tails[f][i]``: the field's bytes for row i, or None for NULL).

    The fixed part is built by numpy; only the variable fields cost a little Python per row.
    """
    n_tail = len(tails) if tails else 0
    dtype = _row_dtype(columns)
    n = len(next(iter(data.values())))
    rows = np.empty(n, dtype=dtype)
    rows["_nfields"] = len(columns) + n_tail
    for name, kind, dim in columns:
        rows[f"_len_{name}"] = _field_len(kind, dim)
        if kind in _VEC:
            rows[f"_dim_{name}"] = dim
            rows[f"_unused_{name}"] = 0
        if kind in _ARRAY:
            rows[f"_arr_{name}"] = (1, 0, _ARRAY[kind][1], dim, 1)
            rows[f"_elen_{name}"]["l"] = 8
            rows[f"_elen_{name}"]["v"] = data[name]
            continue
        rows[name] = data[name]
    if not n_tail:
        return SIGNATURE + rows.tobytes() + TRAILER
    fixed = rows.tobytes()
    w = dtype.itemsize

    def field(b: bytes | None) -> bytes:
        return _NULL if b is None else len(b).to_bytes(4, "big") + b

    parts: list[bytes] = [SIGNATURE]
    encoded_tails = [[field(b) for b in t] for t in tails]  # type: ignore[union-attr]
    for i in range(n):
        parts.append(fixed[i * w:(i + 1) * w])
        for t in encoded_tails:
            parts.append(t[i])
    parts.append(TRAILER)
    return b"".join(parts)


def binary_array(values: np.ndarray, kind: str) -> bytes:
    """A 1-d ``bigint[]`` ("int8") or ``float8[]`` ("float8") value in binary COPY form."""
    oid, fmt = {"int8": (20, ">i8"), "float8": (701, ">f8")}[kind]
    n = int(values.size)
    if n == 0:
        return (0).to_bytes(4, "big") + (0).to_bytes(4, "big") + oid.to_bytes(4, "big")
    body = np.empty(n, dtype=[("l", ">i4"), ("v", fmt)])
    body["l"] = 8
    body["v"] = values
    return np.array([1, 0, oid, n, 1], dtype=">i4").tobytes() + body.tobytes()
