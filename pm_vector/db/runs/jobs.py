"""Embedding runs: compute a collection's embeddings, write them, index them, switch to them.

:func:`run_embedding_job` is the server side of an SMLQ (re-)embedding. The embedding itself is
an injected function, so this module only does the database mechanics::

    embed_fn(anchor_X, anchor_y, item_X, item_y, params, seed, progress)
        -> (anchor_embedding (A, k), item_embedding (n, k))

(the real one is built on ``pm_vector.manifold.AnchorFrame``). ``anchor_X``/``item_X`` are
float32 arrays as stored, labels int64, anchors in their stable order, items by id;
``progress(done, total)`` may be called by ``embed_fn`` to report its own progress.

Steps and their transactions:

1. *register*: insert the run row (status ``running``) and take the session-level advisory
   lock ``pm_lock_key(1, run_id)`` in the same transaction, on the job's own connection. The
   lock lives exactly as long as the job's database session: if the process dies (SIGKILL,
   crash, OOM kill) the server ends the session and releases the lock.
2. *load* anchors and items (binary COPY), *embed* (``embed_fn``).
3. *write*: create ``pm_vector.run_<id>_items`` / ``_anchors`` (typed ``vector(k)``) and COPY
   the embeddings in, in the transaction that created them, the rows frozen (no vacuum writes them again).
   *class rows* (:mod:`pm_vector.db.runs.class_rows`): the run's ClassFrames fit on its public anchor
   set (``embedding_runs.class_frames``, with the parameters, class order and sizes in
   ``embedding_runs.class_rows``), and ``run_<id>_prior`` / ``_neighbors`` / ``_hubs`` written
   the same way, and the cell release's public cells
   (``embedding_runs.public_cells``, fit on the public anchor set) and ``run_<id>_cells``
   (:mod:`pm_vector.db.runs.cell_data`). An anchor set that cannot give class frames (a class
   with fewer than 2 anchor rows) does not fail the job: the run records ``status:
   unavailable`` and serves PrivateMail requests only.
4. *index*: HNSW on both tables (``pm_vector.pm_build_run_indexes``) and the class-rows indexes
   (``pm_vector.pm_build_class_rows_indexes``: HNSW per class partition of the prior, primary
   keys of the graph and hubs), then ANALYZE.
5. *switch*, ONE transaction: lock the collection row, check the run is still ``running``,
   mark it ``succeeded`` and point ``collections.active_run_id`` at it. Queries switch from
   the old run to the new one atomically.
6. *retire*: drop the tables of superseded runs beyond the collection's
   ``keep_previous_runs`` and of failed runs.

Kill safety: until step 5 commits, nothing points at the new run (its class-rows tables
included: ``pm_vector.pm_shortlist`` reads the tables of the collection's active run), so
queries keep using the previous active run whatever happens. A failure in the job marks the
run ``failed`` and drops its tables (class-rows tables too) before raising. A job that is
killed leaves a ``running`` row whose lock nobody holds; :func:`~pm_vector.db.core.abandoned.cleanup_stale_runs` (run at
the start of every job, and by ``pm_vector.db.cleanup()``) marks such runs ``failed`` and
drops their tables. Triggers make
sure only a ``succeeded`` run of the same collection, whose tables exist, can ever be active,
and that the active run's status cannot change.

What each step builds is elsewhere (class rows, cells and shards in their modules of
:mod:`pm_vector.db.runs`, the embedding tables' COPY in :mod:`pm_vector.db.runs.embeddings`, the
class rows' COPY in :mod:`pm_vector.db.runs.run_copy`); new items placed in the active run without
a job are :mod:`pm_vector.db.runs.new_items`.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Callable, Mapping

import numpy as np
import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Json, Jsonb

from ...errors import InvalidInputError, PMVectorError
from ..core.abandoned import RUN_LOCK_KIND, cleanup, fail_run
from ..core.collection import collection_row, iso_datetime, load_anchor_set, load_items, worker_identity
from ..postgres import connect, priority
from ..errors import EmbeddingJobError, RunNotFoundError, translate_sql_error
from ..run_tables import drop_superseded_run, run_table
from .embeddings import embedding_matrix, write_embeddings
from . import carry as _carry, class_rows as _cr, erase as _erase, published as _published
from .kinds import grant_answer_tables
from ...manifold import AnchorFrame

JobProgress = Callable[[str, int, int], None]
EmbedFn = Callable[..., tuple[np.ndarray, np.ndarray]]
ExtendFn = Callable[..., np.ndarray]


def _noop(*_a, **_k) -> None:
    return None


def index_build_mem_mb(n: int, dim: int) -> int:
    """``maintenance_work_mem`` (MB) for an HNSW build over ``n`` vectors of ``dim`` floats: room for
    pgvector's in-memory graph (the vector and about 1 kB of links per element at m = 16, plus a
    fifth), at least 256 MB. A build whose graph does not fit goes on on disk, several times slower
    (the former fixed 256 MB held about 250,000 elements)."""
    return max(256, int(1.2 * int(n) * (4 * int(dim) + 1024) / 2**20) + 1)


# ----------------------------------------------------------------------------- stale runs

def _retire_runs(conn, coll_id: int, keep_previous: int) -> list[int]:
    """Drop tables of failed runs and of succeeded runs older than the ``keep_previous`` newest
    non-active ones. Never the active run, never a running one. Returns run ids dropped."""
    active = conn.execute("SELECT active_run_id FROM pm_vector.collections WHERE id = %s", [coll_id]).fetchone()
    active_id = active[0] if active else None
    rows = conn.execute(
        "SELECT id, status FROM pm_vector.embedding_runs WHERE collection_id = %s "
        "AND status IN ('succeeded', 'failed') AND to_regclass(pm_vector.pm_run_table(id, 'items')) IS NOT NULL "
        "ORDER BY id DESC", [coll_id]).fetchall()
    conn.rollback()
    kept = 0
    dropped: list[int] = []
    for rid, status in rows:
        if rid == active_id:
            continue
        if status == "succeeded" and kept < keep_previous:
            kept += 1
            continue
        try:
            conn.execute("SET LOCAL lock_timeout = '5s'")
            drop_superseded_run(conn, coll_id, rid)
            conn.commit()
            dropped.append(int(rid))
        except psycopg.Error:  # busy (a long query on it) or became active: try next time
            conn.rollback()
    return dropped


# ----------------------------------------------------------------------------- the job

def run_embedding_job(collection: str, params: Mapping[str, Any], seed: int,
                      progress: JobProgress | None = None, *, embed_fn: EmbedFn,
                      write_batch_size: int = 20_000, maintenance_work_mem: str | None = None,
                      class_rows: Mapping[str, Any] | None = None,
                      on_switch: Callable[[Any, int], None] | None = None,
                      before_switch: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Compute, store and index a new embedding of ``collection`` and make it the active run.

    ``params``: JSON-serialisable parameters (stored with the run, passed to ``embed_fn``).
    ``seed``: the run's seed (stored, passed on). ``progress(stage, done, total)`` with stage
    in ``load``, ``embed``, ``write``, ``class_rows``, ``index``, ``switch``. ``embed_fn``: see the
    module doc. ``class_rows``: parameters of the run's class-rows part overriding the defaults
    and the collection's ``settings["class_rows"]`` (:mod:`pm_vector.db.runs.class_rows`:
    ``n_components`` 4, ``clip_quantile`` 0.9, ``graph_degree`` 16, ``max_prior`` 512, ``min_weight`` 0;
    ``graph`` auto: exact up to ``graph_exact_max_items`` 50,000 items, blocked k-means cells above).
    ``maintenance_work_mem``: of the index builds (default :func:`index_build_mem_mb` of the items).
    ``on_switch(conn, run_id)``: called in the switch transaction once the run is the active one (the
    merge places the items ingested during the build in its delta: :mod:`pm_vector.db.runs.merge`).
    ``before_switch(run_id)``: called once the run is built and indexed, before the switch takes the
    collection row (the merge's catch-up: the changes made during the build applied to the new run
    outside the lock, so the switch has only the last few to apply).

    Returns :func:`run_info` of the new (succeeded, active) run, plus ``items_missing``: items
    ingested while the job ran, which the run does not contain
    (:func:`pm_vector.db.runs.new_items.embed_new_items` adds them). On failure raises :class:`EmbeddingJobError` (``.run_id`` set) after marking the
    run ``failed`` and dropping its tables; the previous active run keeps serving.
    """
    params_json, seed = _check_job_args(params, seed, embed_fn, write_batch_size)
    report = progress or _noop

    cleanup(collection)  # runs and ingests of dead workers; also raises CollectionNotFoundError early
    conn = connect(watch_client=True)
    lowered = priority.lower(conn)  # (a background job's: the merge process's)
    run_id: int | None = None
    timings: dict[str, float] = {}
    try:
        coll = collection_row(conn, collection)
        settings = coll["settings"] or {}
        cr_params = _cr.params(settings, class_rows)  # InvalidInputError before any run row
        anchors = load_anchor_set(conn, coll, "anchor", None)  # NoAnchorSetError before any run row
        conn.rollback()
        run_id = conn.execute(
            "INSERT INTO pm_vector.embedding_runs (collection_id, anchor_set_id, status, params, seed, worker, "
            "started_at) VALUES (%s, %s, 'running', %s, %s, %s, now()) RETURNING id",
            [coll["id"], anchors.anchor_set_id, Jsonb(params_json), seed,
             Jsonb({**worker_identity(), "backend_pid": conn.info.backend_pid})]).fetchone()[0]
        conn.execute("SELECT pg_advisory_lock(pm_vector.pm_lock_key(%s, %s))", [RUN_LOCK_KIND, run_id])
        conn.commit()

        items = _job_load(conn, coll, collection, run_id, report, timings)
        a_emb, i_emb = _job_embed(embed_fn, anchors, items, params_json, seed, run_id, report, timings)
        _job_write(conn, run_id, anchors, items, a_emb, i_emb, int(write_batch_size), report, timings)
        cr_data = _job_class_rows(conn, run_id, anchors, items, cr_params, int(write_batch_size), report, timings,
                                  _published.of_active_run(conn, coll, anchors.anchor_set_id, cr_params))
        _job_index(conn, run_id, settings, items["id"].shape[0], a_emb.shape[1], cr_data, maintenance_work_mem,
                   report, timings)
        if before_switch is not None:
            t_ = time.perf_counter()
            before_switch(run_id)
            timings["catch_up_s"] = time.perf_counter() - t_
        # a lowered session holds no lock others wait for: the switch on one of normal priority
        sw = connect(watch_client=True) if lowered else conn
        try:
            previous = _job_switch(sw, collection, coll, run_id, items, report, timings, on_switch)
        finally:
            if sw is not conn:
                sw.close()  # (a failed switch's transaction rolled back before the abort)
    except BaseException as exc:
        if run_id is None:  # nothing written yet
            err = translate_sql_error(exc)
            if err is exc:
                raise
            raise err from exc
        _abort(conn, run_id, exc)
        conn = None
        if isinstance(exc, EmbeddingJobError):
            if exc.run_id is None:
                exc.run_id = run_id
            raise
        if not isinstance(exc, Exception):
            raise
        err = translate_sql_error(exc)
        raise EmbeddingJobError(f"embedding run {run_id} of collection {collection!r} failed: "
                                f"{err.__class__.__name__}: {err}; the previous active run keeps serving.",
                                run_id) from exc
    finally:
        _close_job_conn(conn, run_id)

    missing = _retire_and_count_missing(coll, settings, run_id)
    info = run_info(run_id)
    info["previous_run_id"] = previous
    info["items_missing"] = int(missing)
    return info


