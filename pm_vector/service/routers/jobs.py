"""``POST /collections/{name}/jobs`` (start an embedding job), ``GET /jobs`` and ``GET /jobs/{job_id}``
(admin keys; the jobs themselves: :mod:`pm_vector.service.jobs`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from .. import schemas
from ..auth import in_scope
from ..deps import ADMIN, ADMIN_SCOPED, JSON_BODY, CallerDep, SettingsDep, StateDep, parse_model
from ..errors import ApiError
from ..jobs import check_params, check_seed
from ..media import body_schema, body_type
from ..settings import ServiceSettings
from ..state import ServiceState

router = APIRouter()


def _start_job_sync(name: str, media: str, body: bytes, key_id: int | None, settings: ServiceSettings,
                    state: ServiceState):
    b = parse_model(schemas.JobBody, media, body, settings)
    params = check_params(b.params, min_components=settings.job_min_components)
    return state.jobs.start(name, params, check_seed(b.seed), key_id=key_id)


@router.post("/collections/{name}/jobs", dependencies=ADMIN_SCOPED + JSON_BODY, status_code=202,
             response_model=schemas.Job, tags=["jobs"], openapi_extra=body_schema("JobBody"))
async def start_job(name: str, request: Request, settings: SettingsDep, state: StateDep, caller: CallerDep):
    """Start an SMLQ embedding job (AnchorFrame fit + out-of-sample extension) in the background
    (admin keys; parameters bounded, at most ``max_queued_jobs`` queued or running: 429)."""
    body = await request.body()
    job = await run_in_threadpool(_start_job_sync, name, body_type(request), body, caller["id"] if caller else None,
                                  settings, state)
    return JSONResponse(job, status_code=202)


@router.get("/jobs", dependencies=ADMIN, tags=["jobs"])
def list_jobs(state: StateDep, caller: CallerDep):
    """The newest jobs (of the key's collections), kept across restarts."""
    return {"jobs": state.jobs.list(None if caller is None else caller.get("collections"))}


@router.get("/jobs/{job_id}", dependencies=ADMIN, response_model=schemas.Job, tags=["jobs"])
def get_job(job_id: str, state: StateDep, caller: CallerDep):
    """A job's status (queued, running, succeeded, failed, interrupted), stage progress (load, embed,
    write, index, switch) and result."""
    try:
        job = state.jobs.get(job_id)
    except KeyError:
        job = None
    if job is None or not in_scope(caller, job["collection"]):
        raise ApiError(404, "not_found", f"no job {job_id[:40]!r}; `GET /jobs` lists them.")
    return job
