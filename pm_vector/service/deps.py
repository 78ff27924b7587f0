"""The dependencies the service's routers share (:mod:`pm_vector.service.routers`), in one place.

As in FastAPI's full-stack template, an endpoint states what it needs by parameter type and the
route's ``dependencies`` list, and this module provides it:

* the service's settings (:data:`SettingsDep`) and its state (:data:`StateDep`: the dict
  :func:`~pm_vector.service.app.create_app` keeps -- ``pool``, ``jobs``, ``query_role``,
  ``router``, ``read_pools``, ``keycache``, ``resolve_slots``, ``read_pools_lock``; also
  ``app.state.service_state``);
* the API key the authentication middleware found (:func:`key_of`; None while auth is off) and
  the checks on it: :func:`require_admin` (403 for a key of another role) and
  :func:`require_scope` (404 for a collection outside the key's scope, as if it did not exist);
* whether the database answers (:func:`database_problem`, for ``/health``; while it does not,
  every other endpoint that touches it is answered 503 by :mod:`pm_vector.service.errors`);
* the media-type checks of :mod:`pm_vector.service.media` as route dependencies
  (:data:`JSON_BODY`: 415 before a body is read; :data:`NEG`: 406 before any work), and
  :func:`parse_model`, a body read in its media type and checked against a schema (422).

The lists :data:`AUTH`, :data:`ADMIN`, :data:`ADMIN_SCOPED`, :data:`JSON_BODY` and :data:`NEG`
are added together in a route's ``dependencies``; they run in that order, before the endpoint.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from .auth import in_scope
from .media import negotiate, read_body, require_body_type
from .settings import ServiceSettings
from .validation import ApiError


# async: plain look-ups and checks run on the event loop (a def dependency costs a hop to a worker thread)
async def get_settings(request: Request) -> ServiceSettings:
    """The settings the application was made with."""
    return request.app.state.settings


async def get_state(request: Request) -> dict[str, Any]:
    """The application's state (the module's doc lists its keys)."""
    return request.app.state.service_state


SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]
StateDep = Annotated[dict[str, Any], Depends(get_state)]


def key_of(request: Request) -> dict[str, Any] | None:
    """The API key's record the authentication middleware found (None: auth is off)."""
    return getattr(request.state, "api_key", None)


async def require_admin(request: Request) -> None:
    """403 unless the key's role is ``admin`` (or auth is off)."""
    rec = key_of(request)
    if rec is not None and rec.get("role") != "admin":
        raise ApiError(403, "forbidden", f"this key's role is {rec.get('role')!r}: it may read collections and "
                                         "anchors and resolve requests; this needs an admin key "
                                         "(`pm-vector keys create --role admin`).")


async def require_scope(name: str, request: Request) -> None:
    """404 for a malformed collection name or one outside the key's scope (out of scope looks absent)."""
    from ..db.store._names import _NAME

    if not _NAME.fullmatch(name) or not in_scope(key_of(request), name):
        raise ApiError(404, "not_found", f"no collection {name!r} (for this key); `GET /collections` lists "
                                         "the ones it may use.")


def database_problem(state: dict[str, Any]) -> str | None:
    """Why the database does not answer (None: it does), from the pool's ping."""
    return state["pool"].ping() if state["pool"] is not None else "no connection pool"


def parse_model(cls, media: str, body: bytes, settings: ServiceSettings):
    """``body`` (in ``media``) read and validated as the pydantic model ``cls``; 422 with the first
    five problems if it is not one."""
    import pydantic

    try:
        return cls.model_validate(read_body(media, body, settings))
    except pydantic.ValidationError as exc:
        parts = [f"{'.'.join(map(str, e.get('loc', ()))) or 'body'}: {e.get('msg')}" for e in exc.errors()[:5]]
        raise ApiError(422, "invalid_input", "; ".join(parts)) from None


AUTH = [Depends(require_scope)]
ADMIN = [Depends(require_admin)]
ADMIN_SCOPED = [Depends(require_admin), Depends(require_scope)]
JSON_BODY = [Depends(require_body_type)]  # 415 for a body of another type, before it is read
NEG = [Depends(negotiate)]  # the answer's media type (406 when Accept admits none), before any work