def _close_job_conn(conn, run_id: int | None) -> None:
    """The job connection, unless :func:`_abort` closed it: the run's advisory lock released (best
    effort: closing the session releases it anyway), then closed."""
    if conn is not None and not conn.closed:
        try:
            if run_id is not None:
                conn.rollback()
                conn.execute("SELECT pg_advisory_unlock(pm_vector.pm_lock_key(%s, %s))", [RUN_LOCK_KIND, run_id])
                conn.commit()
        except psycopg.Error:
            pass
        conn.close()


def _check_job_args(params, seed, embed_fn, write_batch_size) -> tuple[dict, int]:
    """Refuse bad arguments of :func:`run_embedding_job` before anything runs; returns (the params as
    JSON, the seed as int)."""
    if not isinstance(params, Mapping):
        raise InvalidInputError(f"params must be a mapping (JSON object), got {type(params).__name__}.")
    try:
        params_json = json.loads(json.dumps(dict(params), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"params must be JSON-serialisable ({exc}).") from None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not -2**63 <= int(seed) < 2**63:
        raise InvalidInputError(f"seed must be a 64-bit integer, got {seed!r}.")
    seed = int(seed)
    if not callable(embed_fn):
        raise InvalidInputError("embed_fn must be callable: embed_fn(anchor_X, anchor_y, item_X, item_y, params, "
                                "seed, progress) -> (anchor_embedding, item_embedding).")
    if int(write_batch_size) < 1:
        raise InvalidInputError("write_batch_size must be positive.")
    return params_json, seed


def _job_load(conn, coll, collection: str, run_id: int, report, timings: dict) -> dict[str, np.ndarray]:
    """The job's load phase: a snapshot of the collection's items (ids, labels, features)."""
    t = time.perf_counter()
    report("load", 0, 1)
    items = load_items(conn, coll)  # a snapshot: an ingest is one transaction, so only finished ones
    conn.rollback()
    n = items["id"].shape[0]
    if n == 0:
        raise EmbeddingJobError(f"collection {collection!r} has no items to embed; ingest() some first.", run_id)
    report("load", 1, 1)
    timings["load_s"] = time.perf_counter() - t
    return items


def _job_embed(embed_fn: EmbedFn, anchors, items, params_json: dict, seed: int, run_id: int, report,
               timings: dict) -> tuple[np.ndarray, np.ndarray]:
    """The job's embed phase: ``embed_fn`` on the anchors and items, its output checked; returns
    (anchor embedding, item embedding) as float32."""
    t = time.perf_counter()
    report("embed", 0, 1)
    try:
        out = embed_fn(anchors.features, anchors.labels, items["features"], items["label"], dict(params_json),
                       seed, lambda done, total: report("embed", int(done), int(total)))
    except PMVectorError as exc:
        raise EmbeddingJobError(f"the embedding function failed: {exc}", run_id) from exc
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise EmbeddingJobError("embed_fn must return (anchor_embedding, item_embedding).", run_id)
    a_emb = embedding_matrix(out[0], len(anchors), "anchor_embedding")
    i_emb = embedding_matrix(out[1], items["id"].shape[0], "item_embedding", a_emb.shape[1])
    report("embed", 1, 1)
    timings["embed_s"] = time.perf_counter() - t
    return a_emb, i_emb


def _job_write(conn, run_id: int, anchors, items, a_emb: np.ndarray, i_emb: np.ndarray, batch: int, report,
               timings: dict) -> None:
    """The job's write phase: the run's tables created and the anchors' and items' embeddings copied
    in, one transaction, the rows frozen (:func:`pm_vector.db._binary.copy_options`)."""
    n, k = i_emb.shape[0], a_emb.shape[1]
    t = time.perf_counter()
    conn.execute("UPDATE pm_vector.embedding_runs SET embedding_dim = %s, n_items = %s, n_anchors = %s "
                 "WHERE id = %s", [k, n, len(anchors), run_id])
    conn.execute("SELECT pm_vector.pm_create_run_tables(%s)", [run_id])
    report("write", 0, n)
    write_embeddings(conn, run_table(run_id, "anchors"), "position", "int4",
                      np.arange(len(anchors), dtype=np.int32), a_emb, batch, None, frozen=True)
    write_embeddings(conn, run_table(run_id, "items"), "item_id", "int8", items["id"], i_emb,
                      batch, lambda d, tot: report("write", d, tot), frozen=True)
    conn.commit()
    timings["write_s"] = time.perf_counter() - t


def _job_class_rows(conn, run_id: int, anchors, items, cr_params, batch: int, report, timings: dict,
                    published=None):
    """The job's class-rows phase: frames on the public anchor set, prior, raw-feature graph, hubs (own
    tables, written like the embeddings: nothing points at this run before the switch), and the
    run row's class-rows document. Returns the built class rows, or None when they are unavailable."""
    t = time.perf_counter()
    report("class_rows", 0, 1)
    try:
        cr_data = _cr.build(anchors.features, anchors.labels, items["id"], items["features"], items["label"],
                            cr_params, published, _carry.codes(conn, published, items["id"]) if published else None)
    except InvalidInputError as exc:
        cr_data = None
        cr_doc, frames_doc = _cr.unavailable(cr_params, str(exc)), None
    if cr_data is not None:
        _cr.write(conn, run_id, cr_data, batch)
        cr_doc, frames_doc = cr_data.doc(), cr_data.frames.to_dict()
        timings.update({f"class_rows.{k_}": v for k_, v in cr_data.timings.items()})
    conn.execute("UPDATE pm_vector.embedding_runs SET class_frames = %s, class_rows = %s WHERE id = %s",
                 [None if frames_doc is None else Json(frames_doc), Jsonb(cr_doc), run_id])
    conn.commit()
    report("class_rows", 1, 1)
    timings["class_rows_s"] = time.perf_counter() - t
    return cr_data


def _job_index(conn, run_id: int, settings, n: int, k: int, cr_data, maintenance_work_mem: str | None, report,
               timings: dict) -> None:
    """The job's index phase: the run's HNSW indexes (and its class rows'), in one transaction."""
    t = time.perf_counter()
    report("index", 0, 1)
    conn.execute("SELECT set_config('maintenance_work_mem', %s, true)",
                 [maintenance_work_mem or f"{index_build_mem_mb(n, k)}MB"])
    conn.execute("SELECT pm_vector.pm_build_run_indexes(%s, %s, %s)",
                 [run_id, int(settings.get("hnsw_m", 16)), int(settings.get("hnsw_ef_construction", 64))])
    timings["index.run_s"] = time.perf_counter() - t
    if cr_data is not None:
        _cr.build_indexes(conn, run_id, int(settings.get("hnsw_m", 16)),
                          int(settings.get("hnsw_ef_construction", 64)))
    conn.commit()
    report("index", 1, 1)
    timings["index_s"] = time.perf_counter() - t


def _job_switch(conn, collection: str, coll, run_id: int, items, report, timings: dict, on_switch=None):
    """The job's switch, one transaction: items deleted since the load leave the run, the run is marked
    succeeded and becomes the collection's active run. Returns the previous active run's id."""
    t = time.perf_counter()
    report("switch", 0, 1)
    # NO KEY UPDATE, not UPDATE: an ingest in progress (one transaction) holds KEY SHARE on
    # the row through its foreign key, and the switch must not wait for it
    row = conn.execute("SELECT active_run_id FROM pm_vector.collections WHERE id = %s FOR NO KEY UPDATE",
                       [coll["id"]]).fetchone()
    if row is None:
        raise EmbeddingJobError(f"collection {collection!r} was dropped while the job ran.", run_id)
    previous = row[0]
    timings["switch.lock_s"] = time.perf_counter() - t  # (waiting for a write that holds the row)
    st = conn.execute("SELECT status FROM pm_vector.embedding_runs WHERE id = %s FOR UPDATE", [run_id]).fetchone()
    if st is None or st[0] != "running":
        raise EmbeddingJobError(
            f"run {run_id} is no longer 'running' (status {st[0] if st else 'deleted'}); another process "
            "declared it abandoned, so it is not switched to.", run_id)
    # items deleted since the load (delete_items holds the collection row as the switch does, so
    # none can be deleted between this and the commit): they leave the new run before it serves

    n_erased = _erase.apply_pending(conn, run_id, items)
    grant_answer_tables(conn, run_id)  # the query role reads the answer tables of the run it serves
    if n_erased:  # (recorded only when it happened)
        timings["erased_at_switch"] = n_erased
    conn.execute("UPDATE pm_vector.embedding_runs SET status = 'succeeded', finished_at = now() WHERE id = %s", [run_id])
    conn.execute("UPDATE pm_vector.collections SET active_run_id = %s WHERE id = %s", [run_id, coll["id"]])
    if on_switch is not None:
        t_on = time.perf_counter()
        on_switch(conn, run_id)
        timings["switch.on_switch_s"] = time.perf_counter() - t_on  # (a merge: the last changes applied)
    timings["switch_s"] = time.perf_counter() - t  # (the collection row held: the last changes applied)
    conn.execute("UPDATE pm_vector.embedding_runs SET timings = %s WHERE id = %s",
                 [Jsonb({k_: round(v, 6) for k_, v in timings.items()}), run_id])
    conn.commit()
    report("switch", 1, 1)
    return previous


def _retire_and_count_missing(coll, settings, run_id: int) -> int:
    """After the switch, on a fresh connection: retire old runs (best effort) and count the items
    ingested while the job ran, which the new run does not contain."""
    with connect() as c2:
        try:  # best effort: a run whose tables could not be dropped now is dropped by a later job
            _retire_runs(c2, coll["id"], int(settings.get("keep_previous_runs", 1)))
        except psycopg.Error:
            c2.rollback()
        missing = c2.execute(
            sql.SQL("SELECT count(*) FROM pm_vector.items i WHERE i.collection_id = %s AND NOT EXISTS "
                    "(SELECT 1 FROM {} e WHERE e.item_id = i.id)").format(run_table(run_id, "items")),
            [coll["id"]]).fetchone()[0]
    return missing


def _abort(conn, run_id: int, exc: BaseException) -> None:
    """Mark the run failed and drop its tables; release the lock by closing the job connection."""
    msg = f"{exc.__class__.__name__}: {exc}"
    try:
        if conn is not None and not conn.closed:
            conn.rollback()
            fail_run(conn, run_id, msg)
    except Exception:  # noqa: BLE001 - try again on a fresh connection below
        try:
            with connect() as c2:
                fail_run(c2, run_id, msg)
        except Exception:  # noqa: BLE001 - cleanup_stale_runs() will finish it
            pass
    finally:
        if conn is not None and not conn.closed:
            conn.close()  # ends the session: the run's advisory lock goes with it


# ----------------------------------------------------------------------------- run info

def _run_dict(row: Mapping[str, Any]) -> dict[str, Any]:
    d = {k: iso_datetime(v) for k, v in dict(row).items()}
    if d.get("duration") is not None:
        d["duration"] = row["duration"].total_seconds()
    return d


def run_info(run_id: int) -> dict[str, Any]:
    """A run as a dict (a row of ``pm_vector.pm_runs``): run_id, collection, status, is_active,
    worker_alive (for running runs), params, seed, embedding_dim, n_items, n_anchors,
    anchor_set_id, timings, error, worker, created_at, started_at, finished_at, duration (s),
    has_tables."""
    with connect() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT * FROM pm_vector.pm_runs WHERE run_id = %s", [int(run_id)])
            row = cur.fetchone()
    if row is None:
        raise RunNotFoundError(f"no embedding run {run_id}.")
    return _run_dict(row)


def list_runs(collection: str | None = None) -> list[dict[str, Any]]:
    """Runs (see :func:`run_info`), newest first; of one collection if given."""
    with connect() as conn:
        if collection is not None:
            collection_row(conn, collection)
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT * FROM pm_vector.pm_runs WHERE (%s::text IS NULL OR collection = %s) "
                        "ORDER BY run_id DESC", [collection, collection])
            return [_run_dict(r) for r in cur.fetchall()]


