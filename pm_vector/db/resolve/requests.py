"""What every request passes before it touches a run: parsing (object, dict or JSON text of
the four formats), the shape and number checks, and the limits; plus the snapshot a resolve
runs in. Used by :mod:`pm_vector.db.resolve.resolution` (class-rows requests),
:mod:`pm_vector.db.resolve.cell_resolution` (cell requests) and :mod:`pm_vector.db.resolve.paper_resolution` (the
paper's requests).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from typing import Any, Mapping

import numpy as np
import orjson
from threadpoolctl import ThreadpoolController

from ...errors import InvalidInputError, RequestError
from ..postgres.adapt import json_loads
from ...protocol import bounds
from ...protocol.bounds import MAX_K_PRIME, MAX_QUERY_ROWS
from ...protocol.class_rows import ClassRowsRequest
from ...protocol.formats import PRIVATEMAIL_FORMAT
from ...protocol.requests import REQUEST_CLASSES, REQUEST_TYPES
from ..errors import ClassRowsUnavailableError, RawFeaturesNotAllowedError, translate_sql_error
from ..postgres import connect
from ..store.request_log import log_request
from .frame import run_row


#: k and k' (one limit, :data:`pm_vector.protocol.bounds.MAX_K_PRIME`), the name this module gave it
MAX_K = MAX_K_PRIME
#: request JSON text larger than this is refused before parsing
MAX_REQUEST_BYTES = 64 * 1024 * 1024


def dumps_json(obj) -> str:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY).decode()


_blas = None


def one_blas_thread():
    """A context limiting BLAS to one thread: the alignment's small SVD and products are much
    slower with OpenBLAS threads spinning on a busy machine (measured in
    docs/benchmarks.md, "Figures behind design choices in the code")."""
    global _blas
    try:
        if _blas is None:
            _blas = ThreadpoolController()
        return _blas.limit(limits=1, user_api="blas")
    except Exception:  # noqa: BLE001 - threadpoolctl failing: run as is

        return contextlib.nullcontext()


def parse_request(request) -> tuple[Any, str | None]:
    """The request object (of any type in :data:`~pm_vector.protocol.requests.REQUEST_TYPES`), and
    None: the request log stores the validated request's ``to_dict()`` (known fields, checked
    types), never the text as it came (an invented field, a duplicated key or a number written as a
    string do not reach the log)."""
    if isinstance(request, REQUEST_CLASSES):
        return request, None
    if isinstance(request, (bytes, bytearray, memoryview)):
        try:
            request = bytes(request).decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError("the request is not UTF-8 JSON text.") from None
    if isinstance(request, str):
        if len(request) > MAX_REQUEST_BYTES:
            raise RequestError(f"the request is {len(request)} characters long; at most {MAX_REQUEST_BYTES}.")
        try:
            request = json_loads(request)
        except json.JSONDecodeError as exc:
            raise RequestError(f"the request is not valid JSON: {exc}.") from None
    if not isinstance(request, Mapping):
        raise RequestError(f"a request must be a PrivateMailRequest, a ReleaseRequest, or their JSON object/text; "
                           f"got {type(request).__name__}.")

    fmt = request.get("format", PRIVATEMAIL_FORMAT)
    kind = REQUEST_TYPES.get(fmt) if isinstance(fmt, str) else None
    if kind is None:
        raise RequestError(f"unsupported request format {str(fmt)[:60]!r}; expected one of {sorted(REQUEST_TYPES)}.")
    if not isinstance(request.get("anchor_ids", []), list):  # (the paper's documents; no other has the field)
        raise RequestError("anchor_ids must be a list.")
    try:
        return kind.from_dict(dict(request)), None
    except InvalidInputError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise RequestError(f"the {fmt} request has a field of the wrong type ({exc}).") from None


def outputs_allowed(coll: Mapping) -> bool:
    """May the current KAHM model's stored class scores and labels (``kahm_model_id``,
    ``kahm_kind`` of the run's metadata) come back with resolved items?
    :func:`pm_vector.db.kahm.store.model_outputs_allowed` decides, as for ``/kahm/distances``."""
    if coll.get("kahm_model_id") is None:
        return False
    from ..kahm.store import model_outputs_allowed  # lazy: start-up (db.kahm imports sklearn, ~3 s)

    return model_outputs_allowed(coll, coll.get("kahm_kind"))


check_k = bounds.k_neighbours


def _finite_matrix(a, what: str) -> np.ndarray:
    """The request's ``what`` as a 2-d numeric array with finite values, or a RequestError."""
    a = np.asarray(a)
    if a.ndim != 2 or a.dtype.kind not in "fiu":
        raise RequestError(f"the request's {what} must be a 2-d numeric array, got shape {a.shape}.")
    if not np.all(np.isfinite(a)):
        bad = int(np.argwhere(~np.isfinite(a))[0][0])
        raise RequestError(f"the request's {what} contains NaN or infinite values (first at row {bad}); a valid "
                           "client never sends them -- rebuild the request.")
    return a


