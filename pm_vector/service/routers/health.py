"""``GET /health``: liveness, version, limits, and whether the database answers (no key needed)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from ... import __version__ as _version
from .. import schemas
from ..deps import SettingsDep, StateDep
from ..errors import RETRY_AFTER_S

router = APIRouter()


@router.get("/health", response_model=schemas.Health, tags=["service"],
            responses={503: {"model": schemas.Health}})
def health(settings: SettingsDep, state: StateDep):
    """Liveness, version, limits and whether the database answers (no key needed): 200 with
    ``database: "ok"``, or 503 with ``status: "degraded"``, ``database: "unreachable"`` and
    Retry-After while it does not."""
    why = state.database_problem()
    body = {"status": "ok" if why is None else "degraded", "version": _version,
            "database": "ok" if why is None else "unreachable", "limits": settings.public()}
    if why is None:
        return body
    return JSONResponse({**body, "database_error": why}, status_code=503,
                        headers={"Retry-After": str(RETRY_AFTER_S)})
