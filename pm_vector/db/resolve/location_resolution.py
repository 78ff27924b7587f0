"""The server's resolve of a location request (release ``"location"``, format ``"pm_vector.location/1"``).

A :class:`~pm_vector.protocol.location.LocationRequest` reports ONE public cell of the whole
collection at one level M (:mod:`pm_vector.privacy.location`: pure eps, delta 0). Its answer is a
public function of (run, level, report, eps, candidates, code width): the ranked list
:func:`pm_vector.shortlist.location_list` of the run's row ``(level, report)`` and top hubs
(``run_<id>_locations``, :mod:`pm_vector.db.runs.locations`), with the first ``code_bytes`` bytes of
each candidate's product code and its payload. So a resolve is a lookup:

* checks (nothing written on error, a 4xx through HTTP): the run publishes ready location cells
  (:class:`~pm_vector.db.errors.CellsUnavailableError`), the request's ``locations_digest`` is the
  run's (:class:`~pm_vector.db.errors.CellsDigestMismatchError`), ``level`` is a published level,
  ``code_bytes`` a published code width;
* the answer comes from this process's cache (:class:`~.location_cache.AnswerCache`, keyed by the run,
  its data versions -- ``delta_version`` among them: every write of the delta + 1 -- and the request's
  public fields) or is built: in one statement the cell's delta entries (:mod:`pm_vector.db.runs.delta`)
  and what the process does not hold of the base row's parts, the first 2 x (``candidates`` + the run's
  tombstones) top hubs (the rest can never be answered) and the run's tombstones
  (:mod:`pm_vector.db.resolve.location_cache`: the base rows and top hubs per run and ``graph_version``,
  which no write of the delta changes, the tombstones per ``delta_version``), its arrays in binary
  parsed by numpy, the ranking in numpy (:func:`pm_vector.shortlist.merged_row`: base minus tombstones
  with the delta entries, then :func:`~pm_vector.shortlist.location_list`), then the codes the process
  does not hold and the payloads, in one statement (none when it holds every code and the collection
  stores no payload);
* the request is logged (delta 0) in the same REPEATABLE READ transaction that read the run, with an
  asynchronous commit (a database crash may lose the last ``wal_writer_delay`` of log rows).

A request takes few round trips once this process knows the collection's run (:func:`_resolve_known`:
it has checked a request against the run's row, as read then, and the row's version ``xmin``): one
statement writes the log row only if the active run is still that row at that version (and the
collection is not marked broken: :mod:`pm_vector.db.store.capture`). A repeated request takes only
that statement, its answer from the cache; a report not answered yet (a miss) is built first, by the
same two statements as above, each in its own snapshot, and kept only if the log's statement then
finds the run row at the known version: every write that changes an answer (the delta's, a rewrite of
the rows, a new run) updates the run row in its own transaction, so a row still at that version
means no such write committed since the run was read, and both statements read the state of that
version (3 round trips instead of the full path's 8: a miss of a freshly started service cost about
as much again in round trips as in work). Anything else (a new run, a changed document, a check
that fails, a write in between) takes the path above, which says why.

Any cache or CDN may hold an answer: it depends on nothing but public values. A sharded run keeps
its location rows and codes on the coordinator, so it is answered there; a replica answers from
its copy (the log goes to the primary).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np
from psycopg import sql

from ...errors import RequestError
from ...protocol.formats import LOCATION_FORMAT
from ...protocol.location import LocationRequest
from ..errors import CellsDigestMismatchError, CellsUnavailableError, translate_sql_error
from ..postgres.adapt import Int8Array, configure
from ..run_tables import run_table
from ..runs.array_rows import unsend_records
from ..store.payloads import high_of
from .answer import log_on_primary
from .location_cache import CACHE, CODES, DEAD, ROWS, TOPS, AnswerCache, Pending, forget_runs, join_sets
from .requests import dumps_json, check_codes, code_offset, finish, run_snapshot
from ...privacy.location import location_weight
from ...shortlist import live_top, location_list, merged_row

def check_against_run(meta: Mapping[str, Any], req: LocationRequest, collection: str) -> dict[str, Any]:
    """The run's ``class_rows`` document, after checking the location request against it."""
    if req.collection is not None and req.collection != collection:
        raise RequestError(f"the request was built for collection {req.collection!r}, not {collection!r}.")
    run_id = int(meta["run"]["id"])
    doc = meta["coll"].get("class_rows") or {}
    loc = doc.get("locations") or {}
    if doc.get("status") != "ready" or loc.get("status") != "ready":
        why = loc.get("error") or doc.get("error") or "it was built before the location release existed"
        raise CellsUnavailableError(
            f"the active run {run_id} of collection {collection!r} publishes no location cells ({why}); run a full "
            "embedding job for the collection (pm-vector embed COLLECTION), or use release='cells'.")
    if req.locations_digest != loc["digest"]:
        raise CellsDigestMismatchError(
            f"the request was built on location cells with digest {req.locations_digest[:16]!r}..., but collection "
            f"{collection!r}'s active run {run_id} publishes {loc['digest'][:16]!r}...; fetch the current public "
            "anchor (its class_rows['locations'] and public_locations) and rebuild the request.")
    levels = [int(k) for k in loc["levels"]]
    if req.level not in levels:
        raise RequestError(f"level must be one of the published levels {levels}; got {req.level}.")
    return doc