def check_paper_rows(req) -> None:
    """The server's checks of the paper's request (either form: :class:`PrivateMailRequest` or
    :class:`ReleaseRequest`) beyond its type's own; the table of releases names it (``check_request``)."""
    emb = _finite_matrix(req.rows, "embedding")
    n_q = req.n_query_rows
    if isinstance(n_q, bool) or int(n_q) != n_q or int(n_q) < 1:
        raise RequestError(f"n_query_rows must be a positive integer, got {n_q!r}.")
    if len(req.anchor_ids) + int(n_q) != emb.shape[0]:
        raise RequestError(f"the request's embedding has {emb.shape[0]} rows; expected {int(n_q)} query rows + "
                           f"{len(req.anchor_ids)} anchor rows.")


def check_class_rows(req: ClassRowsRequest) -> None:
    """The server's checks of a class-rows request beyond its type's own (named by the table of releases)."""
    rows = _finite_matrix(req.rows, "rows")
    sig = np.asarray(req.sigmas, dtype=np.float64).reshape(-1)
    if sig.shape[0] != rows.shape[0] or not np.all(np.isfinite(sig)) or np.any(sig <= 0):
        raise RequestError(f"sigmas must be {rows.shape[0]} finite numbers > 0 (one per row).")
    if len(req.classes) != rows.shape[0]:
        raise RequestError(f"the request has {rows.shape[0]} rows but {len(req.classes)} classes.")



def _begin_snapshot(conn) -> None:
    if conn.info.transaction_status != 0:  # psycopg.pq.TransactionStatus.IDLE
        raise InvalidInputError("resolve() needs an idle connection (no transaction in progress).")
    if conn.autocommit:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    else:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")


@contextlib.contextmanager
def run_snapshot(collection: str, conn, include_features: bool):
    """``(conn, meta)``: a REPEATABLE READ transaction on ``conn`` (a new connection when None,
    closed at the end) with the collection's active run read in it. Raw features asked of a
    collection that does not allow them are refused; on any error the transaction is rolled
    back (nothing written) and SQL errors become pm_vector's."""
    own = conn is None
    if own:
        conn = connect()
    try:
        _begin_snapshot(conn)
        try:
            meta = run_row(conn, collection)
            if include_features and not (meta["coll"]["settings"] or {}).get("allow_raw_features", False):
                raise RawFeaturesNotAllowedError(
                    f"collection {collection!r} does not allow returning raw features to clients (its setting "
                    "allow_raw_features is false); resolve without include_features, or create the collection "
                    "with allow_raw_features=True.")
            yield conn, meta
        except BaseException as exc:
            conn.rollback()
            if isinstance(exc, Exception):
                err = translate_sql_error(exc)
                if err is not exc:
                    raise err from None
            raise
    finally:
        if own:
            conn.close()


def finish(conn, collection: str, req, raw: str | None, *, run_id: int, n_rows: int, received, t0: float,
           log: bool, timings: dict[str, float]) -> int | None:
    """Log the request in the resolve's transaction and commit (one commit; nothing is logged
    unless all went well); ``log=False`` only commits. Returns the log row's id."""
    if not log:
        conn.commit()
        return None
    t = time.perf_counter()
    if raw is None:  # serialised once (log_request would serialise twice)
        raw = dumps_json(req.to_dict())
    log_id = log_request(collection, None, run_id=run_id, row_count=n_rows, received_at=received,
                         finished_at=dt.datetime.now(dt.timezone.utc), duration_ms=(time.perf_counter() - t0) * 1e3,
                         conn=conn, request_json=raw)
    timings["log"] = (time.perf_counter() - t) * 1e3
    return log_id


