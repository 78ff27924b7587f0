"""Fixtures of the service tests: a private embedded PostgreSQL (as in tests/db/conftest.py),
one embedded digits collection, an API key and the real service on loopback (uvicorn thread)."""

from __future__ import annotations

import os
import uuid

import pytest

ENV_KEYS = ("PM_VECTOR_HOME", "PM_VECTOR_DATABASE_URL", "PM_VECTOR_EMBEDDED_FAST")


@pytest.fixture(scope="session")
def svc_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("pmsvchome")
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    os.environ["PM_VECTOR_HOME"] = str(home)
    os.environ.pop("PM_VECTOR_DATABASE_URL", None)
    os.environ["PM_VECTOR_EMBEDDED_FAST"] = "1"
    from pm_vector.db import engine, server

    st = server.start()
    assert st["running"] and st["schema_up_to_date"], st
    yield home
    engine.dispose_engines()
    os.environ["PM_VECTOR_HOME"] = str(home)
    os.environ.pop("PM_VECTOR_DATABASE_URL", None)
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def svc_split():
    from pm_vector.datasets import load_dataset, split_dataset

    return split_dataset(load_dataset("digits"), 800, 300, 150, 40, seed=0)


@pytest.fixture(scope="session")
def svc_collection(svc_home, svc_split):
    """An embedded digits collection that allows raw features (for re-ranking)."""
    from pm_vector import db
    from pm_vector.db.jobs import anchor_frame_embed_fn
    from pm_vector.service.demo import prepare_collection

    name = "svc_" + uuid.uuid4().hex[:8]
    prepare_collection(name, svc_split, allow_raw_features=True)
    db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
    yield name
    db.drop_collection(name, missing_ok=True)


@pytest.fixture(scope="session")
def svc_key(svc_home):
    from pm_vector.service.auth import create_key

    return create_key("tests")


@pytest.fixture(scope="session")
def service(svc_home):
    """The real service (uvicorn in a thread on 127.0.0.1, free port); small limits for the tests."""
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    st = ServiceSettings(max_rows=2000, max_dim=64, max_body_bytes=2 * 1024 * 1024, pool_max=4)
    with ServiceThread(st) as svc:
        yield svc


@pytest.fixture
def requests_logged(svc_home):
    """``requests_logged(name)``: how many requests the server has logged for a collection."""
    from pm_vector import db

    return lambda name: len(db.list_requests(name, limit=1_000_000))
