"""``GET /collections/{name}/kahm/models`` (the stored KAHM models, no model bytes) and
``POST /collections/{name}/kahm/distances`` (this collection as a party of federated classification)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from .. import schemas
from ..deps import AUTH, JSON_BODY, NEG, SettingsDep, StateDep, parse_model
from ..media import body_schema, body_type, read_body, respond
from ..settings import ServiceSettings
from ..state import ServiceState
from ..documents import plain_json

router = APIRouter()


@router.get("/collections/{name}/kahm/models", dependencies=AUTH + NEG, response_model=schemas.KAHMModels,
            tags=["kahm"])
def kahm_models(name: str, request: Request):
    """The collection's stored KAHM models, newest first (``is_current``: the one that serves)."""
    from ...db.kahm import list_kahm_models  # lazy: start-up (db.kahm imports sklearn, ~3 s)

    return respond(request, plain_json({"collection": name, "models": list_kahm_models(name)}))


def _distances_sync(name: str, media: str, body: bytes, settings: ServiceSettings,
                    state: ServiceState) -> dict[str, Any]:
    d = parse_model(schemas.DistancesBody, media, body, settings)
    X, mid = d.features, d.model_id

    from ...db.kahm import party_distances  # lazy: start-up (db.kahm imports sklearn, ~3 s)

    with state.resolve_slots:
        return plain_json(party_distances(name, X, model_id=mid))


@router.post("/collections/{name}/kahm/distances", dependencies=AUTH + JSON_BODY + NEG,
             response_model=schemas.PartyDistances,
             tags=["kahm"], openapi_extra=body_schema("DistancesBody"))
async def kahm_distances(name: str, request: Request, settings: SettingsDep, state: StateDep):
    """This collection as a party of federated classification (the KAHM paper's eq 104).

    The body is ``{"features": [[...], ...], "model_id": null}``; the answer holds, for every class
    the party's model knows, the distance value (Definition 6) of each query row -- no items, no
    model. Distances of a raw (non-private) model are refused (403) unless the collection opts in.
    JSON object keys are strings: ``distances`` is ``{"<class>": [one per row]}``, and a
    distance that is infinite (the class cannot model the row) is ``null``.
    :meth:`pm_vector.client.http.Client.kahm_distances` turns it back into
    :func:`pm_vector.db.kahm.party_distances`' shape (int keys, numpy arrays, inf)."""
    body = await request.body()
    return respond(request, await run_in_threadpool(_distances_sync, name, body_type(request), body, settings, state))