#: a miss's first statement (:func:`_build`), its branches joined by ``UNION ALL``; each column ONE
#: ``bytea`` of its elements' records (:data:`_RECORDS`: each part's ``array_send`` less its 20-byte
#: header, the parts joined in the database), parsed by numpy in one call each
#: (:func:`pm_vector.db.runs.array_rows.unsend_records`). At 10^6 items a row of the finest level spans
#: about 800 parts: parsing their 2,450 arrays one by one cost 11 ms a miss, more than the ranking.
#: The base row and the top hubs only when this process holds none (:data:`~.location_cache.ROWS`),
#: the tombstones only when it holds no set of the version (:data:`~.location_cache.DEAD`); the
#: cell's delta entries always.
#: the base row of the cell (level, cell)
_BASE_SQL = ("SELECT level, cell, {rec_ids}, {rec_hubs}, {rec_chubs} FROM {t} "
             "WHERE level = %(level)s AND cell = %(cell)s GROUP BY level, cell")
#: the top hubs' first 2 x (``size`` + {n_dead}) (the run's tombstones: so that ``size`` live ones remain,
#: the rest can never be answered; twice that, so that the prefix held serves the next versions too)
_TOP_SQL = ("SELECT 0, 0, substring(array_send(r.item_ids[1:2 * (%(size)s::integer + {n_dead})]) from 21), ''::bytea, "
            "substring(array_send(r.chubs[1:2 * (%(size)s::integer + {n_dead})]) from 21) FROM {t} AS r "
            "WHERE r.level = 0 AND r.cell = 0")
#: the cell's delta entries (-2)
_NEW_SQL = ("SELECT -2, 0, substring(array_send(coalesce(array_agg(d.item_id ORDER BY d.item_id), {ei})) from 21), "
            "substring(array_send(coalesce(array_agg(d.h_r ORDER BY d.item_id), {ef})) from 21), "
            "substring(array_send(coalesce(array_agg(d.h ORDER BY d.item_id), {ef})) from 21) "
            "FROM pm_vector.delta_entries AS d WHERE d.run_id = %(run)s AND d.level = %(level)s AND d.cell = %(cell)s")
