"""``GET`` and ``PUT /collections/{name}/merge-rule`` (admin keys): when the service's sync worker
merges a collection's delta (:func:`pm_vector.db.merge_rule`, ``pm-vector db merge-rule``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from .. import schemas
from ..deps import ADMIN_SCOPED, JSON_BODY, NEG, SettingsDep, parse_model
from ..media import body_schema, body_type, respond
from ..settings import ServiceSettings
from ...db.runs.merge import merge_rule

router = APIRouter()


@router.get("/collections/{name}/merge-rule", dependencies=ADMIN_SCOPED + NEG, response_model=schemas.MergeRule,
            tags=["collections"])
def read_rule(name: str, request: Request):
    """The collection's merge rule in force, its own values, the defaults and when the active run's
    pause ends (admin keys). 404 for an unknown collection."""
    return respond(request, merge_rule(name))


def _set_sync(name: str, media: str, body: bytes, settings: ServiceSettings):
    b = parse_model(schemas.MergeRuleBody, media, body, settings)
    return merge_rule(name, delta_items=b.delta_items, age_s=b.age_s, pause=b.pause, reset=b.reset)


@router.put("/collections/{name}/merge-rule", dependencies=ADMIN_SCOPED + JSON_BODY + NEG,
            response_model=schemas.MergeRule, tags=["collections"], openapi_extra=body_schema("MergeRuleBody"))
async def set_rule(name: str, request: Request, settings: SettingsDep):
    """Set keys of the collection's merge rule (admin keys): each value is checked (422) before
    anything is written; the others keep their values. A longer pause keeps more of a fast stream's
    writes; the delta grows meanwhile and a deleted item's derived rows wait longer."""
    body = await request.body()
    return respond(request, await run_in_threadpool(_set_sync, name, body_type(request), body, settings))
