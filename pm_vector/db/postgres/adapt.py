"""One connection setup: :func:`configure`, applied once to every psycopg connection pm_vector
opens (:func:`pm_vector.db.postgres.engine.connect`, the SQLAlchemy engines' connections, and the
service's pools, :class:`pm_vector.service.db.ServicePool`).

As pgvector-python does, the types are registered once per connection: ``vector`` and
``halfvec`` (numpy arrays and :class:`pgvector.Vector` / ``HalfVector`` in and out), ``json`` /
``jsonb`` read by :func:`json_loads` (orjson when installed: faster than the standard library,
the same values), and :class:`Int8Array`, :class:`Int4Array` and :class:`Float8Array` parameters
sent as binary ``bigint[]``, ``integer[]`` and ``float8[]``. Calling it
again on the same connection costs an attribute look-up, so a path that may receive a
connection from elsewhere (a resolve) calls it without asking.
"""

from __future__ import annotations

import json

import numpy as np
from pgvector.psycopg import register_vector
from psycopg.adapt import Dumper
from psycopg.pq import Format, TransactionStatus
from psycopg.types.json import set_json_loads
import orjson


def json_loads(text: str | bytes):
    """JSON text -> Python objects: orjson (faster on a request's thousands of floats; measured in
    docs/benchmarks.md, "Figures behind design choices in the code"); NaN/Infinity tokens (which orjson
    refuses as invalid JSON) go to the standard library, so that they get the precise error."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


class Int8Array:
    """int64 values (a numpy array) sent as a binary ``bigint[]`` built by numpy (psycopg's list
    dumper makes a Python object per value and writes its text: at 6,660 entries a sync batch's
    delta entries spent more time there than in their insert); a connection :func:`configure` set
    up dumps it. :class:`Int4Array` and :class:`Float8Array` send ``integer[]`` and ``float8[]``
    alike (a float8 exactly: its IEEE bits)."""

    #: (the elements' numpy type, big-endian; their type's oid; the array type's oid)
    _kind = (">i8", 20, 1016)

    def __init__(self, values):
        self.values = values

    def binary(self) -> bytes:
        dtype, elem, _ = self._kind
        v = np.asarray(self.values).reshape(-1)
        width = np.dtype(dtype).itemsize
        body = np.empty(v.size, dtype=[("len", ">i4"), ("v", dtype)])
        body["len"] = width
        body["v"] = v
        return np.array([1, 0, elem, v.size, 1], dtype=">i4").tobytes() + body.tobytes()  # 1-d, no NULLs


class Int4Array(Int8Array):
    """int32 values sent as a binary ``integer[]`` (:class:`Int8Array`); a value outside int32 is an
    error, not a wrapped number."""

    _kind = (">i4", 23, 1007)

    def __init__(self, values):
        v = np.asarray(values).reshape(-1)
        if v.size and (v.min() < -(1 << 31) or v.max() >= 1 << 31):
            raise OverflowError("a value does not fit an integer (int4) array")
        super().__init__(v)


class Float8Array(Int8Array):
    """float64 values sent as a binary ``float8[]`` (:class:`Int8Array`)."""

    _kind = (">f8", 701, 1022)


def _array_dumper(cls):
    class ArrayDumper(Dumper):
        format = Format.BINARY
        oid = cls._kind[2]

        def dump(self, obj):
            return obj.binary()

    return ArrayDumper


def configure(conn) -> None:
    """Set ``conn`` (a psycopg connection) up for pm_vector, once: pgvector's types registered,
    JSON read by :func:`json_loads`, the arrays dumped in binary (module doc). A
    connection that was idle is left idle (the type look-ups' transaction is committed, as a
    pool's ``configure`` must); one inside a transaction stays in it. Idempotent."""
    if getattr(conn, "_pm_configured", False):
        return

    idle = conn.info.transaction_status == TransactionStatus.IDLE
    register_vector(conn)
    set_json_loads(json_loads, conn)
    for cls in (Int8Array, Int4Array, Float8Array):
        conn.adapters.register_dumper(cls, _array_dumper(cls))
    if idle and not conn.autocommit:
        conn.commit()
    conn._pm_configured = True
