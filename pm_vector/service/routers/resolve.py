"""``POST /collections/{name}/resolve``: a private request in, per-row candidates out.

A query key's request runs on a pool of its own that logs in as a member of the query database
role (``state.query_pool``, login ``state.query_login``: migration 0017's role or
``query_db_url``; read and request-log insert only), else under ``SET ROLE`` of that role on the
shared pool (``state.query_role``); a class-rows, cell or location request is read on a replica
in rotation when there is one (``state.router``, logging in the same way), its log written on
the primary; at most ``pool_max`` resolves run at once (``state.resolve_slots``); ``state`` is the
:class:`~pm_vector.service.state.ServiceState`."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from fastapi import APIRouter, Request
from fastapi.responses import Response
from fastapi.concurrency import run_in_threadpool

from ...protocol.bounds import MAX_QUERY_ROWS
from ...protocol.codec import JSON, MSGPACK
from ..deps import ResolveContextDep
from ..errors import ApiError
from ..media import body_schema, body_type, read_body, respond
from ..settings import ServiceSettings
from ..state import ServiceState
from ..resolve_body import Resolve, parse_resolve_body
from ...db.errors import DatabaseConfigError
from ...db.postgres import redact
from ..db import with_login
from ..documents import resolve_document

router = APIRouter()

#: the answer's declaration: the served releases' answer models (``ResolveAnswer``, made by
#: :func:`pm_vector.service.resolve_body.resolve_schemas`), in either media type. Not a
#: ``response_model``: the answer is written as Accept asks, msgpack with numpy arrays as an
#: extension type and code bytes as ``bin`` (FastAPI's response_model serialises JSON only, and
#: would validate every row of a large answer again); tests check real answers against the models.
_REF = {"schema": {"$ref": "#/components/schemas/ResolveAnswer"}}
ANSWER: dict = {200: {"description": "The answer of the request's release.", "content": {JSON: _REF, MSGPACK: _REF}}}
log = logging.getLogger("pm_vector.service")


def _resolve_on_replica(name, body: Resolve, db_role, conn, settings: ServiceSettings, state: ServiceState,
                        login: tuple[str, str | None] | None = None):
    """The answer read on a replica in rotation (log written on ``conn``), or None: read on the
    primary (no replica, a release whose wire model does not read on replicas -- the paper's --,
    or the replica failed: it leaves the rotation). ``login``: read on a pool that logs in as this
    (user, password), not under ``SET ROLE``."""
    router = state.router
    if router is None or not body.on_replica:
        return None
    url = router.pick()
    if url is None:
        return None

    purl = with_login(url, *login) if login else url
    try:
        pool = state.read_pool(purl, settings.pool_max)  # one per replica and login, made on its first read
        with pool.connection_as(None if login else db_role) as rconn:
            return resolve_document(name, body.request, k=body.k, include_features=body.include_features, conn=conn,
                                    read_conn=rconn, max_query_rows=min(settings.max_rows, MAX_QUERY_ROWS),
                                    answer=body.answer)
    except (psycopg.OperationalError, DatabaseConfigError) as exc:
        router.mark_failed(url, type(exc).__name__)
        log.warning("replica %s left the rotation (%s); reading on the primary", redact(url), type(exc).__name__)
        return None


def _resolve_sync(name: str, media: str, body: bytes, key_role: str | None, settings: ServiceSettings,
                  state: ServiceState) -> dict[str, Any]:
    parsed = parse_resolve_body(read_body(media, body, settings), settings, name)

    db_role = state.query_role if key_role == "query" else None
    own = state.query_pool if key_role == "query" else None  # its own login role: nothing to SET

    try:
        with state.resolve_slots, (own.connection() if own is not None else
                                   state.pool.connection_as(db_role)) as conn:
            login = state.query_login if own is not None else None
            res = None if own is not None and login is None else \
                _resolve_on_replica(name, parsed, db_role, conn, settings, state, login=login)
            if res is None:
                res = resolve_document(name, parsed.request, k=parsed.k, include_features=parsed.include_features,
                                       conn=conn, max_query_rows=min(settings.max_rows, MAX_QUERY_ROWS),
                                       answer=parsed.answer)
    except psycopg.errors.InsufficientPrivilege as exc:
        if db_role is None:
            raise
        log.error("role %s may not read a table of %s (%s)", db_role, name, str(exc).strip().splitlines()[0])
        raise ApiError(500, "database_role_misconfigured", f"the service's database role {db_role} may not read "
                       "this collection's tables; the operator should grant what docs/operations.md, \"Database "
                       "roles\" lists (a run's answer tables: its embedding job grants them at its switch), or set "
                       "PM_VECTOR_SERVICE_QUERY_DB_ROLE=\"\".") from None
    return res


@router.post("/collections/{name}/resolve", tags=["resolve"], openapi_extra=body_schema("ResolveBody"),
             responses=ANSWER)
async def resolve_endpoint(name: str, request: Request, ctx: ResolveContextDep):
    """Resolve a request of any release the service serves (``ResolveBody``: its ``request`` is one
    of the releases' request documents, by its ``format``; :mod:`pm_vector.service.resolve_body`).

    A location request (the default release) is answered with one list of candidates
    (``LocationAnswer``); a class-rows, cell or paper request with one entry of ``rows`` per request
    row (``ResolveResponse``): only the client knows which row is real. The compact answer (default
    of pm_vector's releases) carries every row's candidate ids and product-code prefixes (and
    payloads when there are any): :func:`pm_vector.service.documents.resolve_document`; ``"features"`` the
    full rows with raw features (collections that allow them; ``"include_features": true`` says the
    same)."""
    return await answer(request, name, *ctx)  # (AUTH + JSON_BODY + NEG's checks: deps.resolve_context)


async def answer(request: Request, name: str, settings: ServiceSettings, state: ServiceState, caller) -> Response:
    """The answer of a resolve whose checks passed (:func:`pm_vector.service.deps.resolve_context`):
    the body read, resolved on a worker thread, written as negotiated. The route's one body, for
    :func:`resolve_endpoint` and :class:`pm_vector.service.middleware.hot_route.ResolveRoute`."""
    body = await request.body()
    res = await run_in_threadpool(_resolve_sync, name, body_type(request), body, caller and caller.get("role"),
                                  settings, state)
    return respond(request, res)