#: a column of the row: its parts' records joined in part order
_RECORDS = "coalesce(string_agg(substring(array_send({a}) from 21), ''::bytea ORDER BY part), ''::bytea)"
#: (the tombstones counted in the statement, when not held)
_N_DEAD_SQL = "(SELECT count(*)::integer FROM pm_vector.delta_tombstones AS z0 WHERE z0.run_id = %(run)s)"
#: the run's version, then its tombstones ascending, in one array (-3: one snapshot with the rows);
#: ``{since}`` empty (every tombstone), or only those of the versions after ``%(since)s`` (a set of that
#: version held: :meth:`~.location_cache.TombstoneSets.latest`; each tombstone records its version,
#: migration 0033, read by a range of the index ``delta_tombstones_by_version``)
_DEAD_SQL = ("SELECT -3, 0, substring(array_send(ARRAY[(SELECT v.delta_version FROM "
             "pm_vector.embedding_runs AS v WHERE v.id = %(run)s)] || coalesce((SELECT array_agg(z.item_id ORDER BY "
             "z.item_id) FROM pm_vector.delta_tombstones AS z WHERE z.run_id = %(run)s{since}), {ei})) from 21), "
             "''::bytea, ''::bytea")
_SINCE = " AND z.version > %(since)s"

#: a miss's second statement: the slices of the candidates' codes this process does not hold (their
#: ``code_bytes`` from the published offset; NULL: no code), in the list's order
_CODES_SQL = (
    "SELECT array_agg(substring(c.code from {start} for {n}) ORDER BY u.k) "
    "FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(id, k) LEFT JOIN {codes} AS c ON c.item_id = u.id")
#: the same with every candidate's payload, for a collection that stored one (its high-water mark above
#: 0: :func:`pm_vector.db.store.payloads.high_of`; without one, half the index lookups: 713 candidates at
#: 10^6 items), and how many candidates the items still hold. A listed item always exists: a delete
#: tombstones it (or erases it from the rows) in its own transaction, and an answer built on a state a
#: write changed since is never kept (the known path's log statement checks the run row's version; the
#: full path reads everything in one snapshot)
_CODES_PAYLOADS_SQL = (
    "SELECT array_agg(substring(c.code from {start} for {n}) ORDER BY u.k), jsonb_agg(i.payload ORDER BY u.k), "
    "bool_or(i.payload IS NOT NULL), count(*) "
    "FROM unnest(%s::bigint[], %s::boolean[]) WITH ORDINALITY AS u(id, need, k) JOIN pm_vector.items AS i ON i.id = u.id "
    "LEFT JOIN {codes} AS c ON u.need AND c.item_id = u.id")


