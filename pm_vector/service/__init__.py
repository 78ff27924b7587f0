"""The HTTP service of pm_vector (``pm-vector serve``): FastAPI app, API keys with roles, scopes and
rate limits, limits, jobs kept in the database, request-log retention.

See :mod:`pm_vector.service.app` for the endpoints (one router per resource in
:mod:`pm_vector.service.routers`, their dependencies in :mod:`pm_vector.service.deps`),
:mod:`pm_vector.service.validation` and
:mod:`pm_vector.service.middleware` for what is refused before any work, :mod:`pm_vector.client.http` for the
client. The programs that drive a client against the service (``pm-vector demo``, ``bench load``) are in
:mod:`pm_vector.bench`, above both.
"""

from .settings import ServiceSettings
from .app import create_app
from .runner import ServiceThread

__all__ = ["ServiceSettings", "create_app", "ServiceThread"]


def __getattr__(name):  # lazy: importing the package must not import FastAPI
    if name == "create_app":
        return create_app
    if name == "ServiceThread":
        return ServiceThread
    raise AttributeError(name)
