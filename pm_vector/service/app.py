"""The FastAPI application of ``pm-vector serve``.

Endpoints (all but ``/health``, ``/openapi.json`` and ``/docs`` need an API key, sent as
``Authorization: Bearer pmv_...`` or ``X-API-Key: pmv_...``; the key is checked, and its rate
limit applied, from the headers before any body is read). Role ``query`` (the default of
``pm-vector keys create``) may use the collection reads, the anchor, resolve and the KAHM
endpoints; items, jobs, keys and the sync status need ``admin`` (403). A key limited to some
collections sees only those (404 for any other, and ``/collections`` lists only them):

=======  =====================================  =====================================================
GET      /health                                status, version, the server's limits, database reachable?
GET      /collections                           the collections (name, dims, labels, sizes, active run)
GET      /collections/{name}                    one collection, with its active run
GET      /collections/{name}/sync               an attached table's sync (admin): changes queued,
                                                how long the oldest has waited
GET      /collections/{name}/anchor             the public anchor: ids, features, labels, dummy pool,
                                                frame info (AnchorFrame params, seed, anchor embedding)
POST     /collections/{name}/items              items by id; raw features only if the collection allows
POST     /collections/{name}/jobs               start an SMLQ embedding job (background thread) -> 202
GET      /jobs, /jobs/{job_id}                  jobs (kept in the database): status, stage progress, result
GET      /keys                                  API keys (admin without a collection scope; no secrets)
POST     /collections/{name}/resolve            a request in, per-row candidates out: by default the
                                                compact answer (ids, product-code prefixes, payloads);
                                                full rows on request (raw features where allowed; the
                                                current KAHM model's class scores per item if private,
                                                or raw and the collection opted in)
GET      /collections/{name}/kahm/models        the collection's stored KAHM models (no model bytes)
POST     /collections/{name}/kahm/distances     this collection as a party of federated classification:
                                                per class, the distance value of every query row
=======  =====================================  =====================================================

Bodies are ``application/json`` or ``application/msgpack``; the collection, anchor, items, resolve
and KAHM answers are written as ``Accept`` asks, JSON by default (:mod:`pm_vector.service.media`).
Refusals are JSON ``{"error", "message"}`` with a 4xx status and write nothing: 401 (no or
unknown key), 413 (body, rows, dimensions or rows x k over the limits), 400 (malformed JSON or
msgpack, NaN/Infinity, too deep), 422 (wrong shapes or values, unknown fields), 415 (a body whose
Content-Type is neither application/json nor application/msgpack), 406 (an Accept that admits
neither), 404 (unknown collection,
job, or out of the key's scope), 403 (the key's role; raw features or raw KAHM distances not
allowed), 429 (rate limit, too many failed authentications from one address, or job queue full, with
Retry-After), 409 (no active run yet, no
KAHM model for the kahm endpoints, or the sync status of a collection that is not attached). While
the database is unreachable every endpoint that needs it answers 503 ``database_unavailable`` with
``Retry-After`` (and ``/health`` 503 ``degraded``); the pool reconnects by itself. A 5xx is a
bug: every bad input has its 4xx.

This module makes the application (:func:`create_app`): its state
(:class:`~pm_vector.service.state.ServiceState`), start-up and shut-down
(:mod:`pm_vector.service.lifespan`), the middleware in its order
(:mod:`pm_vector.service.middleware`), the error handlers (:mod:`pm_vector.service.errors`), and
the OpenAPI document. The endpoints are one router per resource in
:mod:`pm_vector.service.routers`, and what they depend on (settings, state, pool, the caller's
key, media types) is in :mod:`pm_vector.service.deps`.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI

from .. import __version__ as _version
from . import schemas
from .errors import install_error_handlers
from .lifespan import lifespan
from .memory import configure_malloc
from .middleware import install as install_middleware
from .routers import anchor, collections, erase, health, items, jobs, kahm, keys, merges, resolve
from .settings import ServiceSettings
from .state import ServiceState
from .auth import FailedAuthLimiter
from .resolve_body import resolve_schemas, served

log = logging.getLogger("pm_vector.service")

#: the bodies the endpoints parse themselves, named in the OpenAPI document's schemas (and the
#: resolve body with its answers, built from the table of releases: resolve_body.resolve_schemas)
_SELF_PARSED_BODIES = (schemas.DistancesBody, schemas.ItemsBody, schemas.DeleteItemsBody, schemas.JobBody,
                       schemas.MergeRuleBody)


def create_app(settings: ServiceSettings | None = None, *, pool=None) -> FastAPI:
    """The application. ``pool``: a :class:`~pm_vector.service.db.ServicePool` (made at start-up if None)."""
    settings = settings or ServiceSettings.from_env()
    # failed authentications per address: this process's, and those the others announce (keycache.py)
    failures = FailedAuthLimiter(settings.auth_failures_per_minute)
    configure_malloc()  # large requests' arrays go back to the system when freed (service/memory.py)
    state = ServiceState.new(settings.pool_max, pool)  # at most pool_max resolves at once
    app = FastAPI(title="pm_vector", version=_version, lifespan=lifespan(settings, state, failures),
                  description="Differentially private nearest-neighbour search (PrivateMail) over PostgreSQL/pgvector. "
                              "Authenticate with `Authorization: Bearer <API key>` (`pm-vector keys create`).",
                  responses={401: {"model": schemas.ErrorBody}, 413: {"model": schemas.ErrorBody},
                             422: {"model": schemas.ErrorBody}, 429: {"model": schemas.ErrorBody}})
    app.state.settings = settings
    app.state.service_state = state
    install_middleware(app, settings, state, failures)
    install_error_handlers(app, log)
    # one router per resource (service/routers/), in the order of the OpenAPI document's paths
    for module in (health, collections, anchor, items, erase, merges, jobs, keys, resolve, kahm):
        app.include_router(module.router)
    _name_self_parsed_bodies(app)
    return app


def _name_self_parsed_bodies(app: FastAPI) -> None:
    """Make the bodies the endpoints parse themselves part of the OpenAPI document's schemas; the
    document is made again when the table of releases changes (a release registered at run time)."""
    original = app.openapi
    made_for: list = [None]

    def openapi():
        releases = served()
        if app.openapi_schema and made_for[0] == releases:
            return app.openapi_schema
        app.openapi_schema = None
        s = original()
        made_for[0] = releases
        comps = s.setdefault("components", {}).setdefault("schemas", {})
        comps.update(resolve_schemas())
        for m in _SELF_PARSED_BODIES:
            js = m.model_json_schema(ref_template="#/components/schemas/{model}")
            for k, v in js.pop("$defs", {}).items():
                comps.setdefault(k, v)
            comps.setdefault(m.__name__, js)
        app.openapi_schema = s
        return s

    app.openapi = openapi  # type: ignore[method-assign]