def _build(rconn, run_id: int, req: LocationRequest, code_bytes: int, code_offset: int = 0,
           run_key: tuple | None = None, version: int | None = None, payloads: bool = True,
           rows_key: tuple | None = None, pending: Pending | None = None) -> dict[str, Any]:
    """The answer of ``req`` on run ``run_id``; its tombstones the set :data:`DEAD` holds under
    ``(*run_key, version)`` (``version``: the run row's ``delta_version`` as the caller read it), else
    read by the first statement with the version they are at, and held under that one (a caller whose
    version differs builds on a state that a write changed since, which its own check finds:
    :func:`_resolve_known`'s log statement, the full path's one snapshot). The base row, top hubs and
    code slices :data:`ROWS` and :data:`CODES` hold under ``rows_key`` (the run's identity and its
    ``graph_version`` as the caller read it), else read, and added to ``pending`` (the caller keeps
    them with the answer). ``payloads`` false: the collection has never stored a payload (the
    answer's are None, read from no table)."""
    dead = DEAD.get((*run_key, int(version))) if run_key is not None and version is not None else None
    dead_v = int(version) if dead is not None else None  # (the version of the tombstones ranked against)
    # (else a set of an earlier version: only the later versions' tombstones read, joined to it)
    since = DEAD.latest(run_key, int(version)) if dead is None and run_key is not None and version is not None \
        else None
    level, cell, size = int(req.level), int(req.report), int(req.candidates)
    base = ROWS.get((*rows_key, level, cell)) if rows_key is not None else None
    held_top = ROWS.get((*rows_key, "top")) if rows_key is not None else None
    # (the held prefix when it covers the tombstones held, or when none are: checked once they are read)
    read_top = held_top is None or (dead is not None and held_top[0].size < size + dead.size and not held_top[2])
    t = run_table(run_id, "locations")
    ei, ef = sql.SQL("'{}'::bigint[]"), sql.SQL("'{}'::float8[]")
    # (typed: psycopg sends a Python int below 2^15 as a smallint, and size + tombstones held past
    # 32,767 overflowed it: every answer built on a held set of that many failed)
    n_dead = sql.SQL("%(n_dead)s::integer" if dead is not None else _N_DEAD_SQL)
    branches = [sql.SQL(_NEW_SQL).format(ei=ei, ef=ef)]
    if base is None:
        branches.insert(0, sql.SQL(_BASE_SQL).format(t=t, **{
            k: sql.SQL(_RECORDS).format(a=sql.Identifier(c))
            for k, c in (("rec_ids", "item_ids"), ("rec_hubs", "hubs"), ("rec_chubs", "chubs"))}))
    if read_top:
        branches.append(sql.SQL(_TOP_SQL).format(t=t, n_dead=n_dead))
    if dead is None:
        branches.append(sql.SQL(_DEAD_SQL).format(ei=ei, since=sql.SQL("" if since is None else _SINCE)))
    parts: dict[tuple[int, int], tuple] = {}  # (level, cell) -> its columns
    for lv, c, it, hb, ch in rconn.execute(
            sql.SQL(" UNION ALL ").join(branches), {"level": level, "cell": cell, "size": size, "run": int(run_id),
                                                     "n_dead": int(dead.size) if dead is not None else 0,
                                                     "since": since[0] if since is not None else 0},
            binary=True).fetchall():
        parts[(int(lv), int(c))] = (unsend_records(it, "int8"), unsend_records(hb, "float8"),
                                    unsend_records(ch, "float8"))
    if dead is None:
        got = parts.get((-3, 0), (np.zeros(1, np.int64),))[0]
        dead = got[1:]
        if since is not None:
            if not got.size or got[0] < since[0]:  # (below the set held: not one history) the run's sets go,
                DEAD.drop_where(lambda k: k[:len(run_key)] == run_key)  # and the answer is built again
                return _build(rconn, run_id, req, code_bytes, code_offset, run_key, version, payloads, rows_key,
                              pending)
            dead = join_sets(since[1], dead)
        if run_key is not None and got.size and got[0] >= 0:
            dead_v = int(got[0])
            DEAD.put((*run_key, dead_v), dead)

    def joined(key, j, kind):
        return parts[key][j] if key in parts else np.zeros(0, kind)

    kinds = (np.int64, np.float64, np.float64)  # ids, h_r, h
    if base is None:
        base = tuple(_frozen(joined((level, cell), j, k)) for j, k in enumerate(kinds))
        if pending is not None and rows_key is not None:
            pending.rows.append(((*rows_key, level, cell), base, sum(a.nbytes for a in base) + 200))
    need = size + int(dead.size)
    if not read_top and held_top[0].size < need and not held_top[2]:  # (more tombstones than the prefix held)
        read_top = True
        for _lv, _c, it, _hb, ch in rconn.execute(sql.SQL(_TOP_SQL).format(t=t, n_dead=sql.SQL("%(n_dead)s::integer")),
                                                  {"size": size, "n_dead": int(dead.size)}, binary=True).fetchall():
            parts[(0, 0)] = (unsend_records(it, "int8"), None, unsend_records(ch, "float8"))
    if read_top:
        held_top = (_frozen(joined((0, 0), 0, np.int64)), _frozen(joined((0, 0), 2, np.float64)))
        held_top = (*held_top, held_top[0].size < 2 * need)  # (fewer than asked: the whole row)
        if pending is not None and rows_key is not None:
            pending.rows.append(((*rows_key, "top"), held_top, held_top[0].nbytes + held_top[1].nbytes + 200))
    # the top hubs less the tombstones: held per (rows, tombstones' version, prefix), else filtered here
    tops_key = (*rows_key, "live", dead_v, need) if rows_key is not None and dead_v is not None else None
    top = TOPS.get(tops_key) if tops_key is not None else None
    if top is None:
        top = tuple(_frozen(a) for a in live_top(held_top[0][:need], held_top[1][:need], dead))
        if pending is not None and tops_key is not None:
            pending.tops.append((tops_key, top, top[0].nbytes + top[1].nbytes + 200))
    fresh = [joined((-2, 0), j, k) for j, k in enumerate(kinds)]
    ids, _ = location_list(*merged_row(*base, *fresh, *top, dead, top_live=True), location_weight(req.epsilon),
                           size)
    codes, got = _codes(rconn, run_id, ids, int(code_bytes), int(code_offset), payloads,
                        (*rows_key, int(code_offset), int(code_bytes)) if rows_key is not None else None, pending)
    return {"item_ids": ids.astype("<u4") if (ids.size == 0 or int(ids.max()) < 1 << 32) else ids,
            "codes_data": codes, "payloads": list(got) if got is not None else None}


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _codes(rconn, run_id: int, ids: np.ndarray, n: int, offset: int, payloads: bool, key, pending
           ) -> tuple[bytes, list | None]:
    """The candidates' code slices joined in the list's order (those :data:`CODES` holds under ``key``,
    the others read; an item without a code gets ``n`` zero bytes), and their payloads (None: none
    stored); the slices read go to ``pending``."""
    idl = ids.tolist()
    held = CODES.get_many(key, idl) if key is not None else [None] * len(idl)
    need = [s is None for s in held]
    start, width, codes_t = sql.Literal(offset + 1), sql.Literal(n), run_table(run_id, "codes")
    pays = None
    if payloads and idl:  # every candidate's payload, the codes not held
        got = rconn.execute(sql.SQL(_CODES_PAYLOADS_SQL).format(start=start, n=width, codes=codes_t),
                            [Int8Array(ids), need], binary=True).fetchone()
        if int(got[3]) != len(idl):  # an item of the list is gone from the items
            raise RequestError("the run's location list names items that no longer exist; retry (a change is being "
                               "applied) or run a new embedding job.")
        read = iter([s for s, want in zip(got[0], need) if want])
        pays = list(got[1]) if got[2] else None
    elif any(need):
        wanted = [i for i, want in zip(idl, need) if want]
        read = iter(rconn.execute(sql.SQL(_CODES_SQL).format(start=start, n=width, codes=codes_t),
                                  [Int8Array(np.asarray(wanted, np.int64))], binary=True).fetchone()[0])
    else:
        read = iter(())
    zero, fetched, out = bytes(n), {}, []
    for i, s in zip(idl, held):
        if s is None:
            s = next(read)
            if s is None:
                s = zero
            else:
                s = bytes(s)
                if len(s) != n:
                    raise RequestError("the run's location list names items whose codes are shorter than the published "
                                       "width; run a new embedding job.")
                fetched[i] = s
        out.append(s)
    if pending is not None and key is not None and fetched:
        pending.codes.append((key, fetched))
    return b"".join(out), pays

