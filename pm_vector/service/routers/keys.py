"""``GET /keys``: the API keys, never their secrets (admin keys without a collection scope)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..deps import ADMIN, StateDep, key_of
from ..validation import ApiError

router = APIRouter()


@router.get("/keys", dependencies=ADMIN, tags=["keys"])
def keys(request: Request, state: StateDep):
    """The API keys (id, name, prefix, role, scope, rate; never the secrets): admin keys without a
    collection scope only."""
    from ..auth import list_keys

    rec = key_of(request)
    if rec is not None and rec.get("collections") is not None:
        raise ApiError(403, "forbidden", "a key limited to some collections cannot list keys; use an admin key "
                                         "without --collection.")
    with state["pool"].connection() as conn:
        return {"keys": list_keys(conn=conn)}
