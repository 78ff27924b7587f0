"""Retention of the request log: delete rows older than a retention period and rows of dropped
collections.

Every resolved request is logged (tens of kB a row); without pruning the table grows by tens of
GB an hour under load and keeps the requests of collections that no longer exist. The service
prunes periodically (``request_log_retention_days``, default 30); ``pm-vector db prune-requests``
calls :func:`prune_request_log` on demand.
"""

from __future__ import annotations

import datetime as dt

from psycopg import sql

from ...errors import InvalidInputError

__all__ = ["prune_request_log", "DEFAULT_RETENTION"]

#: the service's default retention
DEFAULT_RETENTION = dt.timedelta(days=30)

#: rows deleted per statement: short transactions, no long lock on a busy log
_BATCH = 10_000


def prune_request_log(conn, *, older_than: dt.timedelta | None = None, drop_orphans: bool = True) -> int:
    """Delete request-log rows received more than ``older_than`` ago (None: no age limit) and,
    with ``drop_orphans``, rows whose collection was dropped; returns how many were deleted.

    Deletes in batches, committing after each (``conn`` must not be in a transaction the caller
    wants to keep)."""
    if older_than is not None:
        if not isinstance(older_than, dt.timedelta):
            raise InvalidInputError("older_than must be a datetime.timedelta (e.g. timedelta(days=30)) or None.")
        if older_than < dt.timedelta(0):
            raise InvalidInputError(f"older_than must not be negative, got {older_than}.")
    if older_than is None and not drop_orphans:
        return 0
    conds = []
    args: list = []
    if older_than is not None:
        conds.append("received_at < now() - %s")
        args.append(older_than)
    if drop_orphans:
        # the log's foreign key sets collection_id NULL when a collection is dropped
        conds.append("collection_id IS NULL")
    where = sql.SQL(" OR ").join(map(sql.SQL, conds))
    total = 0
    while True:
        n = conn.execute(sql.SQL("DELETE FROM pm_vector.request_log WHERE id IN (SELECT id FROM pm_vector.request_log "
                                 "WHERE {} LIMIT {})").format(where, sql.Literal(int(_BATCH))), args).rowcount
        if not conn.autocommit:
            conn.commit()
        total += max(0, n)
        if n < _BATCH:
            return total
