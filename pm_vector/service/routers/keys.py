"""``GET /keys``: the API keys, never their secrets (admin keys without a collection scope)."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import ADMIN, CallerDep, PoolDep
from ..errors import ApiError
from ..auth import list_keys

router = APIRouter()


@router.get("/keys", dependencies=ADMIN, tags=["keys"])
def keys(pool: PoolDep, caller: CallerDep):
    """The API keys (id, name, prefix, role, scope, rate; never the secrets): admin keys without a
    collection scope only."""
    if caller is not None and caller.get("collections") is not None:
        raise ApiError(403, "forbidden", "a key limited to some collections cannot list keys; use an admin key "
                                         "without --collection.")
    with pool.connection() as conn:
        return {"keys": list_keys(conn=conn)}
