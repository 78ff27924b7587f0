"""Request-log retention: prune_request_log and the service's periodic prune."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest


def _log(name, age_days, n=1):
    from pm_vector import db

    when = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=age_days)
    return [db.log_request(name, {"format": "test"}, received_at=when) for _ in range(n)]


def _ids(conn):
    return {i for (i,) in conn.execute("SELECT id FROM pm_vector.request_log").fetchall()}


@pytest.fixture
def two_collections(pm_home):
    from pm_vector import db

    keep, gone = "ret_keep_" + uuid.uuid4().hex[:6], "ret_gone_" + uuid.uuid4().hex[:6]
    db.create_collection(keep, 4, range(2))
    db.create_collection(gone, 4, range(2))
    yield keep, gone
    db.drop_collection(keep, missing_ok=True)
    db.drop_collection(gone, missing_ok=True)


def test_prune_keeps_only_rows_within_retention(two_collections):
    from pm_vector import db
    from pm_vector.db.postgres import connect
    from pm_vector.db.store.retention import prune_request_log

    keep, gone = two_collections
    old, recent = _log(keep, 40, 3), _log(keep, 2, 2)
    orphan = _log(gone, 1, 2)
    db.drop_collection(gone)
    with connect() as conn:
        before = _ids(conn)
        assert prune_request_log(conn, older_than=None, drop_orphans=False) == 0
        n = prune_request_log(conn, older_than=dt.timedelta(days=30))
        after = _ids(conn)
        assert n >= 5 and before - after >= set(old) | set(orphan) and set(recent) <= after
        oldest = conn.execute("SELECT min(received_at) FROM pm_vector.request_log").fetchone()[0]
        assert oldest is None or oldest >= dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30, minutes=1)
        assert conn.execute("SELECT count(*) FROM pm_vector.request_log WHERE collection_id IS NULL").fetchone()[0] == 0
        assert prune_request_log(conn, older_than=dt.timedelta(days=30)) == 0  # idempotent
        with pytest.raises(ValueError, match="timedelta"):
            prune_request_log(conn, older_than=30)
        with pytest.raises(ValueError, match="negative"):
            prune_request_log(conn, older_than=dt.timedelta(days=-1))


def test_service_prunes_periodically(two_collections):
    from pm_vector.db.postgres import connect
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    keep, _ = two_collections
    old, recent = _log(keep, 3, 2), _log(keep, 0, 1)
    st = ServiceSettings(pool_max=2, request_log_retention_days=1, prune_interval_s=1)
    with ServiceThread(st):
        t0 = time.monotonic()
        with connect() as conn:
            while set(old) & _ids(conn) and time.monotonic() - t0 < 20:
                time.sleep(0.2)
            assert not set(old) & _ids(conn) and set(recent) <= _ids(conn)
            late = _log(keep, 5)  # written while the service runs: the next round removes it
            while set(late) & _ids(conn) and time.monotonic() - t0 < 20:
                time.sleep(0.2)
            assert not set(late) & _ids(conn)
    with pytest.raises(ValueError, match="request_log_retention_days"):
        ServiceSettings(request_log_retention_days=-1)
