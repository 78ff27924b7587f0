"""Background embedding jobs of the service: SMLQ (AnchorFrame) runs in worker threads, their
state persisted in ``pm_vector_service.jobs``.

A job is :func:`pm_vector.db.runs.jobs.run_embedding_job` with
:func:`pm_vector.db.runs.jobs.anchor_frame_embed_fn`; its database side is kill-safe on its own
(a job whose process dies leaves no active half-run). This module keeps each job's status,
stage progress, result or error in a table, so ``GET /jobs`` after a restart still shows them;
at start-up, jobs left ``queued`` or ``running`` by a service that died are marked
``interrupted`` (never left running). Parameters are bounded (one key must not be able to pin a
core or degrade everyone's precision with a 2-dimensional run) and so is the queue.
"""

from __future__ import annotations

import datetime as dt
import inspect
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from psycopg import sql
from psycopg.types.json import Jsonb

from ..errors import InvalidInputError, PMVectorError
from ..protocol.anchor import FRAME_PARAM_BOUNDS
from .. import db
from ..db.runs.jobs import anchor_frame_embed_fn, run_embedding_job
from ..manifold import AnchorFrame
from .documents import plain_json

TABLE = sql.Identifier("pm_vector_service", "jobs")
#: first key of the advisory lock a live service process holds on its owner id (the second is
#: hashtext(owner)); recover() leaves the jobs of live owners alone
LOCK_SPACE = 0x706D7631
_COLUMNS = ("job_id", "collection", "key_id", "params", "seed", "status", "stage", "done", "total", "stages", "result",
            "error", "created_at", "started_at", "finished_at")
_COLS = sql.SQL(", ").join(map(sql.Identifier, _COLUMNS))
FINISHED = ("succeeded", "failed", "interrupted")

#: (low, high) of the numeric AnchorFrame parameters a job may ask for; n_components' low end is a
#: service setting (job_min_components)
BOUNDS: dict[str, tuple[float, float]] = FRAME_PARAM_BOUNDS  # one home: the client refuses a run outside them


class JobQueueFullError(PMVectorError):
    """The service already has its maximum of queued and running jobs."""


