"""The dependencies the service's routers share (:mod:`pm_vector.service.routers`), in one place.

As in FastAPI's full-stack template, an endpoint states what it needs by parameter type and the
route's ``dependencies`` list, and this module provides it:

* the service's settings (:data:`SettingsDep`), its state (:data:`StateDep`, a
  :class:`~pm_vector.service.state.ServiceState`; also ``app.state.service_state``) and the
  shared connection pool (:data:`PoolDep`);
* the caller's API key record, as the authentication middleware found it (:data:`CallerDep`;
  None while auth is off) and the checks on it: :func:`require_admin` (403 for a key of
  another role) and :func:`require_scope` (404 for a collection outside the key's scope, as if
  it did not exist);
* the media-type checks of :mod:`pm_vector.service.media` as route dependencies
  (:data:`JSON_BODY`: 415 before a body is read; :data:`NEG`: 406 before any work), and
  :func:`parse_model`, a body read in its media type and checked against a schema (422).

The lists :data:`AUTH`, :data:`ADMIN`, :data:`ADMIN_SCOPED`, :data:`JSON_BODY` and :data:`NEG`
are added together in a route's ``dependencies``; they run in that order, before the endpoint.
"""

from __future__ import annotations

from typing import Annotated, Any

import pydantic
from fastapi import Depends, Request

from .auth import in_scope
from .db import ServicePool
from .errors import ApiError
from .media import negotiate, read_body, require_body_type
from .resolve_body import context
from .settings import ServiceSettings
from .state import ServiceState
from .validation import api_error
from ..db.store._names import NAME_PATTERN


# async: plain look-ups and checks run on the event loop (a def dependency costs a hop to a worker thread)
async def get_settings(request: Request) -> ServiceSettings:
    """The settings the application was made with."""
    return request.app.state.settings


async def get_state(request: Request) -> ServiceState:
    """The application's state."""
    return request.app.state.service_state


SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]
StateDep = Annotated[ServiceState, Depends(get_state)]


async def get_pool(state: StateDep) -> ServicePool:
    """The shared connection pool (the service user's sessions)."""
    return state.pool


#: an API key's record (``id``, ``name``, ``role``, ``collections``, ``rate_per_minute``, ...)
KeyRecord = dict[str, Any]


async def get_caller(request: Request) -> KeyRecord | None:
    """The caller's API key record, as the authentication middleware found it (None: auth is off)."""
    return getattr(request.state, "api_key", None)


PoolDep = Annotated[ServicePool, Depends(get_pool)]
CallerDep = Annotated[KeyRecord | None, Depends(get_caller)]


async def require_admin(caller: CallerDep) -> None:
    """403 unless the key's role is ``admin`` (or auth is off)."""
    if caller is not None and caller.get("role") != "admin":
        raise ApiError(403, "forbidden", f"this key's role is {caller.get('role')!r}: it may read collections and "
                                         "anchors and resolve requests; this needs an admin key "
                                         "(`pm-vector keys create --role admin`).")


async def require_scope(name: str, caller: CallerDep) -> None:
    """404 for a malformed collection name or one outside the key's scope (out of scope looks absent)."""
    if not NAME_PATTERN.fullmatch(name) or not in_scope(caller, name):
        raise ApiError(404, "not_found", f"no collection {name!r} (for this key); `GET /collections` lists "
                                         "the ones it may use.")


def parse_model(cls, media: str, body: bytes, settings: ServiceSettings):
    """``body`` (in ``media``) read and validated as the pydantic model ``cls`` with the server's
    limits (:func:`pm_vector.service.resolve_body.context`); 422 (413 over a size limit) naming
    the first problem if it is not one (:func:`pm_vector.service.validation.api_error`)."""
    try:
        return cls.model_validate(read_body(media, body, settings), context=context(settings))
    except pydantic.ValidationError as exc:
        raise api_error(exc) from None


async def resolve_context(request: Request, name: str) -> tuple[ServiceSettings, ServiceState, KeyRecord | None]:
    """What ``POST /collections/{name}/resolve``, the hottest route, needs, as ONE dependency: the
    checks of ``AUTH + JSON_BODY + NEG`` in their order (404, 415, 406), then the settings, the state
    and the caller. The same checks as the lists; FastAPI solves each ``Depends`` on every request
    (about a tenth of a resolve's CPU for the seven the route had)."""
    caller = await get_caller(request)
    await require_scope(name, caller)
    await require_body_type(request)
    await negotiate(request)
    return request.app.state.settings, request.app.state.service_state, caller


ResolveContextDep = Annotated[tuple, Depends(resolve_context)]  # (settings, state, caller)

AUTH = [Depends(require_scope)]
ADMIN = [Depends(require_admin)]
ADMIN_SCOPED = [Depends(require_admin), Depends(require_scope)]
JSON_BODY = [Depends(require_body_type)]  # 415 for a body of another type, before it is read
NEG = [Depends(negotiate)]  # the answer's media type (406 when Accept admits none), before any work