def answer_rows(rows, n_rows: int, value_key: str, *, feature_dim: int | None = None, code_dim: int | None = None,
                kahm: bool = False) -> list[dict]:
    """The per-row answer of a resolve statement's result, whose columns are ``row (1-based),
    rank, item_id, external_id, label, value, payload`` then, when asked, the raw features
    (``feature_dim``), the published code's prefix of ``code_dim`` bytes and the KAHM ``predicted, scores``;
    ordered by row, then rank. ``value_key`` names the value column (``distances`` or
    ``scores``)."""
    n_cols = 7 + (feature_dim is not None) + (code_dim is not None) + 2 * kahm
    cols = list(zip(*rows)) if rows else [()] * n_cols
    row_of = np.fromiter(cols[0], dtype=np.int64, count=len(rows)) if rows else np.zeros(0, np.int64)
    return assemble_answer(n_rows, row_of, cols[2], cols[3], cols[4], cols[5], cols[6], cols[7:], value_key,
                           feature_dim=feature_dim, code_dim=code_dim, kahm=kahm)


def assemble_answer(n_rows: int, row_of: np.ndarray, item_ids, external_ids, labels, values, payloads, extra: list,
                    value_key: str, *, feature_dim: int | None = None, code_dim: int | None = None,
                    kahm: bool = False) -> list[dict]:
    """``rows[i]`` of an answer from its candidates' columns (sequences in row, then rank order;
    ``row_of``: each candidate's 1-based row, ascending; ``extra``: the features, code and KAHM
    columns that were asked for, in that order). One slice per row and column: no Python step
    per value but the conversions the JSON needs."""
    if row_of.size > 1 and np.any(np.diff(row_of) < 0):  # pragma: no cover - the statements order by row
        raise ValueError("resolve statement rows are not ordered by row")
    edges = np.searchsorted(row_of, np.arange(1, n_rows + 2))
    k = 0
    feats = codes = pred = scores = None
    if feature_dim is not None:
        feats, k = extra[k], k + 1
    if code_dim is not None:
        codes, k = extra[k], k + 1
    if kahm:
        pred, scores = extra[k], extra[k + 1]
    out = []
    for i in range(n_rows):
        a, b = int(edges[i]), int(edges[i + 1])
        o = {"row": i, "item_ids": [int(v) for v in item_ids[a:b]], "external_ids": list(external_ids[a:b]),
             "labels": [int(v) for v in labels[a:b]], value_key: [float(v) for v in values[a:b]],
             "payloads": list(payloads[a:b])}
        if feats is not None:
            f = [np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v, dtype=np.float32) for v in feats[a:b]]
            o["features"] = np.stack(f) if f else np.zeros((0, feature_dim), np.float32)
        if codes is not None:  # bytea prefixes of code_dim bytes (a run's items all have a code)
            o["codes"] = np.frombuffer(b"".join(bytes(v) if v is not None else bytes(code_dim) for v in codes[a:b]),
                                       dtype=np.uint8).reshape(b - a, code_dim)
        if pred is not None:
            o["predicted"] = [None if v is None else int(v) for v in pred[a:b]]
            o["class_scores"] = [None if v is None else [float(x) for x in v] for v in scores[a:b]]
        out.append(o)
    return out


