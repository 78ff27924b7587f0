"""``GET /collections/{name}/anchor``: the public anchor document a client rebuilds its frame from."""

from __future__ import annotations

from fastapi import APIRouter, Request

from .. import schemas
from ..deps import AUTH, NEG
from ..media import respond
from ..documents import anchor_document

router = APIRouter()


@router.get("/collections/{name}/anchor", dependencies=AUTH + NEG, response_model=schemas.AnchorDocument,
            tags=["collections"])
def anchor(name: str, request: Request):
    """The public anchor set (ids, features, labels), the dummy pool and the active run's frame info.

    Everything here is public by construction: the client rebuilds the AnchorFrame from it."""
    return respond(request, anchor_document(name))