#: (host, port, database, collection) -> (the run's metadata as last read, its row's xmin)
_KNOWN: dict[tuple, tuple[Mapping[str, Any], str]] = {}

#: the log row of a repeated request, written only if the collection's active run is the known row at
#: its known version; one statement, so one snapshot (asynchronous commit, as the full path's)
_KNOWN_LOG_SQL = (
    "WITH s AS (SELECT set_config('synchronous_commit', 'off', true)), "
    # the id from the sequence, not RETURNING id: the query role may insert into the log, never read it
    "n AS (SELECT nextval('pm_vector.request_log_id_seq') AS id), "
    "l AS (INSERT INTO pm_vector.request_log (id, collection_id, collection_name, run_id, request, status, row_count, "
    "received_at, finished_at, duration_ms) "
    "SELECT n.id, c.id, c.name, r.id, %s::jsonb, 'ok', %s, coalesce(%s, now()), now(), %s "
    "FROM s, n, pm_vector.collections c JOIN pm_vector.embedding_runs r ON r.id = c.active_run_id "
    "WHERE c.name = %s AND r.id = %s AND r.xmin::text = %s AND NOT (c.settings ? 'broken') RETURNING 1) "
    "SELECT CASE WHEN EXISTS (SELECT 1 FROM l) THEN (SELECT id FROM n) END")