def check_codes(doc: Mapping, collection: str, run_id: int, code_bytes: int | None) -> tuple[int, str]:
    """``(b, digest)``: the code width an answer carries (``code_bytes``, or the widest residual
    prefix when None) after checking that the run publishes codes (ClassRowsUnavailableError) and
    that ``b`` is one of their published widths (RequestError saying which are). Where the width
    sits in an item's stored code: :func:`code_offset`."""
    meta = doc.get("codes") or {}
    if meta.get("status") != "ready":
        why = meta.get("error") or "it was built before product codes existed"
        raise ClassRowsUnavailableError(
            f"the active run {run_id} of collection {collection!r} publishes no product codes ({why}); ask for raw "
            "features (answer='features', where the collection allows them) or run a new embedding job.")
    widths = [int(v) for v in meta.get("widths") or meta["stage_bytes"]]
    if code_bytes is None:
        return int(meta["stage_bytes"][-1]), str(meta["digest"])
    if isinstance(code_bytes, bool) or not isinstance(code_bytes, (int, np.integer)) or int(code_bytes) not in widths:
        raise RequestError(f"code_bytes must be one of the published code widths {widths} of the active run's "
                           f"codes; got {code_bytes!r}.")
    return int(code_bytes), str(meta["digest"])


def code_offset(doc: Mapping, width: int) -> int:
    """Where the ``width``-byte code (checked by :func:`check_codes`) starts in an item's stored
    code, in bytes: 0 for a residual prefix (and every run built before the wide tables)."""
    meta = doc.get("codes") or {}
    return int(dict(zip(meta.get("widths") or (), meta.get("offsets") or ())).get(int(width), 0))


def compact_rows(rows: list[dict]) -> list[dict]:
    """The compact answer's rows from full ones that carry codes: per row ``{"row", "item_ids"
    (uint32 array when every id fits, else int64), "codes" ((k', b) uint8)}`` and ``"payloads"``
    when any candidate of the answer has a payload (the same keys on every row, so the shape of
    the answer does not depend on which row is real). External ids, labels, scores and KAHM
    class scores are left out: they would cost more than the codes."""
    with_payloads = any(p is not None for r in rows for p in r.get("payloads", ()))
    ids_of = [np.asarray(r["item_ids"], dtype=np.int64) for r in rows]
    small = all(v.size == 0 or (int(v.min()) >= 0 and int(v.max()) < 2 ** 32) for v in ids_of)
    out = []
    for r, ids in zip(rows, ids_of):
        o = {"row": r["row"], "item_ids": ids.astype(np.uint32) if small else ids, "codes": r["codes"]}
        if with_payloads:
            o["payloads"] = list(r["payloads"])
        out.append(o)
    return out


def compact_groups(n_rows: int, groups, code_dim: int) -> list[dict]:
    """The compact answer's rows (:func:`compact_rows`) from a compact statement's groups
    (:func:`pm_vector.db.resolve.answer.compact_columns`): ``(row, ids, codes, payloads)`` per row
    that has candidates (``row`` 1-based; ``ids`` the big-endian int64 ids in rank order, one bytea;
    ``codes`` their ``code_dim``-byte prefixes, one bytea; ``payloads`` a list). A row without
    candidates gets empty arrays. Raises ``ValueError`` when a group's parts disagree in length
    (a statement that lost a candidate's code or payload)."""
    rows = [{"row": i, "item_ids": np.zeros(0, np.int64), "codes": np.zeros((0, code_dim), np.uint8),
             "payloads": []} for i in range(n_rows)]
    for row, ids, codes, payloads in groups:
        ids = np.frombuffer(bytes(ids), dtype=">i8").astype(np.int64)
        codes = np.frombuffer(bytes(codes), dtype=np.uint8)
        payloads = list(payloads)
        if codes.size != ids.size * code_dim or len(payloads) != ids.size or not 1 <= int(row) <= n_rows:
            raise ValueError(f"a compact statement's row {row} has {ids.size} ids, {codes.size} code bytes and "
                             f"{len(payloads)} payloads")
        rows[int(row) - 1].update(item_ids=ids, codes=codes.reshape(ids.size, code_dim), payloads=payloads)
    return compact_rows(rows)


def statement_answer(rows, n_rows: int, compact: bool, **extra) -> tuple[list[dict], int]:
    """``(answer rows, candidates found)`` from a shortlist statement's result: its compact groups
    (:func:`compact_groups`, ``extra["code_dim"]`` bytes of code each) or its full rows, one per
    candidate (:func:`answer_rows` with ``scores``; ``extra`` its keyword arguments)."""
    if compact:
        out = compact_groups(n_rows, rows, extra["code_dim"])
        return out, sum(int(r["item_ids"].size) for r in out)
    return answer_rows(rows, n_rows, "scores", **extra), len(rows)
