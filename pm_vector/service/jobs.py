"""Background embedding jobs of the service: SMLQ (AnchorFrame) runs in worker threads.

A job is :func:`pm_vector.db.jobs.run_embedding_job` with
:func:`pm_vector.db.jobs.anchor_frame_embed_fn`; its database side is kill-safe on its own
(a job whose process dies leaves no active half-run). This module only tracks, in memory,
the jobs this service process started: status, stage progress, result or error.
"""

from __future__ import annotations

import inspect
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import InvalidInputError, PMVectorError


def check_params(params: Any) -> dict[str, Any]:
    """AnchorFrame keyword arguments (``seed`` and ``device`` excluded), checked by name and JSON type."""
    from ..manifold import AnchorFrame

    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidInputError("params must be a JSON object of AnchorFrame parameters, e.g. {\"n_components\": 8}.")
    allowed = [p for p in inspect.signature(AnchorFrame.__init__).parameters if p not in ("self", "seed", "device")]
    bad = sorted(set(params) - set(allowed))
    if bad:
        raise InvalidInputError(f"unknown job parameter(s) {bad}; allowed: {allowed} (the seed goes in 'seed').")
    for k, v in params.items():
        if not isinstance(v, (int, float, str)) or isinstance(v, bool):
            raise InvalidInputError(f"job parameter {k!r} must be a number or string, got {v!r}.")
    return dict(params)


class JobManager:
    def __init__(self, workers: int = 1):
        self._ex = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pm_vector_job")
        self._jobs: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def start(self, collection: str, params: dict[str, Any], seed: int) -> dict[str, Any]:
        from .. import db

        db.collection_info(collection)  # unknown collection: refused now, not in the thread
        db.get_anchor_set(collection, "anchor")
        job_id = uuid.uuid4().hex[:16]
        job = {"job_id": job_id, "collection": collection, "params": params, "seed": int(seed), "status": "queued",
               "stage": None, "done": 0, "total": 0, "stages": {}, "result": None, "error": None,
               "created_at": time.time(), "started_at": None, "finished_at": None}
        with self._lock:
            self._jobs[job_id] = job
        self._ex.submit(self._run, job_id)
        return self.get(job_id)

    def _update(self, job_id: str, **kw) -> None:
        with self._lock:
            self._jobs[job_id].update(kw)

    def _run(self, job_id: str) -> None:
        from ..db.jobs import anchor_frame_embed_fn, run_embedding_job

        job = self.get(job_id)
        self._update(job_id, status="running", started_at=time.time())

        def progress(stage: str, done: int, total: int) -> None:
            with self._lock:
                j = self._jobs[job_id]
                j.update(stage=stage, done=int(done), total=int(total))
                j["stages"][stage] = {"done": int(done), "total": int(total)}

        try:
            res = run_embedding_job(job["collection"], job["params"], job["seed"], progress,
                                    embed_fn=anchor_frame_embed_fn)
            self._update(job_id, status="succeeded", result=res, finished_at=time.time())
        except PMVectorError as exc:
            self._update(job_id, status="failed", error=str(exc), finished_at=time.time())
        except Exception as exc:  # noqa: BLE001 - report, never kill the worker thread
            self._update(job_id, status="failed", error=f"{type(exc).__name__}: {exc}", finished_at=time.time())

    def get(self, job_id: str) -> dict[str, Any]:
        with self._lock:
            j = self._jobs.get(job_id)
            if j is None:
                raise KeyError(job_id)
            return {**j, "stages": dict(j["stages"])}

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            ids = list(self._jobs)
        return [self.get(i) for i in ids]

    def wait(self, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        t0 = time.monotonic()
        while True:
            j = self.get(job_id)
            if j["status"] in ("succeeded", "failed"):
                return j
            if timeout is not None and time.monotonic() - t0 > timeout:
                return j
            time.sleep(0.05)

    def shutdown(self) -> None:
        self._ex.shutdown(wait=False, cancel_futures=True)
