"""Settings of the HTTP service: limits, pool sizes, where to listen. From arguments or the environment.

Environment variables (all optional): ``PM_VECTOR_SERVICE_MAX_ROWS`` (rows of one request's
embedding: query rows + anchor rows, default 5,000), ``PM_VECTOR_SERVICE_MAX_DIM`` (columns of
one request's embedding, default 256), ``PM_VECTOR_SERVICE_MAX_BODY_BYTES`` (default 16 MiB),
``PM_VECTOR_SERVICE_MAX_K`` (default 100), ``PM_VECTOR_SERVICE_POOL_MIN`` / ``_POOL_MAX``
(database connections, default 1 / 10), ``PM_VECTOR_SERVICE_AUTH`` (``1`` = API keys
required, the default; ``0`` only for a local demo), ``PM_VECTOR_SERVICE_HOST`` /
``PM_VECTOR_SERVICE_PORT`` (default 127.0.0.1 / 8000), ``PM_VECTOR_SERVICE_RATE_PER_MINUTE``
(requests per key per minute, default 60,000; 0 = no limit; a key may carry its own),
``PM_VECTOR_SERVICE_AUTH_FAILURES_PER_MINUTE`` (failed authentications per client address per
minute before 429, default 30; 0 = no limit; shared by the service processes of one database
through the key cache's NOTIFY channel, each counting alone while its listener is down), ``PM_VECTOR_SERVICE_FAILED_KEY_TTL_S`` (seconds a
refused key is refused from memory, default 5; 0 = off),
``PM_VECTOR_SERVICE_MAX_RESULT_CELLS`` (rows x k of one answer, default 50,000),
``PM_VECTOR_SERVICE_JOB_MIN_COMPONENTS`` (smallest n_components a job may ask for, default 4),
``PM_VECTOR_SERVICE_MAX_QUEUED_JOBS`` (queued + running, default 8),
``PM_VECTOR_SERVICE_REQUEST_LOG_RETENTION_DAYS`` (default 30; 0 = keep forever) and
``PM_VECTOR_SERVICE_PRUNE_INTERVAL_S`` (how often the service prunes the log, default 3,600),
``PM_VECTOR_SERVICE_SYNC_INTERVAL_S`` (seconds between the worker's passes over attached tables'
change queues, default 1; 0 = off; one process of a database syncs, on a thread of its own:
:mod:`pm_vector.service.sync_worker`), ``PM_VECTOR_SERVICE_REQUEST_NICE`` (how many nice levels
below the sync process the service's other threads run, 0..19, default 10; Linux),
``PM_VECTOR_SERVICE_SYNC_NICE`` (how many nice levels below the service the sync process and its
session's backend run, 0..19, default 10; Linux),
``PM_VECTOR_SERVICE_QUERY_DB_ROLE`` (the PostgreSQL role a query key's resolve runs as, default
``pm_vector_query``; empty: none), ``PM_VECTOR_SERVICE_ALLOW_SEEDED_REQUESTS`` (answer requests
marked ``seeded``, whose noise a seed determines: for tests only; default ``0``, refused with a
403), ``PM_VECTOR_SERVICE_QUERY_DB_URL`` (a URL logging in as a member of the query role: query
keys' resolves then use a pool of their own, whose sessions cannot leave that role; default
empty: the login role of migration 0017, else ``SET ROLE`` on the shared pool), ``PM_VECTOR_SERVICE_BODY_TIMEOUT_S`` (seconds a request's
whole body may take to arrive, default 10; then 408), ``PM_VECTOR_SERVICE_HEADER_TIMEOUT_S`` (seconds a
request's header lines may take, from the connection's opening or the request's first byte,
default 10; then 408 and the connection is closed), ``PM_VECTOR_SERVICE_MAX_LARGE_REQUESTS`` /
``PM_VECTOR_SERVICE_LARGE_REQUEST_BYTES`` (at most 2 requests with a body over 1 MiB run at once;
the others wait). Booleans are ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``; anything
else is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

from ..db.postgres import priority
from ..errors import InvalidInputError
from ..protocol.bounds import MAX_K_PRIME

_PREFIX = "PM_VECTOR_SERVICE_"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class ServiceSettings:
    max_rows: int = 5000
    max_dim: int = 256
    max_body_bytes: int = 16 * 1024 * 1024
    max_k: int = 100
    #: k' candidates per class row a pm_vector request may ask for (at most the protocol's MAX_K_PRIME)
    max_shortlist: int = MAX_K_PRIME
    max_ids: int = 10000
    pool_min: int = 1
    pool_max: int = 10
    auth: bool = True
    host: str = "127.0.0.1"
    port: int = 8000
    job_workers: int = 1
    #: per key, unless the key carries its own; 0 = no limit
    rate_per_minute: int = 60000
    #: failed authentications per client address per minute; beyond it 429 before any key
    #: lookup (0 = no limit); the service processes of one database share the count (keycache.py)
    auth_failures_per_minute: int = 30
    #: seconds a key the database refused is refused from memory (0 = always looked up)
    failed_key_ttl_s: int = 5
    #: rows x k (or x k') of one answer: bounds the response size
    max_result_cells: int = 50000
    #: smallest n_components of a job: one key must not degrade every client's precision
    job_min_components: int = 4
    max_queued_jobs: int = 8
    #: request-log rows older than this are pruned (with those of dropped collections); 0 = keep
    request_log_retention_days: int = 30
    prune_interval_s: int = 3600
    #: seconds between the worker's passes over attached tables' change queues (pm_vector.db.sync
    #: of every collection with queued changes; a pass over empty queues is one query); 0 = off
    #: (then run `pm-vector sync` yourself)
    sync_interval_s: int = 1
    #: how much lower the CPU priority of the service's other threads (the event loop, the
    #: request pool) is than the sync process's (a Linux nice value, per thread, at most 19; 0 = the same), so
    #: that queries do not starve the sync (docs/benchmarks.md, the sync under query load: lag_s
    #: p50 / p99 4.1-4.7 / 8.4-9.4 s with 10, 14.4-21.3 / 25.1-38.3 s with 0, on a busy machine)
    request_nice: int = 10
    #: how much lower the CPU priority of the sync process and its session's backend (where the
    #: server runs on this machine) is than the service's (a Linux nice value; 0 = the same): the
    #: database's own writers take a core first, and the sync, which batches what it finds, catches
    #: up between their commits (docs/operations.md, "Background cores": on 2 cores, a single-row
    #: writer's rate beside the sync)
    sync_nice: int = 10
    #: the CPUs the sync process, the merges it starts and their sessions' backends (where the server
    #: runs on this machine) are confined to, so that the others stay free for writers and queries:
    #: "off" anywhere (the default), "auto" the upper half of the service's CPUs (none on one CPU), or
    #: a list like "2,3". On 2 cores "auto" kept the delay p99 at 3.78 s at 355 changes a second
    #: (the sync on one core); the default keeps the merges alone on one (merge_cpus)
    #: (pm_vector.db.postgres.priority; docs/operations.md, "Background cores")
    background_cpus: str = "off"
    #: the CPUs the merges alone run on (with their sessions' backends; when set, over background_cpus),
    #: the sync left where background_cpus puts it: the sync is the path a change's answer waits on, a
    #: merge bulk work that can wait -- "auto" (the default: the upper half, none on one CPU), "off" or
    #: a list. On 2 cores at plain pgvector's saturated rate: 81% of its rate, delay p99 4.20 s (docs/
    #: operations.md, "Background cores")
    merge_cpus: str = "auto"
    #: PostgreSQL role a query key's resolve runs as (migration 0006: read + request-log insert
    #: only); "" or a role the service user cannot take: no switch
    query_db_role: str = "pm_vector_query"
    #: a PostgreSQL URL that logs in as a role with the query role's privileges (e.g. a member of
    #: pm_vector_query); query keys' resolves use a pool of their own on it, whose sessions
    #: cannot leave that role; "" = the login role migration 0017 made for this database (when it
    #: could not: SET ROLE on the shared pool, which SQL can reset; warned at start-up)
    query_db_url: str = ""
    #: streaming replicas that answer resolves (comma-separated URLs; with a local cluster running
    #: and none given, its replicas); writes and the request log go to the primary
    read_urls: str = ""
    #: a replica whose replay lag exceeds this many WAL bytes is out of rotation until it catches up
    max_replica_lag_bytes: int = 16 * 1024 * 1024
    #: answer requests marked "seeded" (noise from a seed: not a private release); tests only
    allow_seeded_requests: bool = False
    #: seconds a request's whole body may take to arrive once the service reads it (then 408)
    body_timeout_s: int = 10
    #: seconds a request's header block may take to arrive (then 408 and the connection closes)
    header_timeout_s: int = 10
    #: at most this many requests with a body over large_request_bytes run at once (the others
    #: wait): each holds a parsed copy of its body, so this bounds the service's peak memory
    max_large_requests: int = 2
    large_request_bytes: int = 1024 * 1024

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in ("int", int) and (isinstance(v, bool) or not isinstance(v, int)):
                raise InvalidInputError(f"service setting {f.name} must be an integer, got {v!r}.")
            if f.type in ("bool", bool) and not isinstance(v, bool):
                raise InvalidInputError(f"service setting {f.name} must be true or false, got {v!r}.")
        for name in ("max_rows", "max_dim", "max_body_bytes", "max_k", "max_shortlist", "max_ids", "pool_max",
                     "job_workers", "max_result_cells", "job_min_components", "max_queued_jobs", "prune_interval_s",
                     "body_timeout_s", "header_timeout_s", "max_large_requests", "large_request_bytes"):
            if getattr(self, name) < 1:
                raise InvalidInputError(f"service setting {name} must be >= 1, got {getattr(self, name)}.")
        for name in ("rate_per_minute", "request_log_retention_days", "sync_interval_s", "max_replica_lag_bytes",
                     "auth_failures_per_minute", "failed_key_ttl_s"):
            if getattr(self, name) < 0:
                raise InvalidInputError(f"service setting {name} must be >= 0 (0: off), got {getattr(self, name)}.")
        for name in ("request_nice", "sync_nice"):
            if not 0 <= getattr(self, name) <= 19:
                raise InvalidInputError(f"service setting {name} must be in 0..19, got {getattr(self, name)}.")
        priority.background_cpus(self.background_cpus)  # (InvalidInputError: what it may be)
        priority.background_cpus(self.merge_cpus, "merge_cpus")
        if self.max_shortlist > MAX_K_PRIME:
            raise InvalidInputError(f"service setting max_shortlist must be at most {MAX_K_PRIME} (the protocol's "
                                    f"MAX_K_PRIME), got {self.max_shortlist}.")
        if not 0 <= self.pool_min <= self.pool_max:
            raise InvalidInputError(f"pool_min must be in 0..pool_max ({self.pool_max}), got {self.pool_min}.")
        if not 0 <= self.port <= 65535:
            raise InvalidInputError(f"port must be in 0..65535, got {self.port}.")

    @classmethod
    def from_env(cls, **overrides: Any) -> "ServiceSettings":
        """Defaults, then ``PM_VECTOR_SERVICE_*`` variables, then ``overrides`` (None values ignored)."""
        vals: dict[str, Any] = {}
        for f in fields(cls):
            raw = os.environ.get(_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            if f.type in ("bool", bool):
                word = raw.strip().lower()
                if word not in _TRUE + _FALSE:
                    raise InvalidInputError(f"{_PREFIX + f.name.upper()} must be one of {', '.join(_TRUE)} or "
                                            f"{', '.join(_FALSE)}; got {raw!r}.")
                vals[f.name] = word in _TRUE
            elif f.type in ("int", int):
                try:
                    vals[f.name] = int(raw)
                except ValueError:
                    raise InvalidInputError(f"{_PREFIX + f.name.upper()} must be an integer, got {raw!r}.") from None
            else:
                vals[f.name] = raw
        vals.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**vals)

    def with_(self, **kw: Any) -> "ServiceSettings":
        return replace(self, **kw)

    def public(self) -> dict[str, Any]:
        """The limits a client may see."""
        return {"max_rows": self.max_rows, "max_dim": self.max_dim, "max_body_bytes": self.max_body_bytes,
                "max_k": self.max_k, "max_shortlist": self.max_shortlist, "max_ids": self.max_ids, "auth": self.auth,
                "max_result_cells": self.max_result_cells, "rate_per_minute": self.rate_per_minute,
                "auth_failures_per_minute": self.auth_failures_per_minute,
                "job_min_components": self.job_min_components, "max_queued_jobs": self.max_queued_jobs,
                "request_log_retention_days": self.request_log_retention_days,
                "body_timeout_s": self.body_timeout_s, "header_timeout_s": self.header_timeout_s}
