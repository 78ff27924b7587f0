"""Per-item payloads and their bound: a collection setting, ``max_payload_bytes``.

A payload is a small JSON value stored with an item and returned with *every* candidate of
*every* row of a resolve answer, so a client never fetches its final k items by id (such a fetch
would name its real row; see docs/guide/collections.md, "Payloads"). Every candidate's payload travels in every
answer, so an answer grows by up to ``C x k' x max_payload_bytes``: the bound keeps it small.

The size of a payload is the number of UTF-8 bytes of the **compact JSON** text of the value as
it is stored (:func:`stored_text`: jsonb writes numbers in plain decimal notation, so ``1e300``
counts its 301 digits): ``json.dumps(stored, separators=(",", ":"), ensure_ascii=False)``
(``None``: no payload, 0 bytes). What jsonb cannot store or no answer can carry is refused at
ingest, naming the row: a nesting deeper than :data:`MAX_PAYLOAD_DEPTH`, a NUL character or a
lone surrogate, NaN or infinity, a key that is not a string, a number stored beyond 64 bits. The bound is a collection setting (``settings["max_payload_bytes"]``): set by
:func:`~pm_vector.db.create_collection` (default :data:`DEFAULT_MAX_PAYLOAD_BYTES`; a collection
created without it has the default) and changed by an admin with :func:`set_max_payload_bytes`
(``pm-vector db payload-limit``). Every ingest (:func:`pm_vector.db.ingest`, ``pm-vector ingest``)
checks it before writing and again, under a share lock of the collection row, just before its
commit: an ingest and a concurrent lowering of the bound never both succeed with a payload over
the new bound. An attached table's payload columns are held to the same bounds, at attach and at
every sync (:mod:`pm_vector.db.store.sync_rows`: a row over them is rejected, never stored). A
change of payloads alone increases the runs' ``answers_version`` (:func:`bump_answers_version`),
which the cached answers are keyed on.

Beside the bound, a collection keeps the **high-water mark** of the payloads actually stored
(``settings["payload_bytes_high"]``, :data:`HIGH_KEY`): the largest payload size (the same
measure) ever written to it, 0 for a collection created without any. Every write that stores
payloads raises it in its own transaction (:func:`raise_high`: one ``UPDATE`` with ``greatest()``,
so concurrent writers never lose a raise, and a rolled-back write raises nothing): ingest, an
update of items, an attached table's attach (:func:`stored_high`, the exact maximum of what the
attach kept) and its sync. No write lowers it (a delete leaves it). A collection whose row holds no
mark (created before it, or by ``pm_attach_table`` called from SQL) has an unknown one, which
counts as the bound (:func:`high_of`), and no write sets it. The service publishes
``min(bound, mark)`` as ``payload_bytes_max`` (``GET /collections/{name}``), and a client's
location plan counts that per candidate: a collection that stores no payloads gives every byte of
the answer budget to candidates.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ...errors import InvalidInputError
from ._names import check_name
from ..core.collection import collection_row
from ..postgres import connection

SETTINGS_KEY = "max_payload_bytes"
#: the high-water mark of the payloads stored (module doc)
HIGH_KEY = "payload_bytes_high"
DEFAULT_MAX_PAYLOAD_BYTES = 256
#: the largest bound a collection may set: one answer carries C x k' payloads.
MAX_MAX_PAYLOAD_BYTES = 65_536


#: deepest nesting of a payload (lists and objects); an answer nests it a few levels deeper, and
#: a client's decoder refuses documents deeper than 32 (pm_vector.protocol.codec.MAX_DEPTH)
MAX_PAYLOAD_DEPTH = 16
#: the integers every answer carries (a PostgreSQL bigint: every msgpack and JSON reader holds it)
_INT_MIN, _INT_MAX = -2 ** 63, 2 ** 63 - 1


def _depth_of(value: Any, what: str) -> None:
    """Refuse a payload nested deeper than :data:`MAX_PAYLOAD_DEPTH` (iteratively: no recursion)."""
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list, tuple)):
            if d >= MAX_PAYLOAD_DEPTH:
                raise InvalidInputError(f"{what} nests deeper than {MAX_PAYLOAD_DEPTH} levels of lists and objects; "
                                        "flatten it. Nothing was written.")
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))


def _text(s: str, what: str) -> str:
    if "\x00" in s:
        raise InvalidInputError(f"{what} holds a NUL character (\\u0000), which PostgreSQL's jsonb cannot store; "
                                "remove it. Nothing was written.")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(f"{what} holds a lone surrogate (e.g. \\ud800), which is not a Unicode character "
                                "and cannot be stored; send valid text. Nothing was written.") from None
    return s


def stored_text(value: Any, what: str = "payload") -> str:
    """The compact JSON text of ``value`` as PostgreSQL's jsonb stores it and gives it back:
    numbers in the database's plain decimal notation (``1e300`` is an integer of 301 digits,
    ``1.5e-05`` is ``0.000015``), tuples as lists. Raises InvalidInputError for what jsonb cannot
    store or what no answer can carry: a nesting deeper than :data:`MAX_PAYLOAD_DEPTH`, a NUL
    character or a lone surrogate, NaN or infinity, a non-string key, an integer beyond 64 bits
    (once stored), or a value that is not JSON."""
    _depth_of(value, what)

    def integer(n: int, v) -> str:
        if not _INT_MIN <= n <= _INT_MAX:
            raise InvalidInputError(f"{what} holds the number {str(v)[:24]}, which PostgreSQL stores as an integer "
                                    f"of {len(str(abs(n)))} digits: beyond 64 bits, no answer can carry it; send a "
                                    "smaller number (or a string). Nothing was written.")
        return str(n)

    def go(v) -> str:
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(_text(v, what), ensure_ascii=False)
        if isinstance(v, int):
            return integer(int(v), v)
        if isinstance(v, float):
            if not math.isfinite(v):
                raise InvalidInputError(f"{what} holds NaN or infinity, which JSON cannot hold. Nothing was written.")
            t = format(Decimal(repr(v)), "f")  # numeric's output: plain notation, the input's digits
            return t if "." in t else integer(int(t), v)
        if isinstance(v, dict):
            parts = []
            for k, x in v.items():
                if not isinstance(k, str):
                    raise InvalidInputError(f"{what} has a key {str(k)[:24]!r} that is not a string; JSON object "
                                            "keys are strings. Nothing was written.")
                parts.append(json.dumps(_text(k, what), ensure_ascii=False) + ":" + go(x))
            return "{" + ",".join(parts) + "}"
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(go(x) for x in v) + "]"
        raise InvalidInputError(f"{what} is not JSON-serialisable (a {type(v).__name__}); use dicts, lists, str, "
                                "int, float, bool, None.")

    return go(value)


def stored_form(value: Any, what: str = "payload") -> Any:
    """``value`` as the database gives it back (:func:`stored_text`)."""
    return json.loads(stored_text(value, what))


def payload_bytes(value: Any, what: str = "payload") -> int:
    """Bytes of the compact JSON text (UTF-8) of ``value`` as it is stored (:func:`stored_text`:
    numbers in the database's notation); 0 for None. Raises InvalidInputError for a value that
    cannot be stored or carried (see :func:`stored_text`)."""
    if value is None:
        return 0
    return len(stored_text(value, what).encode("utf-8"))


def check_limit(value: Any, what: str = SETTINGS_KEY) -> int:
    """``value`` as a bound: an int in 0..:data:`MAX_MAX_PAYLOAD_BYTES` (0: no payloads allowed)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or not 0 <= int(value) <= MAX_MAX_PAYLOAD_BYTES:
        raise InvalidInputError(f"{what} must be an integer number of bytes in 0..{MAX_MAX_PAYLOAD_BYTES:,} "
                                f"(compact JSON, UTF-8), got {value!r}.")
    return int(value)


def limit_of(coll: Mapping[str, Any]) -> int:
    """A collection's bound (its settings' ``max_payload_bytes``, else the default)."""
    return int((coll.get("settings") or {}).get(SETTINGS_KEY, DEFAULT_MAX_PAYLOAD_BYTES))


def high_of(coll: Mapping[str, Any]) -> int:
    """What a collection's payloads may take, as published (``payload_bytes_max``):
    ``min(bound, high-water mark)``, the bound when its row holds no mark (module doc)."""
    st = coll.get("settings") or {}
    bound = limit_of(coll)
    high = st.get(HIGH_KEY)
    if isinstance(high, bool) or not isinstance(high, int) or high < 0:
        return bound
    return min(bound, high)


def raise_high(conn, collection_id: int, biggest: int) -> None:
    """In the transaction that stores payloads of at most ``biggest`` bytes: the collection's mark
    becomes ``greatest(mark, biggest)``. One ``UPDATE``, which under READ COMMITTED waits for a
    concurrent writer's lock and then evaluates ``greatest`` on the row it committed: no raise is
    lost. Writes nothing when ``biggest`` is 0, when the mark is already as high, or when the row
    holds no mark (unknown: the bound counts)."""
    b = int(biggest)
    if b <= 0:
        return
    conn.execute("UPDATE pm_vector.collections SET settings = jsonb_set(settings, %s, to_jsonb(greatest("
                 "(settings ->> %s)::bigint, %s::bigint))) WHERE id = %s AND settings ? %s "
                 "AND (settings ->> %s)::bigint < %s",
                 [[HIGH_KEY], HIGH_KEY, b, int(collection_id), HIGH_KEY, HIGH_KEY, b])


def stored_high(conn, collection_id: int) -> int:
    """The exact largest size (module doc) of the payloads the collection's items hold now, 0 when
    none: the rows are read longest text first (jsonb's text is never shorter than the compact
    JSON), until no row's text can be longer than the largest measured."""
    best = 0
    cur = conn.execute("SELECT octet_length(payload::text), payload FROM pm_vector.items WHERE collection_id = %s "
                       "AND payload IS NOT NULL ORDER BY 1 DESC", [int(collection_id)])
    for text_len, value in cur:
        if text_len <= best:
            break
        best = max(best, payload_bytes(value))
    return best


def check_payloads(payloads, n: int, limit: int, collection: str) -> tuple[list[Any] | None, int]:
    """Validated ``payloads`` (one JSON value or None per row) within ``limit`` bytes each, and the
    largest one's size.

    Raises InvalidInputError naming the first row over the bound, its size and the bound."""
    if payloads is None:
        return None, 0
    if isinstance(payloads, (str, bytes, Mapping)):
        raise InvalidInputError("payloads must be a sequence of one JSON value (or None) per row.")
    p = list(payloads)
    if len(p) != n:
        raise InvalidInputError(f"payloads has {len(p)} entries for {n} rows; give one per row (or None).")
    biggest = 0
    for i, v in enumerate(p):
        if v is None:
            continue
        size = payload_bytes(v, f"payloads[{i}]")
        biggest = max(biggest, size)
        if size > limit:
            raise InvalidInputError(
                f"payloads[{i}] is {size:,} bytes of compact JSON, over collection {collection!r}'s "
                f"max_payload_bytes of {limit:,}; shorten it (or an admin raises the bound: pm-vector db "
                "payload-limit). Nothing was written.")
    return p, biggest


def recheck_locked(conn, cid: int, collection: str, biggest: int) -> None:
    """In the ingest's transaction, just before its commit: lock the collection row FOR SHARE (so a
    concurrent :func:`set_max_payload_bytes` waits for the commit, or this waits for it) and check
    ``biggest`` against the bound as it is now."""
    row = conn.execute("SELECT settings FROM pm_vector.collections WHERE id = %s FOR SHARE", [cid]).fetchone()
    limit = limit_of({"settings": row[0] if row else None})
    if biggest > limit:
        raise InvalidInputError(
            f"a payload of {biggest:,} bytes is over collection {collection!r}'s max_payload_bytes of {limit:,} "
            "(lowered while this ingest ran). Nothing was written.")


def set_max_payload_bytes(collection: str, max_payload_bytes: int) -> dict[str, Any]:
    """Change a collection's payload bound (an admin's action). Returns ``{"collection",
    "max_payload_bytes", "previous"}``.

    Lowering it below a payload already stored is refused (the stored items keep being served as
    they are, and every answer stays within the bound); the check and the change are one
    transaction that excludes concurrent ingests' commits."""
    check_name(collection)
    limit = check_limit(max_payload_bytes)
    with connection() as conn:
        coll = collection_row(conn, collection, lock="FOR NO KEY UPDATE")
        cid, previous = coll["id"], limit_of(coll)
        if limit < previous:
            # jsonb's text is never shorter than the compact JSON of the value it holds, so only rows whose
            # text is longer than the bound need the exact measure
            cur = conn.execute("SELECT id, payload FROM pm_vector.items WHERE collection_id = %s AND payload IS NOT "
                               "NULL AND octet_length(payload::text) > %s", [cid, limit])
            for item_id, value in cur:
                size = payload_bytes(value)
                if size > limit:
                    raise InvalidInputError(
                        f"item {item_id} of collection {collection!r} has a payload of {size:,} bytes, over the "
                        f"new max_payload_bytes of {limit:,}; the bound stays {previous:,}.")
        conn.execute("UPDATE pm_vector.collections SET settings = jsonb_set(settings, %s, %s::jsonb), "
                     "updated_at = now() WHERE id = %s", [[SETTINGS_KEY], str(limit), cid])
        conn.commit()
    return {"collection": collection, "max_payload_bytes": limit, "previous": previous}


def bump_answers_version(conn, collection_id: int) -> None:
    """In a transaction that changes payloads without changing any run's items (a payload-only
    sync or update): the ``class_rows`` document of every finished run of the collection gets
    ``answers_version`` + 1. The cached location answers, which carry payloads, are keyed on it
    (:mod:`pm_vector.db.resolve.location_resolution`), and the new run row's version (``xmin``) ends
    the one-round-trip path of a repeated request, so no process serves the old payloads after the
    commit."""
    conn.execute("UPDATE pm_vector.embedding_runs SET class_rows = jsonb_set(class_rows, '{answers_version}', "
                 "to_jsonb(coalesce((class_rows ->> 'answers_version')::bigint, 0) + 1)) "
                 "WHERE collection_id = %s AND status = 'succeeded' AND jsonb_typeof(class_rows) = 'object'",
                 [int(collection_id)])  # (the runs an erasure updates too: never a job's row while it runs)


def read_jsonl(path) -> list[Any]:
    """Payloads from a JSON-lines file: one JSON value per line (``null``: no payload), line i
    (1-based) for row i - 1; UTF-8, a final newline optional. A blank line, invalid JSON, NaN or
    Infinity raise InvalidInputError naming the file and the line."""
    def _no_constant(name):
        raise ValueError(f"{name} is not JSON")

    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"{path}: no such file (--payloads).")
    out: list[Any] = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise InvalidInputError(f"{path}: line {lineno} is not UTF-8 text.") from None
            if not line.strip():
                raise InvalidInputError(f"{path}: line {lineno} is blank; give one JSON value per row (null for "
                                        "a row without payload).")
            try:
                out.append(json.loads(line, parse_constant=_no_constant))
            except ValueError as exc:
                raise InvalidInputError(f"{path}: line {lineno} is not one JSON value ({exc}).") from None
    return out