def _answer_key(rconn, meta, doc, req: LocationRequest, b: int) -> tuple:
    return (str(rconn.pgconn.db), rconn.pgconn.port, int(meta["run"]["id"]), str(meta["run"]["created_at"]),
            int(doc.get("graph_version", 0)), int(doc.get("answers_version", 0)),
            int(meta["coll"].get("delta_version") or 0), req.level, req.report,
            req.epsilon, req.candidates, b)


def _known_key(conn, collection: str) -> tuple:
    pg = conn.pgconn
    return pg.host, pg.port, pg.db, collection


def _resolve_known(collection: str, req: LocationRequest, raw: str | None, conn, received, t0: float,
                   timings: dict[str, float], cache: AnswerCache) -> dict[str, Any] | None:
    """A request of a known run: one round trip when cached, three when built (module doc); or None:
    take the full path."""
    known = _KNOWN.get(_known_key(conn, collection))
    if known is None or conn.info.transaction_status != 0:  # psycopg.pq.TransactionStatus.IDLE
        return None
    meta, xmin = known
    t = time.perf_counter()
    try:
        doc = check_against_run(meta, req, collection)
        b, digest = check_codes(doc, collection, int(meta["run"]["id"]), int(req.code_bytes))
    except Exception:  # the full path checks again on the current run and says why
        return None
    key = _answer_key(conn, meta, doc, req, b)
    body = cache.get(key)
    timings["lookup"] = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()

    auto = conn.autocommit
    conn.autocommit = True  # each statement its own transaction: no BEGIN and COMMIT round trips
    try:
        built = body is None
        if built:  # a miss: built here, kept only if the log's statement finds the run at the known version
            try:
                body, pending = _built(conn, meta, req, b, doc)
            except Exception:  # a write in between (an item gone, a run dropped): the full path says why
                if conn.info.transaction_status != 0:
                    conn.rollback()
                return None
            timings["shortlist"] = (time.perf_counter() - t) * 1e3
            t = time.perf_counter()
        n = int(body["item_ids"].size)
        log_id = conn.execute(_KNOWN_LOG_SQL, [raw if raw is not None else dumps_json(req.to_dict()), n, received,
                                               (time.perf_counter() - t0) * 1e3, collection,
                                               int(meta["run"]["id"]), xmin]).fetchone()[0]
        if conn.info.transaction_status != 0:  # a proxy that kept its own transaction: end it here
            conn.commit()
    except Exception as exc:
        if conn.info.transaction_status != 0:
            conn.rollback()
        err = translate_sql_error(exc)
        if err is not exc:
            raise err from None
        raise
    finally:
        conn.autocommit = auto
    if log_id is None:  # the run changed since: nothing was written, nothing built is kept
        _KNOWN.pop(_known_key(conn, collection), None)
        return None
    if built:
        pending.keep()
        cache.put(key, body, _size(body))
    timings["log"] = (time.perf_counter() - t) * 1e3
    timings["total"] = (time.perf_counter() - t0) * 1e3
    return _answer(collection, meta, req, body, b, digest, not built, timings, int(log_id))


def _built(rconn, meta: Mapping[str, Any], req: LocationRequest, b: int, doc: Mapping[str, Any]
           ) -> tuple[dict[str, Any], Pending]:
    """The answer built (:func:`_build`) on ``rconn``, with the run's item count as its document says,
    on the run's tombstones at the version ``meta`` read (:data:`DEAD`) and its base rows and code
    slices at the ``graph_version`` ``doc`` says (:data:`ROWS`, :data:`CODES`), and the parts it read
    (the caller keeps them only with the answer)."""
    configure(rconn)
    run_id = int(meta["run"]["id"])
    run_key = (str(rconn.pgconn.db), rconn.pgconn.port, run_id, str(meta["run"]["created_at"]))
    rows_key = (*run_key, int(doc.get("graph_version", 0)))
    forget_runs((str(rconn.pgconn.db), rconn.pgconn.port, int(meta["coll"]["id"])), rows_key)
    pending = Pending()
    body = _build(rconn, run_id, req, b, code_offset(doc, b), run_key, meta["coll"].get("delta_version"),
                  payloads=high_of(meta["coll"]) > 0, rows_key=rows_key, pending=pending)
    body["n_items"] = int(doc.get("n_items") or 0)  # the run's items the list was built on
    return body, pending


