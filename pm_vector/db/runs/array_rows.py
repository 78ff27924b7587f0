"""Rows of parallel arrays -- ``item_ids bigint[]``, ``hubs float8[]``, ``chubs float8[]`` behind a
few integer key columns -- read and written as numpy arrays: the cells table
(:mod:`pm_vector.db.runs.cell_data`, keys ``level, label, cell``) and the location rows
(:mod:`pm_vector.db.runs.locations`, keys ``level, cell``).

Their rows are long (a location row of a coarse level holds up to 65,536 entries), so an edit that
touches a few entries of many rows must neither unnest them in SQL nor turn them into Python
lists: :func:`read` fetches the arrays in PostgreSQL's binary form (``array_send``) and parses them
with numpy, :func:`write` replaces the rows by one ``DELETE`` and one binary ``COPY``. Both run in
the caller's transaction and also serve a shard's table through its foreign table.

:func:`deferred` holds the rows read and written inside it in memory and writes each changed row
once, at its end: a sync batch erases items and places new ones, and both touch most rows of the
location table (an erasure of 60 items at 100,000 items touched 90 % of its entries), so the
batch reads and writes them once instead of twice. Inside it, a reader also gives ``match``, the
``where`` condition in Python, for the rows already held; once every row of a table is held (a
read of ``"true"``, or the rows :mod:`pm_vector.db.runs.row_cache` kept from the process's batch
before, :func:`seed`), such a read reads nothing.

The job stores the three arrays uncompressed (:func:`store_uncompressed`, ``STORAGE EXTERNAL``:
still out of line, not compressed): PostgreSQL's pglz compression made rewriting rows about 7 times
slower (1.8 s against 0.26 s for 31 location rows of 1.44 million entries at 100,000 items), for
about a third less space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from psycopg import sql

from .. import _binary
from .deferral import Deferral

_EMPTY = {"int8": np.zeros(0, np.int64), "float8": np.zeros(0, np.float64)}


@dataclass
class ArrayRow:
    """One row: its key values (in the table's key order) and its three arrays (positions match)."""

    key: tuple
    item_ids: np.ndarray  # int64
    hubs: np.ndarray  # float64
    chubs: np.ndarray  # float64


def _sql(part: str | sql.Composable) -> sql.Composable:
    """A condition or a join clause: composed, or the code's own constant text."""
    return part if isinstance(part, sql.Composable) else sql.SQL(part)


def store_uncompressed(conn, table: sql.Composable) -> None:
    """Store the three arrays of ``table`` (empty, just created) out of line without compression."""
    conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN item_ids SET STORAGE EXTERNAL, ALTER COLUMN hubs SET STORAGE "
                         "EXTERNAL, ALTER COLUMN chubs SET STORAGE EXTERNAL").format(table))