# ----------------------------------------------------------------------------- AnchorFrame adapters

def _anchor_frame(anchor_X, anchor_y, params: Mapping[str, Any], seed: int):
    kwargs = {k: v for k, v in dict(params).items() if k != "seed"}
    return AnchorFrame(**kwargs, seed=int(seed)).fit(anchor_X, anchor_y)


def anchor_frame_embed_fn(anchor_X, anchor_y, item_X, item_y, params, seed, progress):
    """``embed_fn`` built on :class:`pm_vector.manifold.AnchorFrame`.

    ``params`` are AnchorFrame's keyword arguments (e.g. ``{"n_components": 8}``), ``seed`` its
    public seed: the anchors are embedded by ``fit``, the items by ``extend``.
    """
    frame = _anchor_frame(anchor_X, anchor_y, params, seed)
    return frame.anchor_embedding_, frame.extend(item_X, item_y, progress=progress)


#: frames rebuilt by anchor_frame_extend_fn, by (anchor set digest, params, seed): public data only
_frames: dict = {}


def anchor_frame_extend_fn(anchor_X, anchor_y, anchor_embedding, new_X, new_y, params, seed):
    """``embed_fn_extend`` for :func:`pm_vector.db.runs.new_items.embed_new_items` matching :func:`anchor_frame_embed_fn`.

    Rebuilds the run's frame from its anchors, parameters and seed (deterministic), checks it
    reproduces the stored anchor embedding, and extends it to the new items.
    """
    key = (hashlib.sha256(np.ascontiguousarray(anchor_X).tobytes() + np.ascontiguousarray(anchor_y).tobytes())
           .hexdigest(), json.dumps(dict(params), sort_keys=True, default=str), int(seed))
    frame = _frames.get(key)
    if frame is None:  # (a sync or an update places a few items at a time: the frame is fit once per run)
        frame = _anchor_frame(anchor_X, anchor_y, params, seed)
        if len(_frames) >= 4:
            _frames.pop(next(iter(_frames)))
        _frames[key] = frame
    ref = np.asarray(anchor_embedding, dtype=np.float64)
    scale = max(1.0, float(np.abs(ref).max()))
    if frame.anchor_embedding_.shape != ref.shape or np.abs(frame.anchor_embedding_ - ref).max() > 1e-4 * scale:
        raise EmbeddingJobError("the anchor frame rebuilt from the run's anchors, parameters and seed does not "
                                "reproduce the run's stored anchor embedding; run a full embedding job instead.")
    return frame.extend(new_X, new_y)
