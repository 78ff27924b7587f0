"""Fixtures of the service tests, on the session's embedded PostgreSQL (``pm_home``,
tests/conftest.py, shared with tests/db): one embedded digits collection, an API key and the real
service on loopback (uvicorn thread)."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(scope="session")
def svc_split():
    from pm_vector.datasets import load_dataset, split_dataset

    return split_dataset(load_dataset("digits"), 800, 300, 150, 40, seed=0)


@pytest.fixture(scope="session")
def svc_collection(pm_home, svc_split):
    """An embedded digits collection that allows raw features (for re-ranking)."""
    from pm_vector import db
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.bench.demo import prepare_collection

    name = "svc_" + uuid.uuid4().hex[:8]
    prepare_collection(name, svc_split, allow_raw_features=True)
    db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
    yield name
    db.drop_collection(name, missing_ok=True)


@pytest.fixture(scope="session")
def svc_key(pm_home):
    from pm_vector.service.auth import create_key

    return create_key("tests")


@pytest.fixture(scope="session")
def svc_admin_key(pm_home):
    from pm_vector.service.auth import create_key

    return create_key("tests admin", role="admin")


@pytest.fixture(scope="session")
def service(pm_home):
    """The real service (uvicorn in a thread on 127.0.0.1, free port); small limits for the tests; no
    sync worker (a test that needs one starts a service of its own: one process of a database syncs)."""
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    st = ServiceSettings(max_rows=2000, max_dim=64, max_body_bytes=2 * 1024 * 1024, pool_max=4, sync_interval_s=0)
    with ServiceThread(st) as svc:
        yield svc


@pytest.fixture(scope="session")
def seeded_service(pm_home):
    """The real service as ``service`` but with ``allow_seeded_requests`` on: for the tests whose
    requests are seeded (repeatable noise; refused by a service's default settings)."""
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    st = ServiceSettings(max_rows=2000, max_dim=64, max_body_bytes=2 * 1024 * 1024, pool_max=4,
                         allow_seeded_requests=True, sync_interval_s=0)
    with ServiceThread(st) as svc:
        yield svc


@pytest.fixture(autouse=True)
def _own_default_ledger(tmp_path, monkeypatch):
    """Each test's default client ledger in its own directory: one budget covers a whole server,
    so tests sharing the session's ledger would spend each other's (PM_VECTOR_HOME also locates
    the session's database: only the ledger moves)."""
    import pm_vector.client.budget as budget_mod

    monkeypatch.setattr(budget_mod, "default_path", lambda: tmp_path / "client" / "budget.json")


@pytest.fixture
def requests_logged(pm_home):
    """``requests_logged(name)``: how many requests the server has logged for a collection."""
    from pm_vector import db

    return lambda name: len(db.list_requests(name, limit=1_000_000))