def _size(body: Mapping[str, Any]) -> int:
    return len(body["codes_data"]) + body["item_ids"].nbytes + 64 * len(body["payloads"] or ())


def _answer(collection, meta, req, body, b, digest, cached, timings, log_id) -> dict[str, Any]:
    return {"collection": collection, "run_id": int(meta["run"]["id"]), "format": LOCATION_FORMAT,
            "release": "location", "answer": "compact", "level": int(req.level), "report": int(req.report),
            "candidates": int(req.candidates), "n_query_rows": 1, **body,
            "codes": {"bytes": int(b), "digest": digest}, "cached": cached,
            "timings_ms": {a: round(v, 3) for a, v in timings.items()}, "request_log_id": log_id}


def resolve_location(collection: str, req: LocationRequest, raw: str | None, *, conn, log: bool, received,
                     t0: float, timings: dict[str, float], read_conn=None, cache: AnswerCache | None = None,
                     **_ignored) -> dict[str, Any]:
    """Answer a location request (module doc). Returns ``{"collection", "run_id", "format",
    "release", "answer": "compact", "level", "report", "candidates", "n_query_rows": 1, "item_ids",
    "codes_data", "payloads", "n_items", "codes": {"bytes", "digest"}, "timings_ms", "request_log_id",
    "cached"}``; ``n_items``: the run's items when the list was built (after deletes or new items it may
    differ from the anchor document a client holds), and the list holds ``min(candidates, n_items)``."""
    cache = CACHE if cache is None else cache
    if read_conn is None and conn is not None and log:
        hit = _resolve_known(collection, req, raw, conn, received, t0, timings, cache)
        if hit is not None:
            return hit
    t = time.perf_counter()
    with run_snapshot(collection, conn if read_conn is None else read_conn, False) as (rconn, meta):
        doc = check_against_run(meta, req, collection)
        run_id = int(meta["run"]["id"])
        b, digest = check_codes(doc, collection, run_id, int(req.code_bytes))
        timings["lookup"] = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        key = _answer_key(rconn, meta, doc, req, b)
        body = cache.get(key)
        cached = body is not None
        if body is None:
            body, pending = _built(rconn, meta, req, b, doc)  # (the run's item count: same snapshot)
            pending.keep()
            cache.put(key, body, _size(body))
        n = int(body["item_ids"].size)
        timings["shortlist"] = (time.perf_counter() - t) * 1e3
        if read_conn is None:
            # the log's commit does not wait for its WAL flush (PostgreSQL's asynchronous commit: at most
            # wal_writer_delay of log rows can be lost in a database crash, never half a row); the answer
            # itself is a public function of the report, so nothing the client relies on is at stake
            rconn.execute("SET LOCAL synchronous_commit TO off")
            log_id = finish(rconn, collection, req, raw, run_id=run_id, n_rows=n, received=received, t0=t0,
                            log=log, timings=timings)
            if log and meta["coll"].get("run_xmin") is not None:
                _KNOWN[_known_key(rconn, collection)] = (meta, str(meta["coll"]["run_xmin"]))
        else:
            rconn.rollback()
    if read_conn is not None:
        log_id = log_on_primary(conn, collection, req, raw, run_id=run_id, n_rows=n, received=received, t0=t0,
                                log=log, timings=timings)
    timings["total"] = (time.perf_counter() - t0) * 1e3
    return _answer(collection, meta, req, body, b, digest, cached, timings, log_id)