def member(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Which of ``ids`` are in ``wanted`` (sorted, unique; small against the rows)."""
    if not wanted.size or not ids.size:
        return np.zeros(ids.shape, bool)
    p = np.searchsorted(wanted, ids)
    p[p == wanted.size] = 0
    return wanted[p] == ids


def unsend(b: bytes, kind: str) -> np.ndarray:
    """A 1-d ``bigint[]`` ("int8") or ``float8[]`` ("float8") from its ``array_send`` bytes (no NULLs)."""
    if int.from_bytes(b[0:4], "big") == 0:  # (no dimension: empty)
        return _EMPTY[kind].copy()
    return unsend_records(b[20:20 + 12 * int.from_bytes(b[12:16], "big")], kind)


def unsend_records(b: bytes, kind: str) -> np.ndarray:
    """A 1-d ``bigint[]`` ("int8") or ``float8[]`` ("float8") from its elements' records: ``array_send``
    bytes less their 20-byte header (a 1-d array's; an empty array's 12 give none), of one array or of
    several joined (no NULLs)."""
    body = np.frombuffer(b, dtype=[("l", ">i4"), ("v", ">i8" if kind == "int8" else ">f8")])
    return body["v"].astype(np.int64 if kind == "int8" else np.float64)


def deferred(conn):
    """Inside: rows are held in memory once read, writes change the held rows; at the end (no
    exception) each table's changed rows are written once. Nested uses join the outer one.
    Held per connection: table -> {"rows": key -> row, "dirty": keys, "keys": spec}."""
    return _held.hold(conn)


def _session(conn, table: sql.Composable) -> dict:
    return _held.held(conn).setdefault(table, {"rows": {}, "dirty": set(), "keys": None, "complete": False})


def seed(conn, table: sql.Composable, rows: dict, complete: bool) -> None:
    """Inside :func:`deferred`: hold ``rows`` (key -> :class:`ArrayRow`, as the table holds them now) as if
    read; ``complete``: they are every row of the table (:mod:`pm_vector.db.runs.row_cache`)."""
    sess = _session(conn, table)
    sess["rows"].update(rows)
    sess["complete"] = bool(complete)


def held(conn, table: sql.Composable) -> tuple[dict, bool] | None:
    """Inside :func:`deferred`: the rows held for ``table`` (key -> row) and whether they are every row of
    it, or None."""
    sess = (_held.held(conn) or {}).get(table)
    return None if sess is None else (sess["rows"], bool(sess.get("complete")))


def flush(conn, table: sql.Composable | None = None) -> None:
    """Write the changed rows held for ``conn`` (of ``table``, or of every table)."""
    for t, sess in (_held.held(conn) or {}).items():
        if (table is None or t == table) and sess["dirty"]:
            _write(conn, t, sess["keys"], [sess["rows"][k] for k in sorted(sess["dirty"])])
            sess["dirty"] = set()


def read(conn, table: sql.Composable, keys: tuple[str, ...], where: str | sql.Composable, params=None,
         lock: bool = False, match: Callable[[ArrayRow], bool] | None = None, join: str | sql.Composable = "",
         join_params=None) -> list[ArrayRow]:
    """The rows of ``table`` that ``where`` selects (an SQL condition on ``table``'s columns, with
    ``params``), ``FOR UPDATE`` when ``lock``. ``join``: an SQL join clause after ``table`` (with
    ``join_params``; its columns must not be named as ``table``'s) that ``where`` may use, e.g. a
    small array of ids per key to test ``item_ids &&`` against: PostgreSQL's ``&&`` compares every
    entry with every id given, so a row tested against only its own key's few ids costs far less
    than against all of them. Inside :func:`deferred`, the rows already held that ``match`` accepts
    and the others read (without ``match``, the held rows are written first and read again). In key
    order, wherever each row came from: what a caller derives from several rows never depends on
    which were held."""
    sess = (_held.held(conn) or {}).get(table)
    if sess is not None and match is None:
        flush(conn, table)
        sess["rows"].clear()
        sess["complete"] = False
    held = list(sess["rows"].values()) if sess is not None else []
    if sess is not None and sess.get("complete"):  # every row of the table is held: nothing to read
        return sorted((r for r in held if match(r)), key=_by_key)
    if held:
        k = np.array([r.key for r in held], dtype=np.int64).reshape(len(held), -1)
        whole = False
        where = sql.SQL("({}) AND ({}) NOT IN (SELECT * FROM unnest({}))").format(
            _sql(where), sql.SQL(", ").join(map(sql.Identifier, keys)),
            sql.SQL(", ").join([sql.SQL("%s::bigint[]")] * len(keys)))
        params = list(params or []) + [k[:, j].tolist() for j in range(len(keys))]
    else:
        whole = isinstance(where, str) and where.strip() == "true" and not join  # (with the held rows: the whole table)
    got = _read(conn, table, keys, where, list(join_params or []) + list(params or []), lock, join)
    if _held.held(conn) is not None and sess is None:
        sess = _session(conn, table)
    if sess is not None:
        for r in got:
            sess["rows"][r.key] = r
        sess["complete"] = sess.get("complete") or whole
    return sorted([r for r in held if match(r)] + got, key=_by_key)


def _by_key(r: ArrayRow) -> tuple:
    return r.key


def _read(conn, table: sql.Composable, keys: tuple[str, ...], where: str | sql.Composable, params, lock: bool,
          join: str | sql.Composable = "") -> list[ArrayRow]:
    cols = sql.SQL(", ").join(sql.SQL("{}.{}").format(table, sql.Identifier(k)) for k in keys)
    q = sql.SQL("SELECT {cols}, array_send({t}.item_ids), array_send({t}.hubs), array_send({t}.chubs) "
                "FROM {t} {join} WHERE {where}{lock}").format(
        cols=cols, t=table, join=_sql(join), where=_sql(where),
        lock=sql.SQL(" FOR UPDATE OF {}").format(getattr(table, "relname", table)) if lock else sql.SQL(""))
    out = []
    with conn.cursor(binary=True) as cur:
        for r in cur.execute(q, params).fetchall():
            k = len(keys)
            out.append(ArrayRow(tuple(int(v) for v in r[:k]), unsend(r[k], "int8"), unsend(r[k + 1], "float8"),
                                unsend(r[k + 2], "float8")))
    return out


def write(conn, table: sql.Composable, keys: tuple[tuple[str, str], ...], rows: list[ArrayRow]) -> None:
    """Replace the rows of these keys by ``rows`` (``keys``: each key column's name and binary kind,
    "int4" or "int8"): one ``DELETE`` by key, one binary ``COPY`` (inside :func:`deferred`: at its end)."""
    if not rows:
        return
    if _held.held(conn) is not None:
        sess = _session(conn, table)
        sess["keys"] = keys
        for r in rows:
            sess["rows"][r.key] = r
            sess["dirty"].add(r.key)
        return
    _write(conn, table, keys, rows)


def _write(conn, table: sql.Composable, keys: tuple[tuple[str, str], ...], rows: list[ArrayRow]) -> None:
    names = [k for k, _ in keys]
    kinds = {"int4": sql.SQL("%s::int[]"), "int8": sql.SQL("%s::bigint[]")}
    key_arrays = [np.array([r.key[j] for r in rows], dtype=np.int64) for j in range(len(keys))]
    cols = sql.SQL(", ").join(map(sql.Identifier, names))
    conn.execute(sql.SQL("DELETE FROM {} WHERE ({}) IN (SELECT * FROM unnest({}))").format(
        table, cols, sql.SQL(", ").join(kinds[kd] for _, kd in keys)), [a.tolist() for a in key_arrays])
    stream = _binary.encode_with_tail(
        [(k, kd, 0) for k, kd in keys], {k: key_arrays[j] for j, k in enumerate(names)},
        [[_binary.binary_array(r.item_ids, "int8") for r in rows], [_binary.binary_array(r.hubs, "float8") for r in rows],
         [_binary.binary_array(r.chubs, "float8") for r in rows]])
    _binary.copy_in(conn, sql.SQL("COPY {} ({}, item_ids, hubs, chubs) FROM STDIN (FORMAT BINARY)").format(table, cols),
                    stream)


_held = Deferral(flush)
