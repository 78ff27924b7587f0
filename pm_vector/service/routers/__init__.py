"""The service's endpoints, one router per resource; :func:`pm_vector.service.app.create_app`
includes them in this order (the order of the OpenAPI document's paths):

==================  ==========================================================================
``health``          ``GET /health`` (no key)
``collections``     ``GET /collections``, ``GET /collections/{name}``,
                    ``GET /collections/{name}/sync`` (admin)
``anchor``          ``GET /collections/{name}/anchor``
``items``           ``POST /collections/{name}/items`` (admin)
``erase``           ``POST /collections/{name}/items/delete`` (admin)
``merges``          ``GET`` / ``PUT /collections/{name}/merge-rule`` (admin)
``jobs``            ``POST /collections/{name}/jobs``, ``GET /jobs``, ``GET /jobs/{job_id}`` (admin)
``keys``            ``GET /keys`` (admin without a collection scope)
``resolve``         ``POST /collections/{name}/resolve``
``kahm``            ``GET /collections/{name}/kahm/models``, ``POST /collections/{name}/kahm/distances``
==================  ==========================================================================

What they depend on (settings, state, the key's checks, media types) is in
:mod:`pm_vector.service.deps`; the API as a whole is described in :mod:`pm_vector.service.app`.
"""
