"""What the service's requests share while it runs: :class:`ServiceState`.

One instance per application (``app.state.service_state``), made by
:func:`pm_vector.service.app.create_app` and filled in by the lifespan
(:mod:`pm_vector.service.lifespan`); the routers receive it as
:data:`pm_vector.service.deps.StateDep`, its pool as :data:`~pm_vector.service.deps.PoolDep`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .db import ServicePool

if TYPE_CHECKING:
    from ..db.postgres.replicas import ReadRouter
    from .jobs import JobManager
    from .keycache import KeyCache
    from .sync_worker import SyncWorker


@dataclass
class ServiceState:
    """The service's shared state (module doc).

    ``resolve_slots`` bounds the resolves (and KAHM distances) that run at once (``pool_max``);
    ``pool`` is the shared connection pool (made at start-up unless given); ``query_role`` the
    database role a query key's resolve runs as under ``SET ROLE`` on it (None: not usable), and
    ``query_pool`` / ``query_login`` the pool that logs in as a member of that role and its
    (user, password) (None: no such login); ``router`` picks the read replica of a resolve (None:
    no replicas), whose pools are made on first use (:meth:`read_pool`); ``keycache`` keeps the
    keys verified lately (None: auth off or no URL); ``syncer`` the attached tables' sync worker
(None: off); ``key_lookups`` counts the keys looked up in
    the database (the authentication middleware, on the event loop)."""

    resolve_slots: threading.BoundedSemaphore
    pool: ServicePool | None = None
    jobs: JobManager | None = None
    query_role: str | None = None
    query_pool: ServicePool | None = None
    query_login: tuple[str, str | None] | None = None
    router: ReadRouter | None = None
    keycache: KeyCache | None = None
    syncer: SyncWorker | None = None
    read_pools: dict[str, ServicePool] = field(default_factory=dict)
    read_pools_lock: threading.Lock = field(default_factory=threading.Lock)
    key_lookups: int = 0

    @classmethod
    def new(cls, pool_max: int, pool: ServicePool | None = None) -> ServiceState:
        """The state of a service whose resolves run at most ``pool_max`` at once."""
        return cls(resolve_slots=threading.BoundedSemaphore(max(1, pool_max)), pool=pool)

    def read_pool(self, url: str, max_size: int) -> ServicePool:
        """The pool of the replica at ``url`` (one per replica and login), made on its first read."""
        with self.read_pools_lock:
            pool = self.read_pools.get(url)
            if pool is None:
                pool = self.read_pools[url] = ServicePool(url, min_size=0, max_size=max_size)
            return pool

    def database_problem(self) -> str | None:
        """Why the database does not answer (None: it does), from the pool's ping."""
        return self.pool.ping() if self.pool is not None else "no connection pool"