def check_params(params: Any, *, min_components: int = 1) -> dict[str, Any]:
    """AnchorFrame keyword arguments (``seed`` and ``device`` excluded), checked by name, JSON type
    and :data:`BOUNDS` (``n_components`` at least ``min_components``)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidInputError("params must be a JSON object of AnchorFrame parameters, e.g. {\"n_components\": 8}.")
    allowed = [p for p in inspect.signature(AnchorFrame.__init__).parameters if p not in ("self", "seed", "device")]
    bad = sorted(set(params) - set(allowed))
    if bad:
        raise InvalidInputError(f"unknown job parameter(s) {sorted(map(str, bad))[:10]}; allowed: {allowed} (the seed "
                                "goes in 'seed').")
    for k, v in params.items():
        if not isinstance(v, (int, float, str)) or isinstance(v, bool):
            raise InvalidInputError(f"job parameter {k!r} must be a number or string, got {type(v).__name__}.")
        if isinstance(v, str) and len(v) > 40:
            raise InvalidInputError(f"job parameter {k!r} is a string of {len(v)} characters; at most 40.")
        if k in BOUNDS and not (k == "sigma" and v == "auto"):
            lo, hi = BOUNDS[k]
            if k == "n_components":
                lo = max(lo, min_components)
            if isinstance(v, str) or not lo <= v <= hi:
                raise InvalidInputError(f"job parameter {k} must be a number in [{lo:g}, {hi:g}] on this service, "
                                        f"got {v!r}.")
            if k in ("n_components", "n_iter", "n_extend_iter", "n_neighbors") and v != int(v):
                raise InvalidInputError(f"job parameter {k} must be an integer, got {v!r}.")
    if "n_components" not in params and min_components > 16:  # AnchorFrame's default is 16
        raise InvalidInputError(f"this service needs n_components >= {min_components}; set it in params.")
    return dict(params)


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63:
        raise InvalidInputError(f"seed must be an integer in 0..2**63-1, got {seed!r}.")
    return int(seed)


def _ts(v) -> float | None:
    return v.timestamp() if isinstance(v, dt.datetime) else v


def _job(r) -> dict[str, Any]:
    j = dict(zip(_COLUMNS, r))
    for k in ("created_at", "started_at", "finished_at"):
        j[k] = _ts(j[k])
    j["stages"] = j["stages"] or {}
    j["params"] = j["params"] or {}
    return j


class JobManager:
    """``connection()``: a context manager giving a database connection (the service's pool)."""

    def __init__(self, connection: Callable[[], Any], workers: int = 1, max_queued: int = 8,
                 lock_connection: Callable[[], Any] | None = None):
        self._connection = connection
        self.owner = uuid.uuid4().hex
        # a session of its own holds this process's lock for its lifetime (a pooled one would be reused)
        self._lock_conn = None
        if lock_connection is not None:
            self._lock_conn = lock_connection()
            self._lock_conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", [LOCK_SPACE, self.owner])
        self._ex = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pm_vector_job")
        self.max_queued = int(max_queued)
        self._lock = threading.Lock()  # one start at a time: the queue bound is checked then kept
        self._last_write: dict[str, float] = {}

    def _exec(self, query: sql.Composable, args=(), fetch: str | None = None):
        with self._connection() as conn:
            cur = conn.execute(query, list(args))
            out = cur.fetchall() if fetch == "all" else cur.fetchone() if fetch == "one" else None
            conn.commit()
            return out

    def recover(self) -> int:
        """Mark the jobs a dead service left queued or running as interrupted; returns how many."""
        rows = self._exec(sql.SQL(
            "UPDATE {} j SET status = 'interrupted', finished_at = now(), error = coalesce(error, "
            "'the service stopped before the job finished; the previous run keeps serving. Start it again.') "
            "WHERE status IN ('queued', 'running') AND (owner IS NULL OR NOT EXISTS (SELECT 1 FROM pg_locks l "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = %s AND l.objsubid = 2 "
            "AND l.objid::bigint = (hashtext(j.owner)::bigint & 4294967295))) RETURNING job_id").format(TABLE),
            [LOCK_SPACE], fetch="all")
        return len(rows)

    def start(self, collection: str, params: dict[str, Any], seed: int, key_id: int | None = None) -> dict[str, Any]:
        db.collection_info(collection)  # unknown collection: refused now, not in the thread
        db.get_anchor_set(collection, "anchor")
        job_id = uuid.uuid4().hex[:16]
        with self._lock, self._connection() as conn:
            # one transaction under a lock shared by every worker: the queue bound holds across processes
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", [LOCK_SPACE])
            n = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status IN ('queued', 'running')").format(TABLE)).fetchone()[0]
            if n >= self.max_queued:
                conn.rollback()
                raise JobQueueFullError(f"the service already has {n} queued or running job(s), its limit; wait for "
                                        "one to finish (GET /jobs) and start this one again.")
            conn.execute(sql.SQL("INSERT INTO {} (job_id, collection, key_id, params, seed, owner) "
                                 "VALUES (%s, %s, %s, %s, %s, %s)").format(TABLE), [job_id, collection, key_id, Jsonb(params), int(seed),
                                                            self.owner])
            conn.commit()
        self._ex.submit(self._run, job_id)
        return self.get(job_id)

    def _update(self, job_id: str, **kw) -> None:
        sets = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in kw)
        vals = [Jsonb(v) if k in ("stages", "result") else v for k, v in kw.items()]
        self._exec(sql.SQL("UPDATE {} SET {} WHERE job_id = %s").format(TABLE, sets), [*vals, job_id])

    def _run(self, job_id: str) -> None:
        job = self.get(job_id)
        now = dt.datetime.now(dt.timezone.utc)
        self._update(job_id, status="running", started_at=now)
        stages: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            new = stage not in stages
            stages[stage] = {"done": int(done), "total": int(total)}
            t = time.monotonic()
            # a row update per progress tick would cost more than the tick: every 0.5 s or stage
            if new or int(done) >= int(total) or t - self._last_write.get(job_id, 0.0) > 0.5:
                self._last_write[job_id] = t
                self._update(job_id, stage=stage, done=int(done), total=int(total), stages=stages)

        try:
            res = run_embedding_job(job["collection"], job["params"], job["seed"], progress,
                                    embed_fn=anchor_frame_embed_fn)
            self._update(job_id, status="succeeded", result=plain_json(res), stages=stages,
                         finished_at=dt.datetime.now(dt.timezone.utc))
        except Exception as exc:  # noqa: BLE001 - report, never kill the worker thread
            msg = str(exc) if isinstance(exc, PMVectorError) else f"{type(exc).__name__}: {exc}"
            try:
                self._update(job_id, status="failed", error=msg[:2000], stages=stages,
                             finished_at=dt.datetime.now(dt.timezone.utc))
            except Exception:  # noqa: BLE001 - database gone: recover() marks it at the next start
                pass
        finally:
            self._last_write.pop(job_id, None)

    def get(self, job_id: str) -> dict[str, Any]:
        r = self._exec(sql.SQL("SELECT {} FROM {} WHERE job_id = %s").format(_COLS, TABLE), [str(job_id)[:64]], fetch="one")
        if r is None:
            raise KeyError(job_id)
        return _job(r)

    def list(self, collections: list[str] | None = None, limit: int = 200) -> list[dict[str, Any]]:
        """The newest ``limit`` jobs (of ``collections`` only, if given)."""
        rows = self._exec(sql.SQL("SELECT {} FROM {} WHERE %s::text[] IS NULL OR collection = ANY(%s::text[]) "
                                  "ORDER BY created_at DESC LIMIT %s").format(_COLS, TABLE), [collections, collections, int(limit)], fetch="all")
        return [_job(r) for r in rows]

    def wait(self, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        t0 = time.monotonic()
        while True:
            j = self.get(job_id)
            if j["status"] in FINISHED:
                return j
            if timeout is not None and time.monotonic() - t0 > timeout:
                return j
            time.sleep(0.05)

    def shutdown(self) -> None:
        """Cancel queued jobs and mark them (and any still running) interrupted in the table."""
        self._ex.shutdown(wait=False, cancel_futures=True)
        try:
            if self._lock_conn is not None:
                self._lock_conn.close()  # releases this process's lock: its unfinished jobs become stale
                self._lock_conn = None
            self.recover()
        except Exception:  # noqa: BLE001 - database gone: the next start marks them
            pass
