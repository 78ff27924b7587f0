"""One connection setup: :func:`configure`, applied once to every psycopg connection pm_vector
opens (:func:`pm_vector.db.postgres.engine.connect`, the SQLAlchemy engines' connections, and the
service's pools, :class:`pm_vector.service.db.ServicePool`).

As pgvector-python does, the types are registered once per connection: ``vector`` and
``halfvec`` (numpy arrays and :class:`pgvector.Vector` / ``HalfVector`` in and out), ``json`` /
``jsonb`` read by :func:`json_loads` (orjson when installed: faster than the standard library,
the same values), and :class:`Int8Array` parameters sent as a binary ``bigint[]``. Calling it
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
    """int64 ids (a numpy array) sent as a binary ``bigint[]`` built by numpy (psycopg's list
    dumper makes a Python int per id); a connection :func:`configure` set up dumps it."""

    def __init__(self, values):
        self.values = values

    def binary(self) -> bytes:
        n = int(self.values.size)
        body = np.empty(n, dtype=[("len", ">i4"), ("v", ">i8")])
        body["len"] = 8
        body["v"] = self.values
        return np.array([1, 0, 20, n, 1], dtype=">i4").tobytes() + body.tobytes()  # 1-d, no NULLs, int8


def _int8_array_dumper():
    class Int8ArrayDumper(Dumper):
        format = Format.BINARY
        oid = 1016  # bigint[]

        def dump(self, obj):
            return obj.binary()

    return Int8ArrayDumper


def configure(conn) -> None:
    """Set ``conn`` (a psycopg connection) up for pm_vector, once: pgvector's types registered,
    JSON read by :func:`json_loads`, :class:`Int8Array` dumped in binary (module doc). A
    connection that was idle is left idle (the type look-ups' transaction is committed, as a
    pool's ``configure`` must); one inside a transaction stays in it. Idempotent."""
    if getattr(conn, "_pm_configured", False):
        return

    idle = conn.info.transaction_status == TransactionStatus.IDLE
    register_vector(conn)
    set_json_loads(json_loads, conn)
    conn.adapters.register_dumper(Int8Array, _int8_array_dumper())
    if idle and not conn.autocommit:
        conn.commit()
    conn._pm_configured = True
