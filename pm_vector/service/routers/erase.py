"""``POST /collections/{name}/items/delete``: delete items and everything derived from them (admin keys)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from .. import schemas
from ..deps import ADMIN_SCOPED, JSON_BODY, NEG, SettingsDep, parse_model
from ..errors import ApiError
from ..media import body_schema, body_type, respond
from ..settings import ServiceSettings
from ...db.store.deletes import delete_items
from ..documents import plain_json

router = APIRouter()


def _delete_sync(name: str, media: str, body: bytes, settings: ServiceSettings):
    b = parse_model(schemas.DeleteItemsBody, media, body, settings)
    if (b.ids is None) == (b.external_ids is None):
        raise ApiError(422, "invalid_input", "give exactly one of ids and external_ids.")
    n = len(b.ids if b.ids is not None else b.external_ids)
    if n > settings.max_ids:
        raise ApiError(413, "too_many_ids", f"{n:,} ids; at most {settings.max_ids:,} per call.")
    return plain_json(delete_items(name, item_ids=b.ids, external_ids=b.external_ids, missing_ok=b.missing_ok))


@router.post("/collections/{name}/items/delete", dependencies=ADMIN_SCOPED + JSON_BODY + NEG, tags=["collections"],
             openapi_extra=body_schema("DeleteItemsBody"))
async def delete(name: str, request: Request, settings: SettingsDep):
    """Delete items by id or external id (admin keys), in one transaction: the items, their rows in the
    active run and the runs kept for switching back (here and on the shards), their KAHM scores; raw
    KAHM models fit on them stop serving until refit. Unknown ids: 404 and nothing deleted, unless
    ``missing_ok``. The request log, the WAL and backups are outside the erasure (docs/operations.md, "What erasure does not reach")."""
    body = await request.body()
    return respond(request, await run_in_threadpool(_delete_sync, name, body_type(request), body, settings))
