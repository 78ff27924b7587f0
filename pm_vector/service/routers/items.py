"""``POST /collections/{name}/items``: items by id (admin keys)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from .. import schemas
from ..deps import ADMIN_SCOPED, JSON_BODY, NEG, SettingsDep, parse_model
from ..errors import ApiError
from ..media import body_schema, body_type, respond
from ..settings import ServiceSettings
from ... import db
from ..documents import plain_json

router = APIRouter()


def _items_sync(name: str, media: str, body: bytes, settings: ServiceSettings):
    b = parse_model(schemas.ItemsBody, media, body, settings)
    if len(b.ids) > settings.max_ids:
        raise ApiError(413, "too_many_ids", f"{len(b.ids):,} ids; at most {settings.max_ids:,} per call.")
    return plain_json(db.fetch_items(name, b.ids, include_features=b.include_features))


@router.post("/collections/{name}/items", dependencies=ADMIN_SCOPED + JSON_BODY + NEG, tags=["collections"],
             openapi_extra=body_schema("ItemsBody"))
async def items(name: str, request: Request, settings: SettingsDep):
    """Items by id (admin keys): external ids, labels, payloads; raw ``features`` only if the collection
    allows it (403).

    Fetching by id tells the server which items you look at: to re-rank a private query's answer use
    ``include_features`` on resolve instead, which returns the features of every row's neighbours."""
    body = await request.body()
    return respond(request, await run_in_threadpool(_items_sync, name, body_type(request), body, settings))
